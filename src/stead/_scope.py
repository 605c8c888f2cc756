"""`AgentScope`: a set of agents named by the plugin that owns what decides it, for another plugin's listing.

The HTTP service owns tenants (its own table); the policy plugin owns approvals and the records plugin runs.
A tenant's approvals or runs are listed without either plugin reading the other's tables: the service
writes the set of its tenant's agents as one SQL `SELECT` of agent ids (`stead_server`'s rows, its SQL),
and the owning plugin's listing keeps only rows whose agent is in it (`... AND agent_id IN (<sql>)`), as a
page of its public API (`ApprovalSource.approvals_page`, `RunReader.runs_page`). The scope's SQL uses `?`
placeholders (the store translates them per dialect) and must run on every dialect its owner migrates for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AgentScope"]


@dataclass(frozen=True, slots=True)
class AgentScope:
    """The agents whose ids `sql` selects (one column; `params` fill its `?` placeholders). Its owner
    promises the statement reads only the owner's tables and the kernel's `agents`, and selects only agents
    that exist."""

    sql: str
    params: tuple[Any, ...] = ()

    def clause(self, column: str = "agent_id") -> tuple[str, tuple[Any, ...]]:
        """`(column IN (<sql>), params)`: a condition a listing adds to its `WHERE`."""
        return f"{column} IN ({self.sql})", self.params
