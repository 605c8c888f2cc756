"""The embedded SQLite store: one owning process per database file.

All SQLite calls of the process go through one connection owned by `SqliteStore` and run on the event loop
thread: every statement is a local, in-cache operation that costs microseconds, so a thread hop would cost
more than the work. Writes are serialized by one asyncio lock (SQLite has a single writer anyway); the lock is
held from `BEGIN` to `COMMIT`, so reads inside a transaction never see another task's uncommitted writes.

Ownership is enforced by an exclusive `flock` on `<file>.lock`, taken before the database is opened and
held by the kernel for the life of the open file descriptor: it dies with the process, even on `kill -9`.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlparse

from stead.errors import Closed, InvalidInput, SchemaTooNew, StoreCrashed, StoreError, StoreLocked
from stead.store.base import AgentRow
from stead.store.faults import Faults

__all__ = ["SCHEMA_VERSION", "SqliteStore", "parse_sqlite_url"]

log = logging.getLogger("stead.store")

# Each entry migrates from version i to i+1. Append only; never edit a released migration.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE agents(
        id TEXT PRIMARY KEY, name TEXT, config TEXT NOT NULL, created_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE kv(
        agent_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY(agent_id, key)
    ) WITHOUT ROWID;
    CREATE INDEX kv_pending ON kv(agent_id) WHERE key = 'pending';
    CREATE TABLE history(
        agent_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY(agent_id, seq)
    ) WITHOUT ROWID;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """`sqlite:///rel/path.db`, `sqlite:////abs/path.db` or `sqlite:///:memory:` → (path, options)."""
    parsed = urlparse(url)
    if parsed.scheme != "sqlite":
        raise InvalidInput(f"not a sqlite URL: {url!r}")
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    if not path:
        raise InvalidInput(f"sqlite URL has no path: {url!r} (use sqlite:///file.db)")
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise InvalidInput(f"unknown sqlite URL option(s) {sorted(unknown)} in {url!r}")
    return path, options


_current: ContextVar[_SqliteTx | None] = ContextVar("stead_sqlite_tx", default=None)


class SqliteStore:
    """A `Store` over one SQLite file. Create with `await SqliteStore.open(url)`."""

    def __init__(
        self, url: str, path: str, conn: sqlite3.Connection, lock_fd: int | None, faults: Faults | None
    ) -> None:
        self.url = url
        self.path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock_fd = lock_fd
        self._faults = faults
        self._write_lock = asyncio.Lock()
        self._seq: dict[
            str, int
        ] = {}  # last history seq per agent, as committed (this process is the only writer)
        self._crashed = False
        self.ops = 0
        self.commits = 0
        self.dialect = "sqlite"
        self.modules: frozenset[str] = frozenset()

    # ---------------------------------------------------------------- opening / closing
    @classmethod
    async def open(
        cls, url: str, *, faults: Faults | None = None, migrations: Mapping[str, Sequence[str]] | None = None
    ) -> SqliteStore:
        """Take the process lock, open the file in WAL mode, migrate the schema.

        Raises `StoreLocked` at once when another process (or another open store) owns the file, and
        `SchemaTooNew` when the file was written by a newer stead."""
        path, options = parse_sqlite_url(url)
        sync = options.get("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise InvalidInput(f"synchronous must be normal or full, not {sync.lower()!r}")
        lock_fd: int | None = None
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock_fd)
                raise StoreLocked(
                    f"{path} is owned by another process (lock {path}.lock is held); "
                    "one process owns a SQLite store at a time — use PostgreSQL for several workers"
                ) from None
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.execute("PRAGMA busy_timeout=0")
            _migrate(conn, path, migrations)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        store = cls(url, path, conn, lock_fd, faults)
        store.modules = frozenset(migrations or {})
        return store

    async def close(self) -> None:
        async with self._write_lock:
            self._release()

    def _release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:  # pragma: no cover
                pass
            self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def closed(self) -> bool:
        return self._conn is None

    # ---------------------------------------------------------------- transactions
    def transaction(self) -> AbstractAsyncContextManager[_SqliteTx]:
        return _TxContext(self)

    def current(self) -> _SqliteTx | None:
        tx = _current.get()
        if tx is not None and tx.open and tx.store is self and tx.task is asyncio.current_task():
            return tx
        return None

    def _op(self, name: str) -> sqlite3.Connection:
        """Gate every operation: count it, inject faults, refuse a closed store."""
        self.ops += 1
        conn = self._conn
        if self._faults is not None:
            try:
                self._faults.check(name)
            except StoreCrashed:
                self._crash()
                raise
        if conn is None:
            if self._crashed:
                raise StoreCrashed("the store crashed (injected)")
            raise Closed("the store is closed")
        return conn

    def _crash(self) -> None:
        """Simulate process death: roll back whatever is open and release file and lock."""
        self._crashed = True
        if self._conn is not None:
            try:
                self._conn.rollback()
            except sqlite3.Error:  # pragma: no cover
                pass
        self._release()


class _TxContext:
    __slots__ = ("_joined", "_store", "_token", "_tx")

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._tx: _SqliteTx | None = None
        self._joined = False

    async def __aenter__(self) -> _SqliteTx:
        store = self._store
        outer = store.current()
        if outer is not None:
            self._joined = True
            self._tx = outer
            return outer
        await store._write_lock.acquire()
        conn = store._conn
        if conn is None:
            store._write_lock.release()
            raise (
                StoreCrashed("the store crashed (injected)")
                if store._crashed
                else Closed("the store is closed")
            )
        tx = _SqliteTx(store, conn)
        self._tx = tx
        self._token = _current.set(tx)
        return tx

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._joined:
            return
        store = self._store
        tx = self._tx
        assert tx is not None
        try:
            _current.reset(self._token)
        except ValueError:  # pragma: no cover - reset from another context
            _current.set(None)
        committed = not tx.began  # a transaction that never wrote has nothing to commit or roll back
        try:
            if et is None and tx.began:
                try:
                    conn = store._op("commit")
                    conn.execute("COMMIT")
                    committed = True
                    store.commits += 1
                    store._seq.update(tx._seq)
                except sqlite3.Error as err:
                    raise StoreError(f"commit failed: {err}") from err
        finally:
            tx.open = False
            if not committed and store._conn is not None:
                try:
                    store._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            store._write_lock.release()
        if et is not None:
            return  # rolled back: its after-commit callbacks never run
        for fn in tx.callbacks:
            try:
                fn()
            except Exception:  # an after-commit failure is logged, never raised into a committed caller
                log.exception("after-commit callback failed")


class _Savepoint:
    __slots__ = ("_mark", "_name", "_tx")

    def __init__(self, tx: _SqliteTx) -> None:
        self._tx = tx
        tx.savepoints += 1
        self._name = f"sp{tx.savepoints}"
        self._mark = 0

    async def __aenter__(self) -> None:
        self._tx._w("savepoint").execute(f"SAVEPOINT {self._name}")
        self._mark = len(self._tx.callbacks)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        tx = self._tx
        if et is None:
            try:
                tx.store._op("release").execute(f"RELEASE {self._name}")
                return
            except BaseException:
                # a failed RELEASE must not keep the section's writes: roll it back like a failed body
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        tx = self._tx
        del tx.callbacks[self._mark :]
        conn = tx.store._conn
        if conn is not None:
            try:
                conn.execute(f"ROLLBACK TO {self._name}")
                conn.execute(f"RELEASE {self._name}")
            except sqlite3.Error:
                pass


class _SqliteTx:
    """An open SQLite transaction (see `stead.store.base.Tx`)."""

    __slots__ = ("_seq", "began", "callbacks", "conn", "open", "savepoints", "store", "task")

    def __init__(self, store: SqliteStore, conn: sqlite3.Connection) -> None:
        self.store = store
        self.conn = conn
        self.task = asyncio.current_task()
        self.open = True
        self.callbacks: list[Callable[[], object]] = []
        self.savepoints = 0
        self._seq: dict[str, int] = {}
        self.began = False

    def _c(self, name: str) -> sqlite3.Connection:
        """A read. Reads before the first write run without BEGIN: the store lock is held, and this
        process is the only writer, so nothing can change between them."""
        if not self.open:
            raise StoreError("this transaction has ended")
        return self.store._op(name)

    def _w(self, name: str) -> sqlite3.Connection:
        """A write: the first one opens the SQLite transaction (lazy BEGIN)."""
        conn = self._c(name)
        if not self.began:
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as e:
                raise StoreError(f"could not begin a transaction: {e}") from e
            self.began = True
        return conn

    def after_commit(self, fn: Callable[[], object]) -> None:
        self.callbacks.append(fn)

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        return _Savepoint(self)

    # -- KV
    async def get(self, agent_id: str, key: str) -> str | None:
        row = (
            self._c("get")
            .execute("SELECT value FROM kv WHERE agent_id=? AND key=?", (agent_id, key))
            .fetchone()
        )
        return None if row is None else str(row[0])

    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        return (
            self._c("read_prefix")
            .execute(
                "SELECT key, value FROM kv WHERE agent_id=? AND key>=? AND key<? ORDER BY key",
                (agent_id, prefix, prefix + "\U0010ffff"),
            )
            .fetchall()
        )

    async def last_key(self, agent_id: str, prefix: str) -> str | None:
        row = (
            self._c("last_key")
            .execute(
                "SELECT max(key) FROM kv WHERE agent_id=? AND key>=? AND key<?",
                (agent_id, prefix, prefix + "\U0010ffff"),
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else str(row[0])

    async def write(self, agent_id: str, key: str, value: str) -> None:
        self._w("write").execute(
            "INSERT OR REPLACE INTO kv(agent_id, key, value) VALUES(?,?,?)", (agent_id, key, value)
        )

    async def write_if_absent(self, agent_id: str, key: str, value: str) -> bool:
        cur = self._w("write_if_absent").execute(
            "INSERT OR IGNORE INTO kv(agent_id, key, value) VALUES(?,?,?)", (agent_id, key, value)
        )
        return cur.rowcount == 1

    async def delete(self, agent_id: str, key: str) -> bool:
        cur = self._w("delete").execute("DELETE FROM kv WHERE agent_id=? AND key=?", (agent_id, key))
        return cur.rowcount == 1

    async def delete_prefix(self, agent_id: str, prefix: str) -> int:
        cur = self._w("delete_prefix").execute(
            "DELETE FROM kv WHERE agent_id=? AND key>=? AND key<?", (agent_id, prefix, prefix + "\U0010ffff")
        )
        return cur.rowcount

    # -- history
    async def append(self, agent_id: str, records: Sequence[str]) -> None:
        conn = self._w("append")
        seq = self._seq.get(agent_id)
        if seq is None:
            seq = self.store._seq.get(agent_id)
        if seq is None:
            row = conn.execute("SELECT max(seq) FROM history WHERE agent_id=?", (agent_id,)).fetchone()
            seq = int(row[0]) if row and row[0] is not None else 0
        for record in records:
            seq += 1
            conn.execute("INSERT INTO history(agent_id, seq, record) VALUES(?,?,?)", (agent_id, seq, record))
        self._seq[agent_id] = seq

    async def load(self, agent_id: str) -> list[str]:
        rows = (
            self._c("load")
            .execute("SELECT record FROM history WHERE agent_id=? ORDER BY seq", (agent_id,))
            .fetchall()
        )
        return [r[0] for r in rows]

    async def clear(self, agent_id: str) -> None:
        self._w("clear").execute("DELETE FROM history WHERE agent_id=?", (agent_id,))
        self._seq.pop(agent_id, None)

    # -- agents
    async def insert_agent(self, row: AgentRow) -> bool:
        cur = self._w("insert_agent").execute(
            "INSERT OR IGNORE INTO agents(id, name, config, created_at) VALUES(?,?,?,?)",
            (row.id, row.name, row.config, row.created_at),
        )
        return cur.rowcount == 1

    async def get_agent(self, agent_id: str) -> AgentRow | None:
        r = (
            self._c("get_agent")
            .execute("SELECT id, name, config, created_at FROM agents WHERE id=?", (agent_id,))
            .fetchone()
        )
        return None if r is None else AgentRow(r[0], r[1], r[2], r[3])

    async def list_agents(self) -> list[tuple[AgentRow, bool]]:
        rows = (
            self._c("list_agents")
            .execute(
                "SELECT a.id, a.name, a.config, a.created_at, k.agent_id IS NOT NULL FROM agents a "
                "LEFT JOIN kv k ON k.agent_id = a.id AND k.key = 'pending' ORDER BY a.created_at, a.id"
            )
            .fetchall()
        )
        return [(AgentRow(r[0], r[1], r[2], r[3]), bool(r[4])) for r in rows]

    async def delete_agent(self, agent_id: str) -> bool:
        conn = self._w("delete_agent")
        conn.execute("DELETE FROM kv WHERE agent_id=?", (agent_id,))
        conn.execute("DELETE FROM history WHERE agent_id=?", (agent_id,))
        self._seq[agent_id] = 0
        return conn.execute("DELETE FROM agents WHERE id=?", (agent_id,)).rowcount == 1

    async def agents_owing_work(self) -> list[tuple[AgentRow, str]]:
        rows = (
            self._c("agents_owing_work")
            .execute(
                "SELECT a.id, a.name, a.config, a.created_at, k.value FROM kv k INDEXED BY kv_pending "
                "JOIN agents a ON a.id = k.agent_id WHERE k.key = 'pending'"
            )
            .fetchall()
        )
        return [(AgentRow(r[0], r[1], r[2], r[3]), r[4]) for r in rows]

    # -- relational
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._w("execute").execute(sql, tuple(params)).rowcount

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._c("fetch").execute(sql, tuple(params)).fetchall()


def _migrate(conn: sqlite3.Connection, path: str, modules: Mapping[str, Sequence[str]] | None = None) -> None:
    """Bring the schema to `SCHEMA_VERSION` (the kernel's tables), then each higher layer's module to the
    length of its migration list. Each migration commits atomically with its version bump; a version newer
    than the code refuses to open (`SchemaTooNew`)."""
    conn.execute("CREATE TABLE IF NOT EXISTS stead_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    _migrate_module(conn, path, "schema_version", MIGRATIONS)
    for module, migrations in (modules or {}).items():
        if not module.isidentifier():
            raise InvalidInput(f"migration module name {module!r} must be an identifier")
        _migrate_module(conn, path, f"schema_version:{module}", list(migrations))


def _migrate_module(conn: sqlite3.Connection, path: str, key: str, migrations: Sequence[str]) -> None:
    row = conn.execute("SELECT value FROM stead_meta WHERE key=?", (key,)).fetchone()
    version = int(row[0]) if row else 0
    if version > len(migrations):
        conn.close()
        what = "this stead's" if key == "schema_version" else f"module {key.split(':', 1)[1]!r}'s"
        raise SchemaTooNew(
            f"{path} has schema version {version}, newer than {what} {len(migrations)}; upgrade stead"
        )
    while version < len(migrations):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in migrations[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
            version += 1
            conn.execute("INSERT OR REPLACE INTO stead_meta(key, value) VALUES(?, ?)", (key, str(version)))
            conn.execute(
                "INSERT OR IGNORE INTO stead_meta(key, value) VALUES('created_at', ?)", (str(time.time()),)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
