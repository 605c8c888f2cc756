"""The orchestration layer as a plugin: definitions → agents, sub-agent delegation, runtime changes and
guardrails (`stead.open(definitions=...)` adds one).

It contributes every definition's tools and scripted models, one delegation tool per definition, the flow
engines of flow definitions (providers `flow/<name>`, docs/flows.md) with their hooks, the opt-in built-in
tools of loop agents, the runtime-change and guardrail hooks, and a validator for the runtime changes
messages carry; it builds agents for `system.create(definition=...)` (it is the system's
`DefinitionSource`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from stead.definitions import Registry
from stead.extend import (
    CHANGES_KEY,
    AgentSystem,
    Hooks,
    IncomingMessage,
    InvalidInput,
    Plugin,
    Provider,
    RuntimeChange,
    Tool,
)
from stead.flows import FlowHooks
from stead.orchestration._hooks import OrchestrationHooks
from stead.orchestration._orchestrator import (
    DEFAULT_MAX_CONCURRENT_DELEGATIONS,
    DEFAULT_MAX_DELEGATION_DEPTH,
    Orchestrator,
)

__all__ = ["OrchestrationPlugin"]


class OrchestrationPlugin(Plugin):
    """Agents from a registry of definitions, delegating to each other durably."""

    name: ClassVar[str] = "orchestration"

    def __init__(
        self,
        registry: Registry,
        *,
        max_concurrent_delegations: int = DEFAULT_MAX_CONCURRENT_DELEGATIONS,
        max_delegation_depth: int = DEFAULT_MAX_DELEGATION_DEPTH,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.orchestrator = Orchestrator(
            registry,
            max_concurrent_delegations=max_concurrent_delegations,
            max_delegation_depth=max_delegation_depth,
            clock=clock,
        )
        self._hooks = OrchestrationHooks(self.orchestrator.clock)
        self._flow_hooks = FlowHooks(self.orchestrator.flows)

    def tools(self) -> list[Tool]:
        return self.orchestrator.tools()

    def providers(self) -> dict[str, Provider]:
        return self.orchestrator.providers()

    def hooks(self) -> list[Hooks]:
        return [self._hooks, self._flow_hooks, self.orchestrator.builtins.hooks]

    async def start(self, system: AgentSystem) -> None:
        self.orchestrator.bind(system)
        self._hooks.bind(system)

    def validate_message(self, message: IncomingMessage) -> None:
        """Runtime changes riding in the metadata must be well-formed and add only known tools and
        definitions (refused before anything is written)."""
        raw = (message.metadata or {}).get(CHANGES_KEY)
        if raw is None:
            return
        if not isinstance(raw, list):
            raise InvalidInput(f"metadata[{CHANGES_KEY!r}] must be a list of runtime changes")
        self.orchestrator.check_changes([RuntimeChange.decode(item) for item in raw])

    def config_for(self, name: str, *, data: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.orchestrator.config_for(name, data=data)
