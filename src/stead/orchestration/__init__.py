"""Orchestration (docs/orchestration.md): agents built from definitions, sub-agent delegation, runtime
changes and guardrails — a plugin (`OrchestrationPlugin`).

`stead.open(url, definitions="examples/team")` adds it; `await system.create(definition="orchestrator")`
builds an agent of a definition; `orchestrator_of(system)` is its `Orchestrator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from stead.extend import CHANGES_KEY, RuntimeChange
from stead.orchestration._changes import applicable, effective, propagate
from stead.orchestration._hooks import GUARD_KEY, OrchestrationHooks
from stead.orchestration._orchestrator import (
    DEFAULT_MAX_CONCURRENT_DELEGATIONS,
    DEFAULT_MAX_DELEGATION_DEPTH,
    RUN_CHANGES_KEY,
    DelegationError,
    Orchestrator,
)
from stead.orchestration._plugin import OrchestrationPlugin

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = [
    "CHANGES_KEY",
    "DEFAULT_MAX_CONCURRENT_DELEGATIONS",
    "DEFAULT_MAX_DELEGATION_DEPTH",
    "GUARD_KEY",
    "RUN_CHANGES_KEY",
    "DelegationError",
    "OrchestrationHooks",
    "OrchestrationPlugin",
    "Orchestrator",
    "RuntimeChange",
    "applicable",
    "effective",
    "orchestrator_of",
    "propagate",
]


def orchestrator_of(system: AgentSystem) -> Orchestrator:
    """The `Orchestrator` of a system opened with definitions (`ConfigurationError` otherwise)."""
    return cast(OrchestrationPlugin, system.plugin("orchestration")).orchestrator
