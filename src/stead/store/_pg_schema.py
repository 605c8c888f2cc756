"""The PostgreSQL store's schema: kernel migrations, the fence function, and migrating under a lock.

The kernel tables mirror SQLite's (`agents`, `kv`, `history`, `history_archive`, `stead_meta`) plus what
several workers sharing one database need: `agents.owner/epoch/owned_since` (the lease and its fencing
token), `history.epoch` (the writer's epoch, for audits) and `stead_workers` (the worker registry).
KV keys are `COLLATE "C"`: prefix ranges and queue FIFO order rely on code-point order.

Migrations of the kernel and of every plugin module run in one transaction per script, all under
`pg_advisory_xact_lock`, so several processes opening a fresh database at once never race: the first
applies, the others wait, then find the versions current.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import psycopg

from stead.errors import InvalidInput, SchemaTooNew, StoreError

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "check_versions", "migrate", "split_script"]

MIGRATION_LOCK = 0x73746561  # "stea": the advisory lock key every migrating opener takes

# Each entry migrates from version i to i+1 (the same numbering as SQLite's). Append only.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE stead_workers(
        id uuid PRIMARY KEY, host text, pid integer, started_at timestamptz NOT NULL DEFAULT now(),
        heartbeat_at timestamptz NOT NULL DEFAULT now(), state text NOT NULL DEFAULT 'live',
        capacity integer NOT NULL DEFAULT 1000
    );
    CREATE TABLE agents(
        id text PRIMARY KEY, name text, config text NOT NULL, created_at double precision NOT NULL,
        owner uuid, epoch bigint NOT NULL DEFAULT 0, owned_since timestamptz
    );
    CREATE INDEX agents_owner ON agents(owner) WHERE owner IS NOT NULL;
    CREATE TABLE kv(
        agent_id text NOT NULL, key text COLLATE "C" NOT NULL, value text NOT NULL, PRIMARY KEY(agent_id, key)
    );
    CREATE INDEX kv_pending ON kv(agent_id) WHERE key = 'pending';
    CREATE TABLE history(
        agent_id text NOT NULL, seq bigint NOT NULL, record text NOT NULL, epoch bigint NOT NULL DEFAULT 0,
        PRIMARY KEY(agent_id, seq)
    );
    CREATE FUNCTION stead_fence(a text, e bigint) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM 1 FROM agents WHERE id = a AND epoch = e FOR NO KEY UPDATE;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost: %', a USING ERRCODE = 'SL001';
      END IF;
    END $$
    """,
    # 2: the history archive (K1): every record a compaction replaced, in order, with the compaction's id
    """
    CREATE TABLE history_archive(
        agent_id text NOT NULL, seq bigint NOT NULL, record text NOT NULL, compaction_id text NOT NULL,
        PRIMARY KEY(agent_id, seq)
    )
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def split_script(script: str) -> list[str]:
    """Statements of a migration script, split on `;` outside quotes and `$$` bodies."""
    out: list[str] = []
    buf: list[str] = []
    i, n = 0, len(script)
    quote: str | None = None
    while i < n:
        c = script[i]
        if quote is not None:
            if script.startswith(quote, i):
                buf.append(quote)
                i += len(quote)
                quote = None
                continue
            buf.append(c)
            i += 1
            continue
        if script.startswith("$$", i):
            quote = "$$"
            buf.append("$$")
            i += 2
            continue
        if c in ("'", '"'):
            quote = c
        if c == ";":
            out.append("".join(buf))
            buf = []
        else:
            buf.append(c)
        i += 1
    out.append("".join(buf))
    return [s.strip() for s in out if s.strip()]


async def _tables(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> list[str]:
    cur = await conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
        "ORDER BY table_name"
    )
    return [str(r[0]) for r in await cur.fetchall()]


def not_stead(where: str, found: Sequence[str]) -> str:
    if not found:
        return f"{where} is not a stead store (it is an empty database)"
    shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
    return f"{where} is not a stead store (it is a database of another application; tables: {shown})"


async def _version(conn: psycopg.AsyncConnection[tuple[object, ...]], key: str) -> int:
    cur = await conn.execute("SELECT value FROM stead_meta WHERE key = %s", (key,))
    row = await cur.fetchone()
    return int(str(row[0])) if row else 0


def _too_new(where: str, key: str, version: int, known: int) -> SchemaTooNew:
    what = "this stead's" if key == "schema_version" else f"module {key.split(':', 1)[1]!r}'s"
    return SchemaTooNew(f"{where} has schema version {version}, newer than {what} {known}; upgrade stead")


async def migrate(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    where: str,
    modules: Mapping[str, Sequence[str]] | None = None,
) -> int:
    """Bring the kernel schema and every module to the length of its migration list, under the migration
    advisory lock (transaction-scoped: it dies with the session, also on kill -9). Returns how many scripts
    this call applied (0 when another opener had done it all)."""
    for module in modules or {}:
        if not module.isidentifier():
            raise InvalidInput(f"migration module name {module!r} must be an identifier")
    applied = 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        found = await _tables(conn)
        if found and "stead_meta" not in found:
            raise StoreError(not_stead(where, found))
        await conn.execute("CREATE TABLE IF NOT EXISTS stead_meta(key text PRIMARY KEY, value text NOT NULL)")
        await conn.execute(
            "INSERT INTO stead_meta(key, value) VALUES('created_at', %s) ON CONFLICT DO NOTHING",
            (str(time.time()),),
        )
        applied += await _migrate_module(conn, where, "schema_version", MIGRATIONS)
        for module, scripts in (modules or {}).items():
            applied += await _migrate_module(conn, where, f"schema_version:{module}", list(scripts))
    return applied


async def _migrate_module(
    conn: psycopg.AsyncConnection[tuple[object, ...]], where: str, key: str, migrations: Sequence[str]
) -> int:
    version = await _version(conn, key)
    if version > len(migrations):
        raise _too_new(where, key, version, len(migrations))
    applied = 0
    while version < len(migrations):
        for statement in split_script(migrations[version]):
            await conn.execute(statement.encode())  # bytes: never parsed for placeholders
        version += 1
        applied += 1
        await conn.execute(
            "INSERT INTO stead_meta(key, value) VALUES(%s, %s) ON CONFLICT(key) DO UPDATE SET value = "
            "excluded.value",
            (key, str(version)),
        )
    return applied


async def check_versions(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    where: str,
    modules: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """For inspection: refuse a database that is not a stead store, or one this code cannot read."""
    found = await _tables(conn)
    if "stead_meta" not in found:
        raise StoreError(not_stead(where, found))
    version = await _version(conn, "schema_version")
    if version > SCHEMA_VERSION:
        raise _too_new(where, "schema_version", version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}, older than this stead's {SCHEMA_VERSION}; open it once "
            "without readonly=True to migrate it"
        )
    for module, migrations in (modules or {}).items():
        key = f"schema_version:{module}"
        got = await _version(conn, key)
        if got > len(migrations):
            raise _too_new(where, key, got, len(migrations))
