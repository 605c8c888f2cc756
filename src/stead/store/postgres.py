"""The PostgreSQL store: one database shared by any number of processes (`postgresql://…` URLs).

It implements the same contract as the SQLite store (`stead.store.base`): atomic transactions that nested
calls join, after-commit callbacks run only after the outermost commit, savepoints, the ordered per-agent
KV (`key text COLLATE "C"`: code-point order), append-only history and the relational escape hatch, whose
SQLite `?` placeholders are translated to psycopg's `%s` (`_pg_sql.translate`).

Connections come from a `psycopg_pool.AsyncConnectionPool` (`?pool_min=2&pool_max=10&pool_timeout=5` in
the URL; every other query parameter goes to libpq). A transaction takes one connection in autocommit
mode and runs in **pipeline mode**. `BEGIN` is queued with the first write (reads before it run like
SQLite's, without a transaction, so a transaction that only reads costs no `COMMIT`); writes whose result
nobody needs (`write`, `append`, `clear`, `write_sql`, the fence, row locks) are queued without waiting;
only a read (its rows are the answer), `write_if_absent`/`delete` (their boolean arbitrates a race),
`execute` (its row count) and `COMMIT` wait for the server. `store.stats` counts the waits per operation;
a tool-loop conversation measures about 2.3 round trips per writing commit (its `COMMIT` plus the claims it
must answer) and 3.6 per commit counting the turns' read-only reloads. A deferred write's failure surfaces
at the next wait and fails the whole transaction (never silently).

Like SQLite's single writer lock, the transactions of one store run one at a time in this process (an
asyncio lock held from the first operation to the commit): the kernel's assumption that nothing in this
process changes between its reads and its writes holds unchanged. Other processes are serialized per
agent by row locks: a write locks the agent's row (`FOR NO KEY UPDATE`) at the first write of a
transaction, and a transaction touching an agent this process holds a lease on (`hold`, `claim`) first
runs `stead_fence(agent, epoch)`, which takes the same lock and raises SQLSTATE `SL001` — `LeaseLost` —
when another worker moved the epoch. Both are pipelined: no extra round trip. The transactions of an
agent's loop (and its tools) are tied to the lease the loop started under (`pin`): once this process no
longer holds that epoch they raise `LeaseLost` at once, even though the lease was dropped here (W6).

A store opened with `readonly=True` runs no migration, checks that the database is a stead store of a
version it can read, runs each transaction as one `REPEATABLE READ READ ONLY` snapshot and refuses every
write with `stead.errors.ReadOnly`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg_pool import AsyncConnectionPool

from stead.errors import Closed, InvalidInput, LeaseLost, ReadOnly, StoreCrashed, StoreError
from stead.store import _pg_lease as lease
from stead.store._pg_schema import SCHEMA_VERSION, check_versions, migrate
from stead.store._pg_sql import store_error, translate
from stead.store._tx import TxBase, TxStore
from stead.store.base import AgentRow, Capabilities, Tx
from stead.store.faults import Faults

__all__ = ["SCHEMA_VERSION", "PgStats", "PostgresStore", "parse_postgres_url"]

log = logging.getLogger("stead.store")

_HI = "\U0010ffff"
_SEQ_END = 2**62  # above every history seq: `load_before(before=None)` reads from the end
_OPTIONS = {"pool_min": int, "pool_max": int, "pool_timeout": float}
LEASE_LOCK_TIMEOUT = b"SET LOCAL lock_timeout = '2s'"
"""Sweeps, claims and releases never hang on a lock (a frozen transaction): they fail and retry later."""

Conn = psycopg.AsyncConnection[tuple[Any, ...]]


def parse_postgres_url(url: str) -> tuple[str, dict[str, float]]:
    """`postgresql://user@host:port/db?pool_min=2&pool_max=10&pool_timeout=5&sslmode=…` → (libpq conninfo
    URL without stead's options, stead's options)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidInput(f"not a PostgreSQL URL: {url!r}")
    options: dict[str, float] = {}
    rest: list[tuple[str, str]] = []
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if k in _OPTIONS:
            try:
                options[k] = _OPTIONS[k](v)
            except ValueError:
                raise InvalidInput(f"{k} must be a number in {url!r}, not {v!r}") from None
        else:
            rest.append((k, v))
    conninfo = urlunsplit(
        ("postgresql", parts.netloc, parts.path, urlencode(rest, quote_via=quote), parts.fragment)
    )
    return conninfo, options


def redact(url: str) -> str:
    """The URL without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(slots=True)
class PgStats:
    """Counters of one store: committed transactions and the waits on the server they cost."""

    commits: int = 0
    round_trips: int = 0
    transactions: int = 0
    rollbacks: int = 0
    waits: dict[str, int] = field(default_factory=dict)
    """Round trips by the operation that waited (`commit`, `get`, `execute`, …)."""
    writing_round_trips: int = 0
    """Round trips of committed writing transactions only (their reads included): per commit, what a
    durable state change costs."""

    def count(self, op: str) -> None:
        self.round_trips += 1
        self.waits[op] = self.waits.get(op, 0) + 1

    @property
    def round_trips_per_commit(self) -> float:
        """Every round trip (read-only transactions and lease operations included) per commit."""
        return self.round_trips / self.commits if self.commits else 0.0

    @property
    def round_trips_per_writing_commit(self) -> float:
        return self.writing_round_trips / self.commits if self.commits else 0.0


_pinned: ContextVar[tuple[PostgresStore, str, int] | None] = ContextVar("stead_pg_pinned", default=None)
"""The lease an agent's loop started under (`PostgresStore.pin`): its task, and the tasks it starts."""


class PostgresStore(TxStore["_PgTx"]):
    """A `Store` over one PostgreSQL database. Create with `await PostgresStore.open(url)`.

    Its capabilities: `OwnerNotify` (`notify_owner`) and `FleetLease` (the worker primitives below)."""

    dialect = "postgresql"

    def __init__(
        self, url: str, pool: AsyncConnectionPool[Conn], faults: Faults | None, *, readonly: bool
    ) -> None:
        self.url = url
        self.conninfo = parse_postgres_url(url)[0]
        """The libpq URL without stead's own options (for a dedicated LISTEN connection)."""
        self.where = redact(url)
        self.readonly = readonly
        self.capabilities = Capabilities(owner_notify=self, fleet=self)
        self.modules: frozenset[str] = frozenset()
        self.ops = 0
        self.stats = PgStats()
        self.worker_id: uuid.UUID | None = None
        self.migrations_applied = 0
        self._pool: AsyncConnectionPool[Conn] | None = pool
        self._faults = faults
        self._lock = asyncio.Lock()
        self._crashed = False
        self._held: dict[str, int] = {}

    @property
    def commits(self) -> int:
        return self.stats.commits

    # ---------------------------------------------------------------- opening / closing
    @classmethod
    async def open(
        cls,
        url: str,
        *,
        faults: Faults | None = None,
        migrations: Mapping[str, Sequence[str]] | None = None,
        readonly: bool = False,
    ) -> PostgresStore:
        """Connect (a pool), then migrate the kernel's schema and each module in `migrations` under the
        migration lock (`readonly=True`: check the versions instead, migrate nothing)."""
        conninfo, options = parse_postgres_url(url)
        where = redact(url)
        min_size = int(options.get("pool_min", 2))
        max_size = int(options.get("pool_max", max(10, min_size)))
        if min_size < 1 or max_size < min_size:
            raise InvalidInput(f"need 1 <= pool_min <= pool_max in {where}")
        timeout = float(options.get("pool_timeout", 5.0))
        server = where.split("?", 1)[0]
        try:  # one direct connection first: a wrong database, user or port is its one-line cause, at once
            connecting = psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            probe = await asyncio.wait_for(connecting, timeout)
        except TimeoutError:
            raise StoreError(f"cannot connect to {server}: no answer within {timeout:g} s") from None
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to {server}: {_connect_error(e)}") from None
        await probe.close()
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=float(options.get("pool_timeout", 5.0)),
            kwargs={"autocommit": True},
            check=AsyncConnectionPool.check_connection,
            open=False,
            name="stead",
        )
        try:
            await pool.open(wait=True, timeout=float(options.get("pool_timeout", 5.0)))
        except Exception as e:
            await pool.close()
            raise StoreError(f"cannot connect to {where}: {_first_line(e)}") from None
        store = cls(url, pool, faults, readonly=readonly)
        try:
            async with pool.connection() as conn:
                if readonly:
                    await check_versions(conn, where, migrations)
                else:
                    store.migrations_applied = await migrate(conn, where, migrations)
        except StoreError:
            await pool.close()
            raise
        except psycopg.Error as e:
            await pool.close()
            raise StoreError(f"{where}: {_first_line(e)}") from None
        except BaseException:
            await pool.close()
            raise
        store.modules = frozenset(migrations or {})
        return store

    async def close(self) -> None:
        async with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @property
    def closed(self) -> bool:
        return self._pool is None

    # ---------------------------------------------------------------- transactions (`stead.store._tx`)
    def _begin(self) -> _PgTx:
        if self._pool is None:
            if self._crashed:
                raise StoreCrashed("the store crashed (injected)")
            raise Closed("the store is closed")
        self.stats.transactions += 1
        return _PgTx(self)

    async def _commit(self, tx: _PgTx) -> None:
        if tx.conn is None:
            return  # nothing was asked
        if tx.wrote:
            self._op("commit")
        await tx.commit()
        if tx.wrote:
            self.stats.commits += 1
            self.stats.writing_round_trips += self.stats.round_trips - tx.trips_before

    async def _finish(self, tx: _PgTx, committed: bool) -> None:
        # shielded: a task cancelled while it ends its transaction (abort, kill, LeaseLost) still rolls
        # back and returns its connection to the pool. A rolled-back transaction's lost lease stays held
        # (so every later write of this process to that agent keeps failing the fence) until the runtime
        # drops it.
        await asyncio.shield(self._end(tx, committed))

    async def _end(self, tx: _PgTx, committed: bool) -> None:
        if not committed:
            await tx.rollback()
        await tx.finish()
        if self._crashed:
            await self._crash()

    async def notify_owner(self, tx: Tx, agent_id: str) -> None:
        """`OwnerNotify`: see `_PgTx.notify_owner`."""
        assert isinstance(tx, _PgTx) and tx.store is self, "a transaction of another store"
        await tx.notify_owner(agent_id)

    def _op(self, name: str) -> None:
        """Gate every operation: count it, inject faults, refuse a closed store."""
        self.ops += 1
        if self._faults is not None:
            try:
                self._faults.check(name)
            except StoreCrashed:
                self._crashed = True
                raise
        if self._pool is None or self._crashed:
            if self._crashed:
                raise StoreCrashed("the store crashed (injected)")
            raise Closed("the store is closed")

    async def _crash(self) -> None:
        """Simulate process death: the open transaction was rolled back; release every connection."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def _require_pool(self) -> AsyncConnectionPool[Conn]:
        if self._pool is None:
            if self._crashed:
                raise StoreCrashed("the store crashed (injected)")
            raise Closed("the store is closed")
        return self._pool

    # ---------------------------------------------------------------- ownership (worker fleets)
    def hold(self, agent_id: str, epoch: int) -> None:
        """This process owns `agent_id` at `epoch`: every later transaction touching it is fenced."""
        self._held[agent_id] = epoch

    def drop(self, agent_id: str) -> None:
        """Stop fencing `agent_id` (released, or its lease was lost): writes nothing."""
        self._held.pop(agent_id, None)

    forget = drop

    def held(self) -> dict[str, int]:
        """The agents this process holds leases on, with their epochs (what the fence checks)."""
        return dict(self._held)

    def pin(self, agent_id: str) -> None:
        """Called by an agent's loop as it starts, in its task: every later transaction of this task (and
        of the tasks it starts: its tools) touching `agent_id` must run under the lease held now. Once this
        process no longer holds that epoch (lost, released, or taken again at a new epoch), such a
        transaction raises `LeaseLost` before it sends anything. Dropping a lease therefore never turns
        a loop that outlived it (a cancellation asyncio lost, a tool that ignores it) into an unfenced
        writer (W6). Not held now: nothing is pinned."""
        epoch = self._held.get(agent_id)
        _pinned.set(None if epoch is None else (self, agent_id, epoch))

    async def owners(self) -> dict[str, tuple[str | None, int]]:
        async with self.transaction() as tx:
            return await tx.list_owners()

    async def lease_sql(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One short bookkeeping statement of the fleet (rescans, crash detection, ending frozen sessions) in
        its own transaction outside every stead transaction: not an agent's store operation, so it is never
        counted or fault-injected. Returns its rows."""
        return await self._one(sql.encode(), params)

    async def _one(
        self, sql: bytes, params: Sequence[Any], *then: tuple[bytes, Sequence[Any]]
    ) -> list[tuple[Any, ...]]:
        """One short transaction on a pool connection (outside any stead transaction), pipelined: waits
        on locks at most `LEASE_LOCK_TIMEOUT`; `then` statements run after it in the same transaction.
        Returns the first statement's rows."""
        if self.readonly:
            raise ReadOnly(f"{self.where} was opened with readonly=True: leases cannot be taken")
        pool = self._require_pool()
        try:
            async with pool.connection() as conn, conn.pipeline() as pipe:
                await conn.execute(b"BEGIN")
                await conn.execute(LEASE_LOCK_TIMEOUT)
                cur = await conn.execute(sql, params)
                for extra, extra_params in then:
                    await conn.execute(extra, extra_params)
                await conn.execute(b"COMMIT")
                await pipe.sync()
                self.stats.count("lease")
                return await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as e:
            raise store_error(e, "lease operation failed") from e
        except Exception as e:
            from psycopg_pool import PoolTimeout

            if isinstance(e, PoolTimeout):
                raise store_error(e, "lease operation failed") from e
            raise

    async def register_worker(
        self, host: str | None = None, pid: int | None = None, capacity: int = 1000
    ) -> str:
        """Register this process as a live worker; returns its fresh id (a uuid string)."""
        wid = uuid.uuid4()
        await self._one(lease.REGISTER, (wid, host or socket.gethostname(), pid or os.getpid(), capacity))
        self.worker_id = wid
        return str(wid)

    def _me(self) -> uuid.UUID:
        if self.worker_id is None:
            raise StoreError("this store has no registered worker: call register_worker() first")
        return self.worker_id

    async def heartbeat(self, worker_id: str | None = None) -> str | None:
        """Refresh the worker's heartbeat (database clock); its state (`live`, `draining`), or None when it
        was evicted (its agents are gone: stop everything and register again)."""
        wid = lease.as_uuid(worker_id) if worker_id is not None else self._me()
        rows = await self._one(lease.HEARTBEAT, (wid,))
        return str(rows[0][0]) if rows else None

    async def sweep(self, ttl_s: float) -> list[str]:
        """Evict workers whose heartbeat is older than `ttl_s` (database clock; never this store's own
        registered worker: a worker that sweeps is alive, however late its heartbeat) and release the
        agents of every evicted or vanished worker with epoch + 1 (skipping rows a transaction holds: the
        next sweep gets them), and forget evicted workers that own nothing and went silent over an hour
        ago. Returns the ids of the workers evicted by this call."""
        evicted = await self._one(
            lease.SWEEP_WORKERS,
            (float(ttl_s), self.worker_id),
            (lease.SWEEP_AGENTS, ()),
            (lease.FORGET_WORKERS, ()),
        )  # one transaction, one round trip
        return [str(r[0]) for r in evicted]

    async def claim(self, n: int) -> list[tuple[str, int]]:
        """Take up to `n` unowned agents that owe work (a `pending` record or a queued entry), moving each
        epoch; they are held (fenced) from now on. Returns [(agent_id, epoch)]."""
        if n <= 0:
            return []
        rows = await self._one(lease.CLAIM, (self._me(), int(n)))
        got = [(str(r[0]), int(r[1])) for r in rows]
        for agent_id, epoch in got:
            self._held[agent_id] = epoch
        return got

    async def release(self, agent_id: str) -> bool:
        """Give up the lease on an agent this worker holds (epoch + 1, so a late write of ours is fenced)
        and wake a free worker (`stead_claim`) in the same transaction; drops the hold either way. False
        when it was not ours any more (lost: nothing is written)."""
        epoch = self._held.pop(agent_id, None)
        if epoch is None:
            return False
        rows = await self._one(
            lease.RELEASE, (agent_id, self._me(), epoch), (lease.NOTIFY_CLAIM, (agent_id,))
        )
        return bool(rows)

    async def owned(self) -> dict[str, int]:
        """The agents the database says this worker owns, with their epochs."""
        rows = await self._one(lease.OWNED, (self._me(),))
        return {str(r[0]): int(r[1]) for r in rows}


class _PgTx(TxBase):
    """An open PostgreSQL transaction (see `stead.store.base.Tx`)."""

    __slots__ = (
        "_pipe",
        "_pipe_cm",
        "began",
        "broken",
        "conn",
        "fenced",
        "locked",
        "notified",
        "op",
        "trips_before",
        "wrote",
    )

    store: PostgresStore

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store)
        self.conn: Conn | None = None
        self._pipe: Any = None
        self._pipe_cm: Any = None
        self.fenced: set[str] = set()
        self.locked: set[str] = set()
        self.notified: set[str] = set()
        self.broken: StoreError | None = None
        self.wrote = False
        self.trips_before = store.stats.round_trips
        self.began = False
        self.op = "begin"

    # -- connection and pipeline
    async def _connect(self) -> Conn:
        """The first operation: take a connection and enter pipeline mode. A read-only store begins its
        snapshot here; a writer begins at its first write (`_w`): reads before it run like SQLite's,
        without a transaction, and a transaction that only reads costs no COMMIT."""
        pool = self.store._require_pool()
        try:
            conn = await pool.getconn()
        except Exception as e:
            raise store_error(e, "could not begin a transaction") from e
        self.conn = conn
        try:
            self._pipe_cm = conn.pipeline()
            self._pipe = await self._pipe_cm.__aenter__()
            if self.store.readonly:
                await conn.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                self.began = True
        except psycopg.Error as e:
            raise store_error(e, "could not begin a transaction") from e
        return conn

    def _require_conn(self) -> Conn:
        if self.conn is None:
            raise StoreError("this transaction has not begun")
        return self.conn

    def _gate(self, name: str) -> None:
        if not self.open:
            raise StoreError("this transaction has ended")
        if self.broken is not None:
            raise self.broken
        self.store._op(name)
        self.op = name

    async def _fence(self, conn: Conn, agent_id: str | None) -> None:
        """The first touch of an agent this process holds runs the fence (queued, no wait). A task pinned
        to a lease of the agent (its loop) is refused at once when this process no longer holds it."""
        if agent_id is None:
            return
        pinned = _pinned.get()
        if (
            pinned is not None
            and pinned[1] == agent_id
            and pinned[0] is self.store
            and self.store._held.get(agent_id) != pinned[2]
        ):
            raise LeaseLost(
                f"lease lost on agent {agent_id!r}: this loop runs under epoch {pinned[2]}, which this "
                "process no longer holds; it must stop running it",
                agent_id,
                retaken=self.store._held.get(agent_id) is not None,
            )
        if agent_id in self.fenced:
            return
        epoch = self.store._held.get(agent_id)
        if epoch is not None:
            self.fenced.add(agent_id)
            self.locked.add(agent_id)
            await self._send(conn, b"SELECT stead_fence(%s, %s)", (agent_id, epoch))

    async def _c(self, name: str, agent_id: str | None = None) -> Conn:
        """A read (fenced when it touches an agent this process holds)."""
        self._gate(name)
        conn = self.conn if self.conn is not None else await self._connect()
        await self._fence(conn, agent_id)
        return conn

    async def _w(self, name: str, agent_id: str | None = None) -> Conn:
        """A write: refused on a read-only store; the first one begins the transaction; the first one per
        agent locks its row (the fence, or a plain row lock for an agent another process may own)."""
        if self.store.readonly:
            raise ReadOnly(
                f"{self.store.where} was opened with readonly=True: it can be read, not written "
                "(open it without readonly=True to write)"
            )
        self._gate(name)
        conn = self.conn if self.conn is not None else await self._connect()
        if not self.began:
            await self._send(conn, b"BEGIN")
            self.began = True
            self.fenced.clear()  # checks made before BEGIN held no lock: fence again inside
            self.locked.clear()
        self.wrote = True
        await self._fence(conn, agent_id)
        if agent_id is not None and agent_id not in self.locked:
            self.locked.add(agent_id)
            await self._send(conn, b"SELECT 1 FROM agents WHERE id = %s FOR NO KEY UPDATE", (agent_id,))
        return conn

    async def _send(
        self, conn: Conn, sql: bytes, params: Sequence[Any] | None = None
    ) -> psycopg.AsyncCursor[Any]:
        """Queue a statement in the pipeline (no wait)."""
        try:
            return await conn.execute(sql, params)
        except psycopg.Error as e:
            raise store_error(e, "store operation failed") from e

    async def _rows(self, conn: Conn, sql: bytes, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run a statement and wait for its rows: one round trip (with everything queued before it)."""
        try:
            cur = await conn.execute(sql, params)
            self.store.stats.count(self.op)
            return await cur.fetchall()
        except psycopg.Error as e:
            raise store_error(e, "store operation failed") from e

    async def _sync_pipeline(self, op: str | None = None) -> None:
        if self._pipe is not None:
            self.store.stats.count(op or self.op)
            await self._pipe.sync()

    async def commit(self) -> None:
        if self.broken is not None:
            raise self.broken
        conn = self._require_conn()
        if not self.began:
            return  # only reads, each already answered: nothing to commit
        try:
            await conn.execute(b"COMMIT")
            await self._sync_pipeline("commit")
        except psycopg.Error as e:
            raise store_error(e, "commit failed") from e

    async def rollback(self) -> None:
        conn = self.conn
        if conn is None:
            return
        if not self.began:
            try:
                await self._sync_pipeline("rollback")  # a queued fence nobody waited for
            except psycopg.Error:
                pass
            return
        self.store.stats.rollbacks += 1
        try:
            try:
                await self._sync_pipeline()
            except psycopg.Error:
                pass
            await conn.execute(b"ROLLBACK")
            await self._sync_pipeline()
        except psycopg.Error:
            pass  # a broken connection: the server rolls back, the pool discards it

    async def finish(self) -> None:
        """Leave pipeline mode and give the connection back (the pool discards a broken one)."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        cm, self._pipe_cm, self._pipe = self._pipe_cm, None, None
        if cm is not None:
            try:
                await cm.__aexit__(None, None, None)
            except psycopg.Error:
                pass
        pool = self.store._pool
        if pool is not None:
            try:
                await pool.putconn(conn)
            except Exception:  # pragma: no cover
                await conn.close()
        else:
            await conn.close()

    # -- savepoints (`stead.store._tx.Savepoint`)
    async def _sp_begin(self, name: str) -> None:
        conn = await self._w("savepoint")
        await self._send(conn, b"SAVEPOINT " + name.encode())

    async def _sp_release(self, name: str) -> None:
        self.store._op("release")
        conn = self._require_conn()
        await self._send(conn, b"RELEASE " + name.encode())

    async def _sp_rollback(self, name: str) -> None:
        conn = self.conn
        if conn is None or self.store._crashed:
            return
        try:
            await self._sync_pipeline()  # clear an aborted pipeline before talking again
        except psycopg.Error:
            pass
        try:
            await conn.execute(b"ROLLBACK TO " + name.encode())
            await conn.execute(b"RELEASE " + name.encode())
            await self._sync_pipeline()
        except psycopg.Error as err:
            # the transaction is aborted beyond this section: it can only roll back now
            self.broken = store_error(err, "rolling back a savepoint failed")

    async def notify_owner(self, agent_id: str) -> None:
        """Wake whoever runs `agent_id` once this transaction commits: `pg_notify` on its owner's channel
        (`stead_w_<uuid hex>`), or on `stead_claim` when it is unowned. Once per agent per transaction."""
        if agent_id in self.notified or self.store.readonly or agent_id in self.store._held:
            return  # this process runs it: its own after-commit wakes it
        conn = await self._w("notify_owner", agent_id)
        self.notified.add(agent_id)
        await self._send(
            conn,
            b"SELECT pg_notify(CASE WHEN owner IS NULL THEN 'stead_claim' "
            b"ELSE 'stead_w_' || replace(owner::text, '-', '') END, id) FROM agents WHERE id = %s",
            (agent_id,),
        )

    async def owner_of(self, agent_id: str) -> tuple[str | None, int] | None:
        """(owner worker id or None, epoch) of an agent, or None when it does not exist."""
        conn = await self._c("owner_of", agent_id)
        rows = await self._rows(conn, b"SELECT owner, epoch FROM agents WHERE id = %s", (agent_id,))
        if not rows:
            return None
        owner = rows[0][0]
        return (None if owner is None else str(owner), int(rows[0][1]))

    # -- KV
    async def get(self, agent_id: str, key: str) -> str | None:
        conn = await self._c("get", agent_id)
        rows = await self._rows(
            conn, b"SELECT value FROM kv WHERE agent_id = %s AND key = %s", (agent_id, key)
        )
        return None if not rows else str(rows[0][0])

    async def get_many(self, keys: Sequence[tuple[str, str]]) -> list[str | None]:
        """One round trip for all of `keys` (each agent fenced as by `get`)."""
        if not keys:
            return []
        conn: Conn | None = None
        for agent_id in dict.fromkeys(a for a, _ in keys):
            conn = await self._c("get_many", agent_id)
        assert conn is not None
        rows = await self._rows(
            conn,
            b"SELECT k.agent_id, k.key, kv.value FROM unnest(%s::text[], %s::text[]) AS k(agent_id, key) "
            b"JOIN kv ON kv.agent_id = k.agent_id AND kv.key = k.key",
            ([a for a, _ in keys], [k for _, k in keys]),
        )
        found = {(str(r[0]), str(r[1])): str(r[2]) for r in rows}
        return [found.get((a, k)) for a, k in keys]

    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        conn = await self._c("read_prefix", agent_id)
        rows = await self._rows(
            conn,
            b"SELECT key, value FROM kv WHERE agent_id = %s AND key >= %s AND key < %s ORDER BY key",
            (agent_id, prefix, prefix + _HI),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    async def last_key(self, agent_id: str, prefix: str) -> str | None:
        conn = await self._c("last_key", agent_id)
        rows = await self._rows(
            conn,
            b"SELECT key FROM kv WHERE agent_id = %s AND key >= %s AND key < %s ORDER BY key DESC LIMIT 1",
            (agent_id, prefix, prefix + _HI),
        )
        return None if not rows else str(rows[0][0])

    async def write(self, agent_id: str, key: str, value: str) -> None:
        conn = await self._w("write", agent_id)
        await self._send(
            conn,
            b"INSERT INTO kv(agent_id, key, value) VALUES(%s, %s, %s) "
            b"ON CONFLICT (agent_id, key) DO UPDATE SET value = excluded.value",
            (agent_id, key, value),
        )

    async def write_if_absent(self, agent_id: str, key: str, value: str) -> bool:
        conn = await self._w("write_if_absent", agent_id)
        rows = await self._rows(
            conn,
            b"INSERT INTO kv(agent_id, key, value) VALUES(%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (agent_id, key, value),
        )
        return bool(rows)

    async def write_if_absent_many(self, rows: Sequence[tuple[str, str, str]]) -> list[bool]:
        """One `INSERT … ON CONFLICT DO NOTHING RETURNING` for all of `rows` (each agent fenced and
        row-locked as by `write_if_absent`, in the order of their ids); a key given twice is offered once,
        by its first row."""
        if not rows:
            return []
        conn: Conn | None = None
        # in one order (sorted ids): batches of two processes that share agents wait on each other, never
        # in a cycle (a deadlock PostgreSQL breaks only after `deadlock_timeout`, failing one of them)
        for agent_id in sorted({a for a, _, _ in rows}):
            conn = await self._w("write_if_absent_many", agent_id)
        assert conn is not None
        first: dict[tuple[str, str], int] = {}
        for i, (agent_id, key, _) in enumerate(rows):
            first.setdefault((agent_id, key), i)
        offered = [rows[i] for i in first.values()]
        written = await self._rows(
            conn,
            b"INSERT INTO kv(agent_id, key, value) "
            b"SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]) "
            b"ON CONFLICT DO NOTHING RETURNING agent_id, key",
            ([r[0] for r in offered], [r[1] for r in offered], [r[2] for r in offered]),
        )
        won = {(str(r[0]), str(r[1])) for r in written}
        return [first[(a, k)] == i and (a, k) in won for i, (a, k, _) in enumerate(rows)]

    async def delete(self, agent_id: str, key: str) -> bool:
        conn = await self._w("delete", agent_id)
        rows = await self._rows(
            conn, b"DELETE FROM kv WHERE agent_id = %s AND key = %s RETURNING 1", (agent_id, key)
        )
        return bool(rows)

    async def delete_prefix(self, agent_id: str, prefix: str) -> int:
        conn = await self._w("delete_prefix", agent_id)
        rows = await self._rows(
            conn,
            b"WITH d AS (DELETE FROM kv WHERE agent_id = %s AND key >= %s AND key < %s RETURNING 1) "
            b"SELECT count(*) FROM d",
            (agent_id, prefix, prefix + _HI),
        )
        return int(rows[0][0])

    # -- history
    async def append(self, agent_id: str, records: Sequence[str]) -> None:
        if not records:
            self.store._op("append")
            return
        conn = await self._w("append", agent_id)
        epoch = self.store._held.get(agent_id)
        await self._send(
            conn,
            b"INSERT INTO history(agent_id, seq, record, epoch) "
            b"SELECT %s, b.m + r.n, r.rec, COALESCE(%s, (SELECT epoch FROM agents WHERE id = %s), 0) "
            b"FROM (SELECT COALESCE(max(seq), 0) AS m FROM history WHERE agent_id = %s) b, "
            b"unnest(%s::text[]) WITH ORDINALITY AS r(rec, n)",
            (agent_id, epoch, agent_id, agent_id, list(records)),
        )

    async def load(self, agent_id: str) -> list[str]:
        conn = await self._c("load", agent_id)
        rows = await self._rows(
            conn, b"SELECT record FROM history WHERE agent_id = %s ORDER BY seq", (agent_id,)
        )
        return [str(r[0]) for r in rows]

    async def load_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[int, str]]:
        conn = await self._c("load_before", agent_id)
        rows = await self._rows(
            conn,
            b"SELECT seq, record FROM history WHERE agent_id = %s AND seq < %s ORDER BY seq DESC LIMIT %s",
            (agent_id, _SEQ_END if before is None else before, limit),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    async def clear(self, agent_id: str) -> None:
        conn = await self._w("clear", agent_id)
        await self._send(conn, b"DELETE FROM history WHERE agent_id = %s", (agent_id,))

    # -- history archive
    async def archive_history(self, agent_id: str, compaction_id: str) -> int:
        conn = await self._w("archive_history", agent_id)
        # history seqs are increasing and >= 1, so base + seq keeps their order after every archived row
        rows = await self._rows(
            conn,
            b"WITH moved AS (DELETE FROM history WHERE agent_id = %s RETURNING seq, record), "
            b"base AS (SELECT COALESCE(max(seq), 0) AS m FROM history_archive WHERE agent_id = %s), "
            b"ins AS (INSERT INTO history_archive(agent_id, seq, record, compaction_id) "
            b"        SELECT %s, base.m + moved.seq, moved.record, %s FROM moved, base RETURNING 1) "
            b"SELECT count(*) FROM ins",
            (agent_id, agent_id, agent_id, compaction_id),
        )
        return int(rows[0][0])

    async def load_archive(self, agent_id: str) -> list[tuple[str, str]]:
        conn = await self._c("load_archive", agent_id)
        rows = await self._rows(
            conn,
            b"SELECT compaction_id, record FROM history_archive WHERE agent_id = %s ORDER BY seq",
            (agent_id,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    # -- agents
    async def insert_agent(self, row: AgentRow) -> bool:
        conn = await self._w("insert_agent")
        rows = await self._rows(
            conn,
            b"INSERT INTO agents(id, name, config, created_at) VALUES(%s, %s, %s, %s) "
            b"ON CONFLICT DO NOTHING RETURNING 1",
            (row.id, row.name, row.config, row.created_at),
        )
        return bool(rows)

    async def get_agent(self, agent_id: str) -> AgentRow | None:
        conn = await self._c("get_agent", agent_id)
        rows = await self._rows(
            conn, b"SELECT id, name, config, created_at FROM agents WHERE id = %s", (agent_id,)
        )
        return None if not rows else _agent(rows[0])

    async def list_agents(self) -> list[tuple[AgentRow, bool]]:
        conn = await self._c("list_agents")
        rows = await self._rows(
            conn,
            b"SELECT a.id, a.name, a.config, a.created_at, k.agent_id IS NOT NULL FROM agents a "
            b"LEFT JOIN kv k ON k.agent_id = a.id AND k.key = 'pending' "
            b'ORDER BY a.created_at, a.id COLLATE "C"',
            (),
        )
        return [(_agent(r), bool(r[4])) for r in rows]

    async def list_owners(self) -> dict[str, tuple[str | None, int]]:
        """Every agent's (owner worker id or None, epoch): what `stead agents` shows on PostgreSQL."""
        conn = await self._c("list_owners")
        rows = await self._rows(conn, b"SELECT id, owner, epoch FROM agents", ())
        return {str(r[0]): (None if r[1] is None else str(r[1]), int(r[2])) for r in rows}

    async def delete_agent(self, agent_id: str) -> bool:
        conn = await self._w("delete_agent", agent_id)
        await self._send(conn, b"DELETE FROM kv WHERE agent_id = %s", (agent_id,))
        await self._send(conn, b"DELETE FROM history WHERE agent_id = %s", (agent_id,))
        await self._send(conn, b"DELETE FROM history_archive WHERE agent_id = %s", (agent_id,))
        rows = await self._rows(conn, b"DELETE FROM agents WHERE id = %s RETURNING 1", (agent_id,))
        return bool(rows)

    async def agents_owing_work(self) -> list[tuple[AgentRow, str]]:
        conn = await self._c("agents_owing_work")
        rows = await self._rows(
            conn,
            b"SELECT a.id, a.name, a.config, a.created_at, k.value FROM kv k "
            b"JOIN agents a ON a.id = k.agent_id WHERE k.key = 'pending'",
            (),
        )
        return [(_agent(r), str(r[4])) for r in rows]

    # -- relational
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        conn = await self._w("execute")
        try:
            cur = await conn.execute(_query(sql), tuple(params))
            await self._sync_pipeline()
        except psycopg.Error as e:
            raise store_error(e, f"statement failed ({_brief(sql)})") from e
        return cur.rowcount

    async def write_sql(self, sql: str, params: Sequence[Any] = ()) -> None:
        conn = await self._w("execute")
        await self._send(conn, _query(sql), tuple(params))

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = await self._c("fetch")
        try:
            return await self._rows(conn, _query(sql), tuple(params))
        except StoreError as e:
            if type(e) is StoreError:
                raise StoreError(f"{e} ({_brief(sql)})") from e
            raise


def _agent(r: Sequence[Any]) -> AgentRow:
    return AgentRow(str(r[0]), None if r[1] is None else str(r[1]), str(r[2]), float(r[3]))


def _query(sql: str) -> bytes:
    return _encoded(translate(sql))


_ENCODED: dict[str, bytes] = {}


def _encoded(sql: str) -> bytes:
    b = _ENCODED.get(sql)
    if b is None:
        if len(_ENCODED) > 4096:
            _ENCODED.clear()
        b = _ENCODED[sql] = sql.encode()
    return b


def _brief(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= 160 else text[:157] + "..."


def _connect_error(e: BaseException) -> str:
    """libpq's reason without its preamble and hint lines: `database "x" does not exist`, `Connection
    refused`, …"""
    text = _first_line(e)
    for prefix in ("connection failed: ",):
        text = text.removeprefix(prefix)
    reason = text.rsplit(" failed: ", 1)
    return (reason[-1].removeprefix("FATAL:").strip() if len(reason) == 2 else text) or type(e).__name__


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
