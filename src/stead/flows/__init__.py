"""Flows (docs/flows.md): deterministic agents of steps and paths (`type: flow`), the run payload and its
read/write restrictions, and the opt-in built-in tools of loop agents (scratchpad, pipelines, artifacts).

Flow definitions load with the other definitions (`stead.open(definitions=DIR)`); the orchestration plugin
registers each flow's engine as the provider `flow/<name>` and installs the hooks that make its decisions
durable in the kernel's own transactions. What a user calls directly:

    stead.flows.compile_expression("payload.total < `100`")    # the expression language (JMESPath)
    await stead.flows.put_artifact(system.store, agent.id, big_text, name="log")   # an input artifact
"""

from stead.flows._artifacts import put_artifact
from stead.flows._builtins import BUILTIN_TOOLS
from stead.flows._engine import MAX_FLOW_STEPS, PROMPT_TOOL
from stead.flows._expr import (
    MAX_EXPRESSION_CHARS,
    MAX_NESTING,
    Expression,
    ExpressionError,
    compile_expression,
    truthy,
)
from stead.flows._schema import MAX_FOR_EACH_ITEMS, MAX_WHILE_ITERATIONS, FlowPath, FlowStep, PayloadRules

__all__ = [
    "BUILTIN_TOOLS",
    "MAX_EXPRESSION_CHARS",
    "MAX_FLOW_STEPS",
    "MAX_FOR_EACH_ITEMS",
    "MAX_NESTING",
    "MAX_WHILE_ITERATIONS",
    "PROMPT_TOOL",
    "Expression",
    "ExpressionError",
    "FlowPath",
    "FlowStep",
    "PayloadRules",
    "compile_expression",
    "put_artifact",
    "truthy",
]
