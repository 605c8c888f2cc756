"""`AgentScope`: a set of agents named by the plugin that owns what decides it, for another plugin's listing.

The HTTP service owns tenants (its own table); the policy plugin owns approvals and the records plugin runs.
A tenant's approvals or runs are listed without either plugin reading the other's tables: the service
writes the set of its tenant's agents as one SQL `SELECT` of agent ids (`stead_server`'s rows, its SQL),
and the owning plugin's listing keeps only rows whose agent is in it (`... AND agent_id IN (<sql>)`), as a
page of its public API (`ApprovalSource.approvals_page`, `RunReader.runs_page`). The scope's SQL uses `?`
placeholders (the store translates them per dialect) and must run on every dialect its owner migrates for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AgentScope", "page_query"]


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


def page_query(
    *,
    conditions: Sequence[str] = (),
    equal: Mapping[str, Any] | None = None,
    time_column: str,
    cursor: tuple[float, str] | None = None,
    newest_first: bool = False,
    scope: AgentScope | None = None,
) -> tuple[str, list[Any]]:
    """`(" WHERE … ORDER BY …", params)` of one keyset page over rows with an `id`, ordered by
    `time_column` then `id` (oldest first, or `newest_first`): `conditions` as given, `column = ?` for each
    `equal` value that is not None, strictly past `cursor` = `(time, id)` of the last row a caller saw, and
    only rows of `scope`'s agents. The caller appends ` LIMIT ?`."""
    where = list(conditions)
    params: list[Any] = []
    for column, value in (equal or {}).items():
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    past, order = ("<", "DESC") if newest_first else (">", "ASC")
    if cursor is not None:
        where.append(f"({time_column} {past} ? OR ({time_column} = ? AND id {past} ?))")
        params += [cursor[0], cursor[0], cursor[1]]
    if scope is not None:
        clause, scope_params = scope.clause()
        where.append(clause)
        params += scope_params
    sql = (" WHERE " + " AND ".join(where)) if where else ""
    return f"{sql} ORDER BY {time_column} {order}, id {order}", params
