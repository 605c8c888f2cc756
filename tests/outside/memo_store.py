"""A third-party store, registered the way a package would register one: by its URL scheme (`memo`) in the
`stead.stores` entry point group (tests/outside/test_outside_store.py writes the `.dist-info` that says so).

`memo:///path/to/file.db[?synchronous=normal]` is a SQLite store that remembers, in memory, how many
transactions it committed — a toy, but one that speaks the `sqlite`
dialect (so plugins' SQLite migrations and SQL run on it) and keeps the store contract
(`stead.testing.check_store`). It is written against `stead.extend`'s `Store`/`Tx` protocols and the
built-in SQLite store it extends, through its public `open` only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import stead
from stead.extend import Tx
from stead.store.sqlite import SqliteStore

SCHEME = "memo"


class MemoStore(SqliteStore):
    """`memo:///file.db`: the SQLite store, counting its commits (`commits_seen`)."""

    commits_seen: int

    @classmethod
    async def open(cls, url: str, **options: Any) -> MemoStore:
        """`StoreClass.open`: the options (`faults`, `migrations`, `readonly`) go to the SQLite store."""
        if not url.startswith(f"{SCHEME}:"):
            raise stead.InvalidInput(f"not a {SCHEME} URL: {url!r}")
        store = await super().open("sqlite:" + url[len(SCHEME) + 1 :], **options)
        assert isinstance(store, MemoStore)
        store.url = url
        store.commits_seen = 0
        return store

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        return self._memo_transaction()

    @asynccontextmanager
    async def _memo_transaction(self) -> AsyncIterator[Tx]:
        outermost = self.current() is None
        async with super().transaction() as tx:
            yield tx
            if outermost:
                tx.after_commit(self._committed)

    def _committed(self) -> None:
        self.commits_seen += 1
