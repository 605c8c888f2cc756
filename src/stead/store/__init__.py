"""Stores: the `Store` protocol and its implementations. `open_store(url)` picks one by URL scheme."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stead.errors import InvalidInput
from stead.store.base import AgentRow, Store, Tx
from stead.store.faults import Faults
from stead.store.sqlite import SqliteStore

__all__ = ["AgentRow", "Faults", "SqliteStore", "Store", "Tx", "dialect_of", "open_store"]


def dialect_of(url: str) -> str:
    """The SQL dialect of the store a URL names (`sqlite` or `postgresql`): which migrations it runs."""
    if url.startswith("sqlite:"):
        return "sqlite"
    if url.startswith(("postgresql:", "postgres:")):
        return "postgresql"
    raise InvalidInput(f"unsupported store URL {url!r}; use sqlite:///path/to/stead.db or postgresql://…")


async def open_store(
    url: str,
    *,
    faults: Faults | None = None,
    migrations: Mapping[str, Sequence[str]] | None = None,
    readonly: bool = False,
) -> Store:
    """Open the store named by `url` (`sqlite:///path.db[?synchronous=normal|full]`, or
    `postgresql://user@host:port/db[?pool_min=2&pool_max=10&pool_timeout=5]` with the `postgres` extra),
    applying the kernel's migrations and those of each higher-layer module in `migrations` (name → ordered
    SQL scripts).

    `readonly=True` opens it for inspection: no ownership lock, no creation, no migration, every write
    refused (`stead.errors.ReadOnly`), each transaction a fresh read snapshot."""
    if url.startswith("sqlite:"):
        return await SqliteStore.open(url, faults=faults, migrations=migrations, readonly=readonly)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from stead.store.postgres import PostgresStore
        except ImportError as e:  # psycopg is the optional `postgres` extra
            raise InvalidInput(
                f"PostgreSQL stores need psycopg ({e}); install stead[postgres] "
                "(pip install 'psycopg[binary]>=3.2' 'psycopg_pool>=3.2')"
            ) from None
        return await PostgresStore.open(url, faults=faults, migrations=migrations, readonly=readonly)
    raise InvalidInput(f"unsupported store URL {url!r}; use sqlite:///path/to/stead.db or postgresql://…")
