"""The embedded SQLite store: one owning process per database file.

All SQLite calls of the process go through one connection owned by `SqliteStore` and run on the event loop
thread: every statement is a local, in-cache operation that costs microseconds, so a thread hop would cost
more than the work. Writes are serialized by one asyncio lock (SQLite has a single writer anyway); the lock is
held from `BEGIN` to `COMMIT`, so reads inside a transaction never see another task's uncommitted writes.

Ownership is enforced by an exclusive `flock` on `<file>.lock`, taken before the database is opened and
held by the kernel for the life of the open file descriptor: it dies with the process, even on `kill -9`.
The owner writes its pid into the lock file, so a refused second owner can say who owns the store.

A store opened with `readonly=True` is an inspector: it takes no lock (so it works while an owner runs),
opens the file with SQLite's read-only mode (so it never creates, migrates or alters anything — a missing
file, a file that is not a stead store and a store of a newer stead are refused with one line naming the
file), refuses every write with `stead.errors.ReadOnly`, and runs every `transaction()` as one fresh read
transaction: WAL gives it a consistent snapshot of everything committed when the transaction began, so
any number of inspectors see every change the owner commits, one transaction later at most.

Every way a file can fail to open (a directory, not a database, corrupted, read-only, locked) is a
`StoreError` whose message is one line naming the file and what to do.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from stead.errors import Closed, InvalidInput, ReadOnly, StoreCrashed, StoreError, StoreLocked
from stead.store._sqlite_files import (
    PRIVATE,
    SCHEMA_VERSION,
    check_foreign,
    check_not_directory,
    check_versions,
    create_private,
    file_error,
    lock_owner,
    migrate,
    not_stead,
    tables,
    unlink,
    write_pid,
)
from stead.store._tx import TxBase, TxStore
from stead.store.base import NO_CAPABILITIES, AgentRow, Capabilities
from stead.store.faults import Faults

__all__ = ["SCHEMA_VERSION", "SqliteStore", "parse_sqlite_url"]

log = logging.getLogger("stead.store")
_SEQ_END = 2**62  # above every history seq: `load_before(before=None)` reads from the end


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


class SqliteStore(TxStore["_SqliteTx"]):
    """A `Store` over one SQLite file. Create with `await SqliteStore.open(url)`."""

    dialect = "sqlite"
    capabilities: Capabilities = NO_CAPABILITIES

    def __init__(
        self,
        url: str,
        path: str,
        conn: sqlite3.Connection,
        lock_fd: int | None,
        faults: Faults | None,
        *,
        readonly: bool = False,
    ) -> None:
        self.url = url
        self.path = path
        self.readonly = readonly
        self._conn: sqlite3.Connection | None = conn
        self._lock_fd = lock_fd
        self._faults = faults
        self._lock = asyncio.Lock()
        self._seq: dict[
            str, int
        ] = {}  # last history seq per agent, as committed (this process is the only writer)
        self._crashed = False
        self.ops = 0
        self.commits = 0
        self.modules: frozenset[str] = frozenset()

    # ---------------------------------------------------------------- opening / closing
    @classmethod
    async def open(
        cls,
        url: str,
        *,
        faults: Faults | None = None,
        migrations: Mapping[str, Sequence[str]] | None = None,
        readonly: bool = False,
    ) -> SqliteStore:
        """Take the process lock, open the file in WAL mode, migrate the schema (`readonly=True`: none of
        that — see `open_readonly`).

        Raises `StoreLocked` at once when another process (or another open store) owns the file,
        `SchemaTooNew` when the file was written by a newer stead, and `StoreError` naming the file when it
        cannot be opened or is not a stead store."""
        path, options = parse_sqlite_url(url)
        if readonly:
            return cls._open_readonly(url, path, faults, migrations)
        return cls._open_owner(url, path, options, faults, migrations)

    @classmethod
    def _open_owner(
        cls,
        url: str,
        path: str,
        options: Mapping[str, str],
        faults: Faults | None,
        migrations: Mapping[str, Sequence[str]] | None,
    ) -> SqliteStore:
        """Lock, open, migrate. Local file operations of microseconds: run on the loop thread."""
        sync = options.get("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise InvalidInput(f"synchronous must be normal or full, not {sync.lower()!r}")
        lock_fd: int | None = None
        if path != ":memory:":
            check_not_directory(path)
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(
                    f"cannot create the directory of {path}: {e.strerror or e} ({Path(path).parent})"
                ) from None
            new_lock = not os.path.exists(path + ".lock")
            try:
                lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, PRIVATE)
            except OSError as e:
                raise StoreError(
                    f"cannot open {path} for writing: its lock file {path}.lock cannot be created "
                    f"({e.strerror or e}); a read-only store can still be inspected with readonly=True"
                ) from None
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock_fd)
                owner = lock_owner(path)
                raise StoreLocked(
                    f"{path} is owned by another process ({owner}lock {path}.lock is held); one process owns "
                    "a SQLite store at a time — inspect it meanwhile with stead.open(url, readonly=True) "
                    "(or `stead agents`, `stead history`, `stead runs`)"
                ) from None
            write_pid(lock_fd)
        try:
            if lock_fd is not None:
                create_private(path)  # SEC7k1: 0600, and so are the -wal and -shm files SQLite adds
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
            try:
                check_foreign(conn, path)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={sync}")
                conn.execute("PRAGMA foreign_keys=OFF")
                conn.execute("PRAGMA busy_timeout=0")
                migrate(conn, path, migrations)
            except BaseException:
                conn.close()
                raise
        except BaseException as e:
            if lock_fd is not None:
                if new_lock:  # leave nothing behind next to a file that is not ours
                    unlink(path + ".lock")
                os.close(lock_fd)
            if isinstance(e, sqlite3.Error):
                raise file_error(path, e) from None
            raise
        store = cls(url, path, conn, lock_fd, faults)
        store.modules = frozenset(migrations or {})
        return store

    @classmethod
    def _open_readonly(
        cls, url: str, path: str, faults: Faults | None, migrations: Mapping[str, Sequence[str]] | None
    ) -> SqliteStore:
        """Open for inspection: no lock, SQLite read-only mode, no migration; refuse what is not a stead
        store of this version (or older in a module only: its tables may be missing and then read as
        errors naming the file)."""
        if path == ":memory:":
            raise InvalidInput("an in-memory store (sqlite:///:memory:) cannot be opened read-only")
        check_not_directory(path)
        file = Path(path)
        if not file.exists():
            raise StoreError(f"{path}: no such database file (opening read-only never creates one)")
        uri = file.resolve().as_uri() + "?mode=ro"
        try:
            try:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError:
                if Path(path + "-wal").exists():
                    raise
                # a read-only directory where SQLite cannot create its -shm file: with no WAL to read,
                # the file alone is the database (no owner runs: an owner keeps a WAL file)
                conn = sqlite3.connect(
                    file.resolve().as_uri() + "?mode=ro&immutable=1",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            try:
                conn.execute("PRAGMA busy_timeout=5000")
                found = tables(conn)
                if "stead_meta" not in found:
                    raise StoreError(not_stead(path, found))
                check_versions(conn, path, migrations)
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as e:
            raise file_error(path, e) from None
        return cls(url, path, conn, None, faults, readonly=True)

    async def close(self) -> None:
        async with self._lock:
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

    # ---------------------------------------------------------------- transactions (`stead.store._tx`)
    def _begin(self) -> _SqliteTx:
        conn = self._conn
        if conn is None:
            if self._crashed:
                raise StoreCrashed("the store crashed (injected)")
            raise Closed("the store is closed")
        tx = _SqliteTx(self, conn)
        if self.readonly:
            # one read transaction: a consistent snapshot of what the owner had committed at this point
            try:
                conn.execute("BEGIN")
                tx.began = True
            except sqlite3.Error as e:
                raise file_error(self.path, e) from None
        return tx

    async def _commit(self, tx: _SqliteTx) -> None:
        if not tx.began:
            return  # a transaction that never wrote has nothing to commit or roll back
        try:
            conn = self._op("commit")
            conn.execute("COMMIT")
        except sqlite3.Error as err:
            raise StoreError(f"commit failed: {err}") from err
        self.commits += 1
        self._seq.update(tx._seq)

    async def _finish(self, tx: _SqliteTx, committed: bool) -> None:
        if not committed and tx.began and self._conn is not None:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

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


class _SqliteTx(TxBase):
    """An open SQLite transaction (see `stead.store.base.Tx`)."""

    __slots__ = ("_seq", "began", "conn")

    store: SqliteStore

    def __init__(self, store: SqliteStore, conn: sqlite3.Connection) -> None:
        # TxBase's fields, set here: one transaction per store operation group, on the hot path
        self.store = store
        self.task = asyncio.current_task()
        self.open = True
        self.callbacks: list[Callable[[], object]] = []
        self.savepoints = 0
        self.conn = conn
        self._seq: dict[str, int] = {}
        self.began = False

    def _c(self, name: str) -> sqlite3.Connection:
        """A read. Reads before the first write run without BEGIN: the store lock is held, and this
        process is the only writer, so nothing can change between them."""
        if not self.open:
            raise StoreError("this transaction has ended")
        return self.store._op(name)

    def _r(self, name: str, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run a read; SQLite failures (a corrupted page, a table an old store lacks) are `StoreError`s
        naming the file."""
        conn = self._c(name)
        try:
            return conn.execute(sql, tuple(params))
        except sqlite3.Error as e:
            raise file_error(self.store.path, e) from None

    def _w(self, name: str) -> sqlite3.Connection:
        """A write: the first one opens the SQLite transaction (lazy BEGIN)."""
        if self.store.readonly:
            raise ReadOnly(
                f"{self.store.path} was opened with readonly=True: it can be read, not written "
                "(open it without readonly=True in the process that owns it)"
            )
        conn = self._c(name)
        if not self.began:
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as e:
                raise StoreError(f"could not begin a transaction: {e}") from e
            self.began = True
        return conn

    # -- savepoints (`stead.store._tx.Savepoint`)
    async def _sp_begin(self, name: str) -> None:
        self._w("savepoint").execute(f"SAVEPOINT {name}")

    async def _sp_release(self, name: str) -> None:
        self.store._op("release").execute(f"RELEASE {name}")

    async def _sp_rollback(self, name: str) -> None:
        conn = self.store._conn
        if conn is not None:
            try:
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
            except sqlite3.Error:
                pass

    # -- KV
    async def get(self, agent_id: str, key: str) -> str | None:
        row = self._r("get", "SELECT value FROM kv WHERE agent_id=? AND key=?", (agent_id, key)).fetchone()
        return None if row is None else str(row[0])

    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        return self._r(
            "read_prefix",
            "SELECT key, value FROM kv WHERE agent_id=? AND key>=? AND key<? ORDER BY key",
            (agent_id, prefix, prefix + "\U0010ffff"),
        ).fetchall()

    async def last_key(self, agent_id: str, prefix: str) -> str | None:
        row = self._r(
            "last_key",
            "SELECT max(key) FROM kv WHERE agent_id=? AND key>=? AND key<?",
            (agent_id, prefix, prefix + "\U0010ffff"),
        ).fetchone()
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
        rows = self._r(
            "load", "SELECT record FROM history WHERE agent_id=? ORDER BY seq", (agent_id,)
        ).fetchall()
        return [r[0] for r in rows]

    async def load_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[int, str]]:
        rows = self._r(
            "load_before",
            "SELECT seq, record FROM history WHERE agent_id=? AND seq<? ORDER BY seq DESC LIMIT ?",
            (agent_id, _SEQ_END if before is None else before, limit),
        ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    async def clear(self, agent_id: str) -> None:
        self._w("clear").execute("DELETE FROM history WHERE agent_id=?", (agent_id,))
        self._seq.pop(agent_id, None)

    # -- history archive
    async def archive_history(self, agent_id: str, compaction_id: str) -> int:
        conn = self._w("archive_history")
        row = conn.execute("SELECT max(seq) FROM history_archive WHERE agent_id=?", (agent_id,)).fetchone()
        base = int(row[0]) if row and row[0] is not None else 0
        # history seqs are increasing and >= 1, so base + seq keeps their order after every archived row
        moved = conn.execute(
            "INSERT INTO history_archive(agent_id, seq, record, compaction_id) "
            "SELECT agent_id, ? + seq, record, ? FROM history WHERE agent_id=?",
            (base, compaction_id, agent_id),
        ).rowcount
        conn.execute("DELETE FROM history WHERE agent_id=?", (agent_id,))
        self._seq.pop(agent_id, None)
        return moved

    async def load_archive(self, agent_id: str) -> list[tuple[str, str]]:
        rows = self._r(
            "load_archive",
            "SELECT compaction_id, record FROM history_archive WHERE agent_id=? ORDER BY seq",
            (agent_id,),
        ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    # -- agents
    async def insert_agent(self, row: AgentRow) -> bool:
        cur = self._w("insert_agent").execute(
            "INSERT OR IGNORE INTO agents(id, name, config, created_at) VALUES(?,?,?,?)",
            (row.id, row.name, row.config, row.created_at),
        )
        return cur.rowcount == 1

    async def get_agent(self, agent_id: str) -> AgentRow | None:
        r = self._r(
            "get_agent", "SELECT id, name, config, created_at FROM agents WHERE id=?", (agent_id,)
        ).fetchone()
        return None if r is None else AgentRow(r[0], r[1], r[2], r[3])

    async def list_agents(self) -> list[tuple[AgentRow, bool]]:
        rows = self._r(
            "list_agents",
            "SELECT a.id, a.name, a.config, a.created_at, k.agent_id IS NOT NULL FROM agents a "
            "LEFT JOIN kv k ON k.agent_id = a.id AND k.key = 'pending' ORDER BY a.created_at, a.id",
        ).fetchall()
        return [(AgentRow(r[0], r[1], r[2], r[3]), bool(r[4])) for r in rows]

    async def delete_agent(self, agent_id: str) -> bool:
        conn = self._w("delete_agent")
        conn.execute("DELETE FROM kv WHERE agent_id=?", (agent_id,))
        conn.execute("DELETE FROM history WHERE agent_id=?", (agent_id,))
        conn.execute("DELETE FROM history_archive WHERE agent_id=?", (agent_id,))
        self._seq[agent_id] = 0
        return conn.execute("DELETE FROM agents WHERE id=?", (agent_id,)).rowcount == 1

    async def agents_owing_work(self) -> list[tuple[AgentRow, str]]:
        rows = self._r(
            "agents_owing_work",
            "SELECT a.id, a.name, a.config, a.created_at, k.value FROM kv k INDEXED BY kv_pending "
            "JOIN agents a ON a.id = k.agent_id WHERE k.key = 'pending'",
        ).fetchall()
        return [(AgentRow(r[0], r[1], r[2], r[3]), r[4]) for r in rows]

    # -- relational
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._w("execute").execute(sql, tuple(params)).rowcount

    async def write_sql(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._w("execute").execute(sql, tuple(params))

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._r("fetch", sql, params).fetchall()
