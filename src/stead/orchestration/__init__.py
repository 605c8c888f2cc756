"""Orchestration (DESIGN §7): agents built from definitions, sub-agent delegation, runtime changes and
guardrails. See docs/orchestration.md.

`stead.open(url, definitions="examples/team")` wires it in; `await system.create(definition="orchestrator")`
builds an agent of a definition.
"""

from stead.orchestration._changes import CHANGES_KEY, RuntimeChange, applicable, effective, propagate
from stead.orchestration._hooks import GUARD_KEY, OrchestrationHooks
from stead.orchestration._orchestrator import (
    DEFAULT_MAX_CONCURRENT_DELEGATIONS,
    DEFAULT_MAX_DELEGATION_DEPTH,
    RUN_CHANGES_KEY,
    DelegationError,
    Orchestrator,
)

__all__ = [
    "CHANGES_KEY",
    "DEFAULT_MAX_CONCURRENT_DELEGATIONS",
    "DEFAULT_MAX_DELEGATION_DEPTH",
    "GUARD_KEY",
    "RUN_CHANGES_KEY",
    "DelegationError",
    "OrchestrationHooks",
    "Orchestrator",
    "RuntimeChange",
    "applicable",
    "effective",
    "propagate",
]
