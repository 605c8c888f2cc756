"""The store contract (docs/architecture.md): the one place durable state lives.

A `Store` serves one process. All reads and writes happen inside `transaction()`, which is atomic; a nested
call from the same task joins the outer transaction; `after_commit` callbacks run only after the outermost
commit and never after a rollback. In-memory state in the layers above changes only in those callbacks, so
memory and storage never diverge.

Per agent there is an ordered key/value space and an append-only list of history records; both hold strings
(compact JSON written by the kernel). Relational rows (`agents`, and tables owned by higher layers) are
reached through the same transaction so that observability rows commit with the state change they describe.

A store that serves several worker processes (PostgreSQL) additionally checks, on every write, that this
process still holds the agent's lease (`fence`); the kernel never needs to know which kind it talks to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["AgentRow", "Store", "Tx"]


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One row of the `agents` table."""

    id: str
    name: str | None
    config: str
    created_at: float


class Tx(Protocol):
    """An open transaction. Every method is a store operation (counted by fault injection)."""

    @property
    def store(self) -> Store:
        """The store this transaction belongs to."""
        ...

    # --- per-agent ordered KV -------------------------------------------------------------------
    async def get(self, agent_id: str, key: str) -> str | None: ...
    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        """Entries whose key starts with `prefix`, sorted by key."""
        ...

    async def last_key(self, agent_id: str, prefix: str) -> str | None:
        """The greatest key starting with `prefix`, or None."""
        ...

    async def write(self, agent_id: str, key: str, value: str) -> None: ...
    async def write_if_absent(self, agent_id: str, key: str, value: str) -> bool:
        """Write only if the key is absent; return whether this call wrote. The store arbitrates races."""
        ...

    async def delete(self, agent_id: str, key: str) -> bool:
        """Delete a key; return whether it existed (so a delete can arbitrate a claim)."""
        ...

    async def delete_prefix(self, agent_id: str, prefix: str) -> int: ...

    # --- per-agent append-only history ----------------------------------------------------------
    async def append(self, agent_id: str, records: Sequence[str]) -> None: ...
    async def load(self, agent_id: str) -> list[str]: ...
    async def load_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` history records with a sequence number below `before` (None: from the end), as
        (seq, record), newest first: a reader that needs only the end of a long history (a run's result,
        `agent.run`) reads O(what it needs), not the whole transcript."""
        ...

    async def clear(self, agent_id: str) -> None:
        """Delete all history records (only inside a replacement transaction)."""
        ...

    # --- per-agent history archive (K1: what compactions replaced) ------------------------------
    async def archive_history(self, agent_id: str, compaction_id: str) -> int:
        """Move every history record of the agent, in order, to the end of its archive, tagged with
        `compaction_id`, leaving the history empty (inside the compaction's replacement transaction).
        Returns how many records moved."""
        ...

    async def load_archive(self, agent_id: str) -> list[tuple[str, str]]:
        """The archived records in the order they were archived, as (compaction id, record)."""
        ...

    # --- agents table ---------------------------------------------------------------------------
    async def insert_agent(self, row: AgentRow) -> bool: ...
    async def get_agent(self, agent_id: str) -> AgentRow | None: ...
    async def list_agents(self) -> list[tuple[AgentRow, bool]]:
        """Every agent with whether it owes work (a `pending` record exists)."""
        ...

    async def delete_agent(self, agent_id: str) -> bool:
        """Remove the agent row, its KV, its history and its history archive."""
        ...

    async def agents_owing_work(self) -> list[tuple[AgentRow, str]]:
        """Agents with a `pending` record, with that record. Reads no transcript."""
        ...

    # --- relational escape hatch for higher layers (observability, memory) ----------------------
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...
    async def write_sql(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A write statement whose row count the caller does not need. A store may queue it instead of
        waiting for the server (PostgreSQL pipelines it with the commit); a failure then surfaces at the
        transaction's next wait or its commit and fails the whole transaction."""
        ...

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    # --- transaction control --------------------------------------------------------------------
    def after_commit(self, fn: Callable[[], object]) -> None:
        """Run `fn` after the outermost commit; dropped on rollback (also of an enclosing savepoint)."""
        ...

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A nested atomic section: an exception inside rolls back only this section, then re-raises."""
        ...


class Store(Protocol):
    """A database holding every agent of one `AgentSystem`."""

    url: str
    ops: int
    dialect: str
    """`sqlite` or `postgresql`: which of a plugin's migrations this store runs."""
    modules: frozenset[str]
    """The schema modules (plugin tables) migrated when this store was opened: what its system's plugins
    own. A layer that writes into another layer's tables checks its module here first."""

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """Open a transaction, or join the one the current task already has open on this store."""
        ...

    def current(self) -> Tx | None:
        """The transaction the current task has open on this store, if any."""
        ...

    async def close(self) -> None:
        """Release the database (and the process lock). Idempotent."""
        ...
