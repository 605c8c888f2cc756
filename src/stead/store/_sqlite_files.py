"""The SQLite store's file: its schema (kernel migrations and version checks) and the checks and messages
of opening it — who owns the lock, whether a file is a stead store at all, and every SQLite failure on a
file turned into one line that names it and says what to do."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from stead.errors import InvalidInput, SchemaTooNew, StoreError

__all__ = [
    "MIGRATIONS",
    "PRIVATE",
    "SCHEMA_VERSION",
    "check_foreign",
    "check_not_directory",
    "check_versions",
    "create_private",
    "file_error",
    "lock_owner",
    "migrate",
    "not_stead",
    "tables",
    "unlink",
    "write_pid",
]

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
    # 2: the history archive (K1): every record a compaction replaced, in order, with the compaction's id
    """
    CREATE TABLE history_archive(
        agent_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL, compaction_id TEXT NOT NULL,
        PRIMARY KEY(agent_id, seq)
    ) WITHOUT ROWID;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def file_error(path: str, error: sqlite3.Error) -> StoreError:
    """A SQLite failure on opening or reading `path`, as one line naming the file and what it means."""
    text = str(error)
    lowered = text.lower()
    if "file is not a database" in lowered:
        return StoreError(f"{path} is not a SQLite database (it holds something else)")
    if "malformed" in lowered or "corrupt" in lowered:
        return StoreError(f"{path} is corrupted ({text}); restore it from a backup")
    if "readonly" in lowered or "read-only" in lowered:
        return StoreError(
            f"{path} is read-only ({text}); inspect it with readonly=True, or make it writable to own it"
        )
    if "unable to open" in lowered or "disk i/o" in lowered:
        return StoreError(f"cannot open {path} ({text}): check that it is a readable file")
    if "no such table" in lowered:
        return StoreError(f"{path} lacks a table ({text}): open it once without readonly=True to upgrade it")
    return StoreError(f"{path}: {text}")


def check_not_directory(path: str) -> None:
    if Path(path).is_dir():
        raise StoreError(f"{path} is a directory, not a database file (name a file, e.g. {path}/stead.db)")


PRIVATE = 0o600
"""SEC7k1: the mode of every file the store creates (the database, its lock file; SQLite gives the -wal and
-shm files the database file's mode)."""


def create_private(path: str) -> None:
    """Create `path` empty with mode 0600 unless it exists (an existing file keeps its mode): SQLite would
    create it with 0644 less the umask, readable by every local user, and its -wal/-shm files copy that."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE)
    except FileExistsError:
        return
    except OSError as e:
        raise StoreError(f"cannot create {path}: {e.strerror or e}") from None
    os.close(fd)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # pragma: no cover
        pass


def write_pid(lock_fd: int) -> None:
    """Record the owner's pid in the lock file (best effort: the lock, not the text, is the ownership)."""
    try:
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # pragma: no cover - a full disk; ownership still holds
        pass


def lock_owner(path: str) -> str:
    """`pid 1234, ` when the lock file names its owner (an owner from before pids were written: empty)."""
    try:
        text = Path(path + ".lock").read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
    return f"pid {text}, " if text.isdigit() else ""


def tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    return [str(r[0]) for r in rows]


def not_stead(path: str, tables: Sequence[str]) -> str:
    if not tables:
        return f"{path} is not a stead store (it is an empty database)"
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return f"{path} is not a stead store (it is a SQLite database of another application; tables: {shown})"


def check_foreign(conn: sqlite3.Connection, path: str) -> None:
    """An owner initializes an empty file, never another application's database."""
    found = tables(conn)
    if found and "stead_meta" not in found:
        raise StoreError(not_stead(path, found))


def check_versions(
    conn: sqlite3.Connection, path: str, modules: Mapping[str, Sequence[str]] | None = None
) -> None:
    """For inspection: refuse a store this code cannot read (newer anywhere, or an older kernel schema,
    which only an owner can migrate)."""
    version = _version(conn, "schema_version")
    if version > SCHEMA_VERSION:
        raise _too_new(path, "schema_version", version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, older than this stead's {SCHEMA_VERSION}; open it once "
            "without readonly=True to migrate it"
        )
    for module, migrations in (modules or {}).items():
        key = f"schema_version:{module}"
        found = _version(conn, key)
        if found > len(migrations):
            raise _too_new(path, key, found, len(migrations))


def _version(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT value FROM stead_meta WHERE key=?", (key,)).fetchone()
    return int(row[0]) if row else 0


def _too_new(path: str, key: str, version: int, known: int) -> SchemaTooNew:
    what = "this stead's" if key == "schema_version" else f"module {key.split(':', 1)[1]!r}'s"
    return SchemaTooNew(f"{path} has schema version {version}, newer than {what} {known}; upgrade stead")


def migrate(conn: sqlite3.Connection, path: str, modules: Mapping[str, Sequence[str]] | None = None) -> None:
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
    version = _version(conn, key)
    if version > len(migrations):
        raise _too_new(path, key, version, len(migrations))
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
