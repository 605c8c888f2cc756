"""The store seam (issue 22, item 1): the built-in stores keep the store contract
(`stead.testing.check_store`, on both stores), the suite fails on stores that break a promise, stores are
found by URL scheme in the `stead.stores` entry point group, and their optional capabilities are typed
(`Store.capabilities`)."""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.store import (
    BUILTIN,
    NO_CAPABILITIES,
    STORE_GROUP,
    Capabilities,
    SqliteStore,
    Store,
    dialect_of,
    open_store,
    refresh_stores,
    store_class,
    store_schemes,
)
from stead.testing import check_store


async def test_the_built_in_store_keeps_the_store_contract(db_url: str) -> None:
    await check_store(lambda: open_store(db_url))


# ---------------------------------------------------------------------------------------------- broken stores
class _Tx:
    """A transaction passed through, except for what a subclass breaks."""

    def __init__(self, tx: Any, store: BrokenStore) -> None:
        self.tx = tx
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tx, name)


class EagerCallbacks(_Tx):
    def after_commit(self, fn: Callable[[], object]) -> None:
        fn()  # at once: before the commit, and even if it rolls back


class SavepointKeepsWrites(_Tx):
    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        yield  # re-raises, but rolls nothing back


class DeleteAlwaysTrue(_Tx):
    async def delete(self, agent_id: str, key: str) -> bool:
        await self.tx.delete(agent_id, key)
        return True


class PrefixUnsorted(_Tx):
    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        return list(reversed(await self.tx.read_prefix(agent_id, prefix)))


class PrefixUnbounded(_Tx):
    async def read_prefix(self, agent_id: str, prefix: str) -> list[tuple[str, str]]:
        return list(await self.tx.read_prefix(agent_id, prefix[:-1]))


class OldestFirst(_Tx):
    async def load_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[int, str]]:
        return sorted(await self.tx.load_before(agent_id, before, limit))


class ArchiveForgets(_Tx):
    async def archive_history(self, agent_id: str, compaction_id: str) -> int:
        n = len(await self.tx.load(agent_id))
        await self.tx.clear(agent_id)
        return n


class DeleteAgentKeepsHistory(_Tx):
    async def delete_agent(self, agent_id: str) -> bool:
        return bool(await self.tx.execute("DELETE FROM agents WHERE id = ?", (agent_id,)))


class BrokenStore:
    """A real store behind a broken transaction class (or a broken close)."""

    def __init__(self, inner: Store, tx_class: type[_Tx], *, close_works: bool = True) -> None:
        self.inner = inner
        self.tx_class = tx_class
        self.close_works = close_works
        self._open: dict[int, _Tx] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # url, dialect, ops, modules, capabilities

    def _wrap(self, tx: Any) -> _Tx:
        known = self._open.get(id(tx))
        if known is None or known.tx is not tx:
            known = self._open[id(tx)] = self.tx_class(tx, self)
        return known

    def current(self) -> _Tx | None:
        tx = self.inner.current()
        return None if tx is None else self._wrap(tx)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Tx]:
        async with self.inner.transaction() as tx:
            yield self._wrap(tx)

    async def close(self) -> None:
        if self.close_works:
            await self.inner.close()


BREAKAGES = [
    (EagerCallbacks, "after_commit: callbacks run before the outermost commit"),
    (SavepointKeepsWrites, "savepoints: a write of a rolled-back savepoint"),
    (DeleteAlwaysTrue, "kv: delete of an absent key must return False"),
    (PrefixUnsorted, r"kv: read_prefix\('q.send.'\)"),
    (PrefixUnbounded, r"kv: read_prefix\('q\.'\) keys"),
    (OldestFirst, r"history: load_before\(None, 2\) records \(newest first\)"),
    (ArchiveForgets, r"archive: load_archive"),
    (DeleteAgentKeepsHistory, "agents: history after delete_agent"),
]


@pytest.mark.parametrize(("broken", "message"), BREAKAGES, ids=[b.__name__ for b, _ in BREAKAGES])
async def test_the_contract_suite_fails_on_a_store_that_breaks_a_promise(
    db_path: Path, broken: type[_Tx], message: str
) -> None:
    url = f"sqlite:///{db_path}?synchronous=normal"

    async def factory() -> Any:
        return BrokenStore(await open_store(url), broken)

    with pytest.raises(AssertionError, match=f"^store contract, {message}"):
        await check_store(factory)
    await (await open_store(url)).close()  # the suite closed what it opened


async def test_the_contract_suite_fails_on_a_store_that_does_not_close(db_path: Path) -> None:
    url = f"sqlite:///{db_path}?synchronous=normal"
    opened: list[Store] = []

    async def factory() -> Any:
        for earlier in opened:  # as a database that more than one store may open would
            await earlier.close()
        store = await open_store(url)
        opened.append(store)
        return BrokenStore(store, _Tx, close_works=False)

    try:
        with pytest.raises(AssertionError, match=r"^store contract, close: a closed store still ran"):
            await check_store(factory)
    finally:
        for s in opened:
            await s.close()


async def test_a_store_error_is_raised_with_the_check_it_happened_in(db_path: Path) -> None:
    class Failing(_Tx):
        async def load_archive(self, agent_id: str) -> list[tuple[str, str]]:
            raise stead.StoreError("no archive here")

    url = f"sqlite:///{db_path}"
    with pytest.raises(stead.StoreError, match="no archive here") as caught:
        await check_store(lambda: _broken(url, Failing))
    assert any("check_archive" in note for note in caught.value.__notes__)


async def _broken(url: str, tx_class: type[_Tx]) -> Any:
    return BrokenStore(await open_store(url), tx_class)


# ---------------------------------------------------------------------------------------------- the registry
def test_the_built_in_stores_are_registered_by_entry_point() -> None:
    refresh_stores()
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=STORE_GROUP)}
    assert {k: eps.get(k) for k in BUILTIN} == dict(BUILTIN)  # pyproject.toml registers them (reinstalled)
    assert {k: store_schemes()[k] for k in BUILTIN} == dict(BUILTIN)
    assert store_class("sqlite:///x.db") is SqliteStore
    assert dialect_of("sqlite:///x.db") == "sqlite"
    assert dialect_of("postgresql://u@h/db") == dialect_of("postgres://u@h/db") == "postgresql"


@pytest.mark.parametrize("url", ["mysql://localhost/db", "stead.db", "", "://x", "SQLITE2:///x"])
def test_an_unknown_scheme_is_refused(url: str) -> None:
    with pytest.raises(stead.InvalidInput, match="unsupported store URL"):
        dialect_of(url)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "site"
    monkeypatch.syspath_prepend(str(path))
    yield path
    monkeypatch.undo()
    importlib.invalidate_caches()
    refresh_stores()


def _distribution(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{STORE_GROUP}]\n{entry_points}\n")
    importlib.invalidate_caches()
    refresh_stores()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_for_stead:Store", "cannot be imported"),
        ("stead.store.sqlite:NoSuchClass", "cannot be found"),
        ("stead.store.sqlite:parse_sqlite_url", "is not a store class"),
    ],
)
async def test_a_broken_registration_is_refused_with_its_cause(site: Path, target: str, message: str) -> None:
    _distribution(site, "stead_broken_store", f"broken = {target}")
    with pytest.raises(stead.InvalidInput, match=message):
        await open_store("broken:///x")


def test_two_packages_registering_one_scheme_are_refused(site: Path) -> None:
    _distribution(site, "stead_store_one", "twice = stead.store.sqlite:SqliteStore")
    _distribution(site, "stead_store_two", "twice = tests.outside.memo_store:MemoStore")
    with pytest.raises(stead.ConfigurationError, match="two packages register a store for twice://"):
        dialect_of("twice:///x")


# ---------------------------------------------------------------------------------------------- capabilities
async def test_capabilities_are_typed_and_declared_by_the_store(db_url: str, store_kind: str) -> None:
    store = await open_store(db_url)
    try:
        caps = store.capabilities
        assert isinstance(caps, Capabilities)
        if store_kind == "sqlite":
            assert caps is NO_CAPABILITIES and caps.owner_notify is None and caps.fleet is None
        else:  # PostgreSQL wakes owners in other processes and serves a worker fleet
            assert caps.owner_notify is store and caps.fleet is store
    finally:
        await store.close()


def test_the_kernel_never_probes_a_store_with_getattr() -> None:
    src = Path(stead.__file__).parent
    for rel in ("core/admission.py", "core/decide.py", "core/fleet.py", "core/runtime.py", "system.py"):
        text = (src / rel).read_text(encoding="utf-8")
        assert not re.search(r"getattr\((self\.)?(store|tx|env\.store)\b", text), rel
