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
    raise InvalidInput(f"unsupported store URL {url!r}; use sqlite:///path/to/stead.db")


async def open_store(
    url: str,
    *,
    faults: Faults | None = None,
    migrations: Mapping[str, Sequence[str]] | None = None,
    readonly: bool = False,
) -> SqliteStore:
    """Open the store named by `url` (`sqlite:///path.db[?synchronous=normal|full]`), applying the kernel's
    migrations and those of each higher-layer module in `migrations` (name → ordered SQL scripts).

    `readonly=True` opens it for inspection: no ownership lock, no creation, no migration, every write
    refused (`stead.errors.ReadOnly`), each transaction a fresh read snapshot."""
    if url.startswith("sqlite:"):
        return await SqliteStore.open(url, faults=faults, migrations=migrations, readonly=readonly)
    if url.startswith(("postgresql:", "postgres:")):
        raise InvalidInput("PostgreSQL stores are not available yet in this version; use sqlite:///file.db")
    raise InvalidInput(f"unsupported store URL {url!r}; use sqlite:///path/to/stead.db")
