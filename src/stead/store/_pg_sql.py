"""SQL text and errors between stead's layers and PostgreSQL.

Higher layers write their SQL once with SQLite's `?` placeholders; psycopg binds `%s`. `translate` turns
each `?` outside string literals, quoted identifiers and comments into `%s`, and doubles every literal `%`
(psycopg reads `%` anywhere in a query with parameters, inside literals too). Translations are cached: the
same few hundred statements run over and over.

`store_error` maps a psycopg failure to stead's error tree: the fence (SQLSTATE `SL001`) is `LeaseLost`,
never retried; deadlocks, serialization failures, lock timeouts, lost connections and an exhausted pool are
transient `StoreError`s (the transaction had no durable effect; the kernel retries).
"""

from __future__ import annotations

from functools import lru_cache

import psycopg
from psycopg import errors as pg_errors

from stead.errors import LeaseLost, StoreError

__all__ = ["FENCE_SQLSTATE", "TRANSIENT_SQLSTATES", "find_lease_lost", "store_error", "translate"]

FENCE_SQLSTATE = "SL001"
"""Raised by `stead_fence(agent, epoch)` when the agent's epoch moved: the lease is lost."""

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "08000"})
"""Serialization failure, deadlock, lock not available, statement timeout/cancel, admin/crash shutdown,
cannot connect now, connection exception: retrying the whole transaction may succeed."""


@lru_cache(maxsize=2048)
def translate(sql: str) -> str:
    """`?` → `%s` outside quotes and comments; every `%` → `%%`."""
    if "?" not in sql and "%" not in sql:
        return sql
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "%":
            out.append("%%")
            i += 1
        elif c == "?":
            out.append("%s")
            i += 1
        elif c in ("'", '"'):
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:  # '' or "" escapes the quote
                        j += 2
                        continue
                    break
                j += 1
            out.append(sql[i : j + 1].replace("%", "%%"))
            i = j + 1
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(sql[i:j].replace("%", "%%"))
            i = j
        elif c == "/" and sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(sql[i:j].replace("%", "%%"))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def find_lease_lost(error: BaseException) -> LeaseLost | None:
    """`LeaseLost` when `error` (or what caused it) is the fence's SL001."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, LeaseLost):
            return e
        if isinstance(e, psycopg.Error) and e.sqlstate == FENCE_SQLSTATE:
            diag = e.diag.message_primary or str(e)
            agent = diag.split("lease lost: ", 1)[1] if "lease lost: " in diag else None
            return LeaseLost(
                f"lease lost on agent {agent!r}: another worker owns it now (its epoch moved); "
                "this process must stop running it",
                agent,
            )
        e = e.__cause__ or e.__context__
    return None


def store_error(error: BaseException, what: str) -> StoreError:
    """A psycopg (or pool) failure as a stead `StoreError` saying what failed."""
    lost = find_lease_lost(error)
    if lost is not None:
        return lost
    if isinstance(error, StoreError):
        return error
    from psycopg_pool import PoolTimeout

    if isinstance(error, PoolTimeout):
        return StoreError(f"{what}: no PostgreSQL connection free in the pool ({error}); retry later")
    if isinstance(error, pg_errors.UniqueViolation):
        return StoreError(f"{what}: {error.diag.message_primary or error}")
    if isinstance(error, psycopg.OperationalError) and not isinstance(error, psycopg.DatabaseError):
        return StoreError(
            f"{what}: PostgreSQL connection failed ({_line(error)}); the outcome may be unknown"
        )
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate in TRANSIENT_SQLSTATES or isinstance(error, psycopg.OperationalError):
        return StoreError(f"{what}: {_line(error)} (transient; retry)")
    return StoreError(f"{what}: {_line(error)}")


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
