"""Stores: the `Store` protocol and its implementations. `open_store(url)` picks one by URL scheme.

Store implementations are registered by URL scheme in the entry point group `stead.stores` (entry name:
the scheme, value: `module:Class`, a `StoreClass`); stead registers its own the same way (`sqlite`,
`postgresql`, `postgres`), and a source checkout whose metadata is stale still finds them (`BUILTIN`).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, cast

from stead.errors import ConfigurationError, InvalidInput
from stead.store.base import (
    NO_CAPABILITIES,
    AgentRow,
    Capabilities,
    FleetLease,
    OwnerNotify,
    Store,
    StoreClass,
    Tx,
)
from stead.store.faults import Faults
from stead.store.sqlite import SqliteStore

__all__ = [
    "BUILTIN",
    "NO_CAPABILITIES",
    "STORE_GROUP",
    "AgentRow",
    "Capabilities",
    "Faults",
    "FleetLease",
    "OwnerNotify",
    "SqliteStore",
    "Store",
    "StoreClass",
    "Tx",
    "dialect_of",
    "open_store",
    "refresh_stores",
    "store_class",
    "store_schemes",
]

STORE_GROUP = "stead.stores"
"""The entry point group of store implementations: entry name = URL scheme, value = `module:Class`."""
BUILTIN: Mapping[str, str] = {
    "sqlite": "stead.store.sqlite:SqliteStore",
    "postgresql": "stead.store.postgres:PostgresStore",
    "postgres": "stead.store.postgres:PostgresStore",
}
"""stead's own stores (also registered as entry points in its package metadata)."""
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")


def _unsupported(url: str) -> InvalidInput:
    others = sorted(set(store_schemes()) - set(BUILTIN))
    more = f" (or a registered store: {', '.join(s + '://…' for s in others)})" if others else ""
    return InvalidInput(
        f"unsupported store URL {url!r}; use sqlite:///path/to/stead.db or postgresql://…{more}"
    )


@functools.cache
def store_schemes() -> dict[str, str]:
    """URL scheme → `module:attribute` of the store class it names: the `stead.stores` entry points over
    the built-in table (read once; `refresh_stores()` reads them again)."""
    found: dict[str, set[str]] = {}
    for ep in entry_points(group=STORE_GROUP):
        found.setdefault(ep.name, set()).add(ep.value.replace(" ", ""))
    out = dict(BUILTIN)
    for scheme, values in found.items():
        if len(values) > 1:
            raise ConfigurationError(
                f"two packages register a store for {scheme}:// URLs ({', '.join(sorted(values))}) "
                f"in the {STORE_GROUP} entry point group; uninstall one"
            )
        out[scheme] = values.pop()
    return out


_classes: dict[str, StoreClass] = {}


def refresh_stores() -> None:
    """Forget what was read of the `stead.stores` entry points (a package was installed meanwhile)."""
    store_schemes.cache_clear()
    _classes.clear()


def store_class(url: str) -> StoreClass:
    """The registered store class for `url`'s scheme (imported once). `InvalidInput` when no store
    serves that scheme or its implementation cannot be imported."""
    m = _SCHEME.match(url)
    scheme = m.group(1) if m else ""
    found = _classes.get(scheme)
    if found is not None:
        return found
    target = store_schemes().get(scheme) if scheme else None
    if target is None:
        raise _unsupported(url)
    module, _, attr = target.partition(":")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
    except ImportError as e:
        if module == "stead.store.postgres":  # psycopg is the optional `postgres` extra
            raise InvalidInput(
                f"PostgreSQL stores need psycopg ({e}); install stead[postgres] "
                "(pip install 'psycopg[binary]>=3.2' 'psycopg_pool>=3.2')"
            ) from None
        raise InvalidInput(f"the store for {scheme}:// URLs ({target}) cannot be imported: {e}") from None
    except AttributeError as e:
        raise InvalidInput(f"the store for {scheme}:// URLs ({target}) cannot be found: {e}") from None
    if not isinstance(getattr(obj, "dialect", None), str) or not callable(getattr(obj, "open", None)):
        raise InvalidInput(
            f"the store for {scheme}:// URLs ({target}) is not a store class: it needs a `dialect` "
            "string and an async `open(url, *, faults, migrations, readonly)`"
        )
    cls = cast(StoreClass, obj)
    _classes[scheme] = cls
    return cls


def dialect_of(url: str) -> str:
    """The SQL dialect of the store a URL names (what its registered class declares: `sqlite`,
    `postgresql`, …): which migrations it runs."""
    return store_class(url).dialect


async def open_store(
    url: str,
    *,
    faults: Faults | None = None,
    migrations: Mapping[str, Sequence[str]] | None = None,
    readonly: bool = False,
) -> Store:
    """Open the store named by `url` (`sqlite:///path.db[?synchronous=normal|full]`, or
    `postgresql://user@host:port/db[?pool_min=2&pool_max=10&pool_timeout=5]` with the `postgres` extra, or
    a store a package registers for its scheme), applying the kernel's migrations and those of each
    higher-layer module in `migrations` (name → ordered SQL scripts).

    `readonly=True` opens it for inspection: no ownership lock, no creation, no migration, every write
    refused (`stead.errors.ReadOnly`), each transaction a fresh read snapshot."""
    cls = store_class(url)
    return await cls.open(url, faults=faults, migrations=migrations, readonly=readonly)


if TYPE_CHECKING:  # the built-ins are what the registry promises (checked by mypy; nothing at run time)
    from stead.store.postgres import PostgresStore

    _SQLITE: StoreClass = SqliteStore
    _POSTGRES: StoreClass = PostgresStore
