"""A throwaway PostgreSQL database for the test session, and a fresh schema per test.

The session creates `stead_test_<random>` on the local server (`STEAD_TEST_PG_ADMIN`, default
`postgresql://postgres@127.0.0.1:5432/postgres`: trust auth as in CI) and drops it at the end; nothing
relies on leftovers. Each test that asks for a PostgreSQL store gets its own schema in that database
(creating a schema costs a millisecond, a database a few hundred): its URL names the schema through libpq's
`options=-csearch_path=<schema>`, so subprocesses given the URL see exactly the same tables. The session
database's URL is exported as `STEAD_TEST_PG_URL` for tests and tools that want their own schemas.

When no server answers, the PostgreSQL parametrizations are skipped with the reason (CI starts the server:
`.ci/run`).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from pathlib import Path
from urllib.parse import quote

import psycopg

__all__ = ["PgTestServer", "admin_url", "raw_rows"]


def admin_url() -> str:
    return os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


class PgTestServer:
    """The session's database on the local server; `schema_url()` makes an isolated schema."""

    def __init__(self) -> None:
        self.admin = admin_url()
        self.database: str | None = None
        self.url: str | None = None
        self.error: str | None = None
        self._schemas: dict[str, str] = {}  # url -> schema

    def start(self) -> None:
        try:
            with psycopg.connect(self.admin, autocommit=True, connect_timeout=3) as conn:
                name = f"stead_test_{secrets.token_hex(4)}"
                conn.execute(f'CREATE DATABASE "{name}"'.encode())
        except psycopg.Error as e:
            self.error = (
                f"no PostgreSQL server for the tests at {self.admin}: {str(e).strip().splitlines()[0]}"
            )
            return
        self.database = name
        base, _, _ = self.admin.rpartition("/")
        self.url = f"{base}/{name}"
        os.environ["STEAD_TEST_PG_URL"] = self.url

    def schema_url(self, **options: str) -> str:
        """A fresh, empty schema; the URL of the session database with that schema as its search path."""
        assert self.url is not None
        schema = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(b"SET synchronous_commit = off")
            conn.execute(f"CREATE SCHEMA {schema}".encode())
        # like the SQLite tests' synchronous=normal: commits are visible to every session at once, only a
        # crash of the server itself could lose the last ones
        query = "options=" + quote(f"-csearch_path={schema} -csynchronous_commit=off")
        for k, v in options.items():
            query += f"&{k}={quote(v)}"
        url = f"{self.url}?{query}"
        self._schemas[url] = schema
        return url

    def drop_schema(self, url: str) -> None:
        schema = self._schemas.pop(url)
        try:
            with psycopg.connect(self.url or "", autocommit=True) as conn:
                conn.execute(b"SET lock_timeout = '5s'")
                conn.execute(b"SET synchronous_commit = off")
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
        except psycopg.Error:  # pragma: no cover - a test left a session holding locks; the db drop cleans up
            pass

    def stop(self) -> None:
        if self.database is None:
            return
        os.environ.pop("STEAD_TEST_PG_URL", None)
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'.encode())
        self.database = None


def raw_rows(db: Path | str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run `sql` (`?` placeholders) on a fresh connection of its own, outside any store, and commit: what
    another process sees. `db` is a SQLite file path or a PostgreSQL URL (the `db_target` fixture)."""
    if isinstance(db, str) and db.startswith(("postgresql:", "postgres:")):
        from stead.store._pg_sql import translate

        with psycopg.connect(db, autocommit=True) as conn:
            cur = conn.execute(translate(sql).encode(), params)
            return list(cur.fetchall()) if cur.description is not None else []
    conn3 = sqlite3.connect(db)
    try:
        rows = list(conn3.execute(sql, params))
        conn3.commit()
        return rows
    finally:
        conn3.close()
