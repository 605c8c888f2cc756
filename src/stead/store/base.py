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

What only some stores can do is declared here too, as typed optional capabilities (`Store.capabilities`):
`OwnerNotify` (wake the process that runs an agent, when it is another one) and `FleetLease` (the worker
fleet's ownership primitives). A store without one says `None`; the kernel never probes with `getattr`.

A store implementation is registered by URL scheme in the entry point group `stead.stores` (`StoreClass`:
the class, with its `dialect` and an `open` classmethod); `stead.testing.check_store` runs this contract
against one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from stead.store.faults import Faults

__all__ = [
    "NO_CAPABILITIES",
    "AgentRow",
    "Capabilities",
    "FleetLease",
    "OwnerNotify",
    "Store",
    "StoreClass",
    "Tx",
]


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
    async def get_many(self, keys: Sequence[tuple[str, str]]) -> list[str | None]:
        """`get` of each `(agent_id, key)`, in order (one round trip where the store can)."""
        ...

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

    async def write_if_absent_many(self, rows: Sequence[tuple[str, str, str]]) -> list[bool]:
        """`write_if_absent` of each `(agent_id, key, value)`, in order, as if one after another: True
        where this call wrote (a key given twice is written by its first row only). One round trip where
        the store can (PostgreSQL: one `INSERT … ON CONFLICT DO NOTHING RETURNING`)."""
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


class OwnerNotify(Protocol):
    """A store shared by several processes wakes the one that runs an agent (W3)."""

    async def notify_owner(self, tx: Tx, agent_id: str) -> None:
        """Inside `tx` (a transaction of this store): wake whoever runs `agent_id` once, and only if, `tx`
        commits. Nothing to do when this process runs it (its own after-commit wakes it)."""
        ...


class FleetLease(Protocol):
    """The ownership primitives of a worker fleet sharing one database (`stead.core.fleet`)."""

    @property
    def conninfo(self) -> str:
        """The database URL for the fleet's dedicated LISTEN connection (libpq form)."""
        ...

    async def register_worker(
        self, host: str | None = None, pid: int | None = None, capacity: int = 1000
    ) -> str:
        """Register this process as a live worker; its fresh id."""
        ...

    async def heartbeat(self, worker_id: str | None = None) -> str | None:
        """Refresh the worker's heartbeat; its state, or None when it was evicted."""
        ...

    async def sweep(self, ttl_s: float) -> list[str]:
        """Evict workers silent for `ttl_s` seconds and free their agents; the ids evicted."""
        ...

    async def claim(self, n: int) -> list[tuple[str, int]]:
        """Take up to `n` unowned agents that owe work; [(agent id, epoch)], held from now on."""
        ...

    async def release(self, agent_id: str) -> bool:
        """Give up the lease on an agent; False when it was not this worker's any more."""
        ...

    def hold(self, agent_id: str, epoch: int) -> None:
        """This process owns `agent_id` at `epoch`: every later transaction touching it is fenced."""
        ...

    def drop(self, agent_id: str) -> None:
        """Stop fencing `agent_id` (writes nothing)."""
        ...

    def pin(self, agent_id: str) -> None:
        """In an agent's loop task: its transactions commit only under the lease held now (W6)."""
        ...

    async def lease_sql(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One bookkeeping statement of the fleet outside every stead transaction (never fault-injected)."""
        ...

    async def owners(self) -> dict[str, tuple[str | None, int]]:
        """Every agent's (owner worker id or None, epoch), read in a transaction of its own."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store can do beyond the `Store`/`Tx` contract; `None`: it cannot. Fixed when the store is
    opened, so a caller reads an attribute, never probes."""

    owner_notify: OwnerNotify | None = None
    """Set by a store whose agents may run in another process: decisions and admissions wake their owner."""
    fleet: FleetLease | None = None
    """Set by a store that serves a worker fleet: a system on it runs agents by lease (`stead.core.fleet`)."""


NO_CAPABILITIES = Capabilities()
"""A store of one owning process (SQLite): every agent it holds runs here."""


class Store(Protocol):
    """A database holding every agent of one `AgentSystem`."""

    url: str
    ops: int
    dialect: str
    """The SQL dialect this store speaks (`sqlite`, `postgresql`, or what an outside store declares):
    which of a plugin's migrations it runs and which dialect-specific SQL a plugin sends it."""
    modules: frozenset[str]
    """The schema modules (plugin tables) migrated when this store was opened: what its system's plugins
    own. A layer that writes into another layer's tables checks its module here first."""

    @property
    def capabilities(self) -> Capabilities:
        """The optional capabilities of this store (`NO_CAPABILITIES`: none)."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """Open a transaction, or join the one the current task already has open on this store."""
        ...

    def current(self) -> Tx | None:
        """The transaction the current task has open on this store, if any."""
        ...

    async def close(self) -> None:
        """Release the database (and the process lock). Idempotent."""
        ...


class StoreClass(Protocol):
    """What a `stead.stores` entry point names (entry name: the URL scheme): a store class, or any object
    with these two members."""

    @property
    def dialect(self) -> str:
        """The dialect of the stores it opens (known before opening: it chooses the migrations)."""
        ...

    async def open(
        self,
        url: str,
        *,
        faults: Faults | None = None,
        migrations: Mapping[str, Sequence[str]] | None = None,
        readonly: bool = False,
    ) -> Store:
        """Open the store `url` names, applying the kernel's schema and each module's scripts in
        `migrations` (module → ordered SQL scripts of this dialect); `readonly=True`: for inspection
        (no migration, every write refused with `stead.errors.ReadOnly`). `faults`: fault injection
        (`stead.testing.Faults`), checked before every store operation."""
        ...
