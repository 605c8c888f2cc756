"""An open store seam (issue 22, item 1): a third-party store (`tests/outside/memo_store.py`) registered the
real way — a distribution's `entry_points.txt` in the `stead.stores` group, found by `importlib.metadata`
on `sys.path` — is opened by `stead.open("memo:///…")` end to end, runs a plugin's migrations for the
dialect it declares, and passes the store contract suite `stead.testing.check_store`."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import stead
from stead.store import dialect_of, open_store, refresh_stores, store_schemes
from stead.testing import ScriptedProvider, check_store
from tests.outside.audit_plugin import AuditPlugin
from tests.outside.memo_store import MemoStore

TIMEOUT = 10.0


def install_distribution(site: Path, name: str, entry_points: str) -> None:
    """What `pip install` leaves behind for a package declaring entry points (no code: the package's
    module is importable already)."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def memo_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    site = tmp_path / "site-packages"
    install_distribution(
        site, "stead_memo_store", "[stead.stores]\nmemo = tests.outside.memo_store:MemoStore\n"
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    refresh_stores()
    yield
    monkeypatch.undo()
    importlib.invalidate_caches()
    refresh_stores()


def memo_url(tmp_path: Path) -> str:
    return f"memo:///{tmp_path}/memo.db?synchronous=normal"


def test_without_the_distribution_the_scheme_is_unsupported(tmp_path: Path) -> None:
    refresh_stores()
    assert "memo" not in store_schemes()
    with pytest.raises(stead.InvalidInput, match="unsupported store URL"):
        dialect_of(memo_url(tmp_path))


async def test_an_entry_point_registers_the_store_by_its_scheme(memo_installed: None, tmp_path: Path) -> None:
    assert store_schemes()["memo"] == "tests.outside.memo_store:MemoStore"
    assert store_schemes()["sqlite"] == "stead.store.sqlite:SqliteStore"  # the built-ins stay
    assert dialect_of(memo_url(tmp_path)) == "sqlite"  # what the store class declares
    store = await open_store(memo_url(tmp_path))
    try:
        assert isinstance(store, MemoStore) and store.url == memo_url(tmp_path)
    finally:
        await store.close()


async def test_stead_open_runs_an_agent_on_the_outside_store(memo_installed: None, tmp_path: Path) -> None:
    url = memo_url(tmp_path)
    scripted = ScriptedProvider(lambda request: [stead.Text(f"heard {request.messages[-1].text}")])
    async with stead.open(url, providers={"scripted": scripted}) as system:
        assert isinstance(system.store, MemoStore)
        agent = await system.create(provider="scripted", model="m")
        result = await agent.run("hello", id="m1")
        assert result.text == "heard hello" and result.outcome == "completed"
        await agent.send("again")
        await agent.wait_idle(timeout=TIMEOUT)
        assert system.store.commits_seen > 0  # the outside store's own behaviour ran
        agent_id = agent.id
    async with stead.open(url, providers={"scripted": scripted}) as system:  # durable across a reopen
        agent = await system.get(agent_id)
        assert [m.text for m in await agent.history()] == ["hello", "heard hello", "again", "heard again"]
        assert (await agent.run("hello", id="m1")).text == "heard hello"  # the same run: not sent again
    async with stead.open(url, readonly=True) as inspector:
        assert [a.id for a in await inspector.agents()] == [agent_id]


async def test_a_plugins_migrations_follow_the_dialect_the_store_declares(
    memo_installed: None, tmp_path: Path
) -> None:
    async with stead.open(memo_url(tmp_path), plugins=[AuditPlugin()]) as system:
        agent = await system.create(provider="echo", tools=["audit_count"])
        await agent.send("hello")
        await agent.wait_idle(timeout=TIMEOUT)
        assert (await agent.history())[-1].text == "audit rows: 1"  # its SQLite table, on the memo store
        assert "audit" in system.store.modules


async def test_the_outside_store_keeps_the_store_contract(memo_installed: None, tmp_path: Path) -> None:
    await check_store(lambda: open_store(memo_url(tmp_path)))
