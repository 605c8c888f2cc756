"""How the orchestrator serves the flow layer: the names and shapes of flow agents, and the environment the
built-in tools of loop agents need (`stead.flows._builtins.BuiltinEnv`): an agent's payload rules, the
tools its pipelines may call, and its instructions re-rendered with per-run state."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.meta

from stead.definitions import AgentDefinition, render_instructions
from stead.extend import AgentConfig, HookContext, Tool
from stead.flows import (
    BUILTIN_TOOLS,
    OPT_OUT_KEY,
    PER_RUN_VARIABLES,
    PIPELINE_TOOL,
    PROMPT_TOOL,
    Pattern,
    payload_rules_of,
)
from stead.orchestration._keys import X_DATA, X_DEFINITION, base_lists

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = ["DefinitionsEnv"]

_PARSER = jinja2.Environment()


TemplateContext = Callable[[AgentDefinition, Sequence[str], Sequence[str], Any], dict[str, Any]]


class DefinitionsEnv:
    """`BuiltinEnv` over a registry of definitions (what the built-in tools and their hooks ask)."""

    def __init__(
        self,
        registry: Mapping[str, AgentDefinition],
        system: Callable[[], AgentSystem],
        delegation_tools: Mapping[str, Tool],
        template_context: TemplateContext,
    ) -> None:
        self.registry = registry
        self._system = system
        self.delegation_tools = delegation_tools
        self._template_context = template_context
        self._run_vars: dict[str, bool] = {}

    @property
    def system(self) -> AgentSystem:
        return self._system()

    def _definition_of(self, agent_id: str) -> AgentDefinition | None:
        agent = self.system.loaded(agent_id)
        name = agent.config.extra.get(X_DEFINITION) if agent is not None else None
        return self.registry.get(name) if isinstance(name, str) else None

    def payload_rules(self, agent_id: str) -> tuple[list[Pattern] | None, list[Pattern] | None]:
        definition = self._definition_of(agent_id)
        return payload_rules_of(definition)

    def pipeline_tools(self, agent_id: str) -> dict[str, Tool]:
        """An agent's own tools that a pipeline may call: not sub-agents, not transactional tools, not the
        pipeline itself or the scratchpad and payload built-ins, not tools that opted out."""
        agent = self.system.loaded(agent_id)
        if agent is None:
            return {}
        own, _ = base_lists(agent.config)
        refused = {PIPELINE_TOOL, PROMPT_TOOL, *BUILTIN_TOOLS["scratchpad"], *BUILTIN_TOOLS["payload"]}
        out: dict[str, Tool] = {}
        for name in own:
            t = self.system.tools.get(name)
            if t is None or name in refused or name in self.delegation_tools or t.transactional:
                continue
            if t.metadata.get(OPT_OUT_KEY) is False:
                continue
            out[name] = t
        return out

    def uses_run_state(self, ctx: HookContext) -> bool:
        name = ctx.extra.get(X_DEFINITION)
        definition = self.registry.get(name) if isinstance(name, str) else None
        if definition is None or definition.type != "loop":
            return False
        found = self._run_vars.get(definition.name)
        if found is None:
            used = jinja2.meta.find_undeclared_variables(_PARSER.parse(definition.instructions))
            found = self._run_vars[definition.name] = bool(used & set(PER_RUN_VARIABLES))
        return found

    def render_instructions(self, ctx: HookContext, variables: dict[str, Any]) -> str | None:
        name = ctx.extra.get(X_DEFINITION)
        definition = self.registry.get(name) if isinstance(name, str) else None
        if definition is None:
            return None
        tools, subs = base_lists(AgentConfig("", "", tools=[], extra=ctx.extra))
        context = self._template_context(definition, tools, subs, ctx.extra.get(X_DATA))
        context.update(variables)
        return render_instructions(definition, context)
