"""Flows (docs/flows.md): deterministic agents of steps and paths (`type: flow`), the run payload and its
read/write restrictions, and the opt-in built-in tools of loop agents (scratchpad, pipelines, artifacts).

Flow definitions load with the other definitions (`stead.open(definitions=DIR)`); the orchestration plugin
registers each flow's engine as the provider `flow/<name>` and installs the hooks that make its decisions
durable in the kernel's own transactions; the names after "what the definitions and orchestration plugins
compose" in `__all__` are that surface (flows import no other plugin). What a user calls directly:

    stead.flows.compile_expression("payload.total < `100`")    # the expression language (JMESPath)
    await stead.flows.put_artifact(system.store, agent.id, big_text, name="log")   # an input artifact
"""

from stead.flows._artifacts import put_artifact
from stead.flows._builtins import BUILTIN_TOOLS, BUILTINS_KEY, PER_RUN_VARIABLES, Builtins
from stead.flows._engine import MAX_FLOW_STEPS, PROMPT_TOOL, FlowEngine
from stead.flows._expr import (
    MAX_EXPRESSION_CHARS,
    MAX_NESTING,
    Expression,
    ExpressionError,
    compile_expression,
    truthy,
)
from stead.flows._hooks import FlowHooks
from stead.flows._loader import check_schema, compile_flow
from stead.flows._paths import Pattern, filter_payload
from stead.flows._paths import allowed as payload_change_allowed
from stead.flows._paths import diff as payload_diff
from stead.flows._pipeline import OPT_OUT_KEY, PIPELINE_TOOL
from stead.flows._provider import FLOW_KEY, INPUT_METADATA, FlowProvider, FlowRuntime, prompt_tool
from stead.flows._schema import (
    MAX_FOR_EACH_ITEMS,
    MAX_WHILE_ITERATIONS,
    FlowDefinition,
    FlowPath,
    FlowStep,
    PayloadRules,
)
from stead.flows._scratchpad import empty as empty_scratchpad
from stead.flows._scratchpad import view as scratchpad_view
from stead.flows._support import flow_key, has_prompt, payload_rules_of

__all__ = [
    # what the definitions and orchestration plugins compose (docs/architecture.md)
    "BUILTINS_KEY",
    # what a user calls
    "BUILTIN_TOOLS",
    "FLOW_KEY",
    "INPUT_METADATA",
    "MAX_EXPRESSION_CHARS",
    "MAX_FLOW_STEPS",
    "MAX_FOR_EACH_ITEMS",
    "MAX_NESTING",
    "MAX_WHILE_ITERATIONS",
    "OPT_OUT_KEY",
    "PER_RUN_VARIABLES",
    "PIPELINE_TOOL",
    "PROMPT_TOOL",
    "Builtins",
    "Expression",
    "ExpressionError",
    "FlowDefinition",
    "FlowEngine",
    "FlowHooks",
    "FlowPath",
    "FlowProvider",
    "FlowRuntime",
    "FlowStep",
    "Pattern",
    "PayloadRules",
    "check_schema",
    "compile_expression",
    "compile_flow",
    "empty_scratchpad",
    "filter_payload",
    "flow_key",
    "has_prompt",
    "payload_change_allowed",
    "payload_diff",
    "payload_rules_of",
    "prompt_tool",
    "put_artifact",
    "scratchpad_view",
    "truthy",
]
