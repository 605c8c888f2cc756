"""`stead.open(url, readonly=True)`: inspection while another process owns the store (issue 9, items 2-4, 7).

An inspector takes no lock, never creates, migrates or restores, never calls a model, refuses every write
with `stead.errors.ReadOnly`, and sees every change the owner commits (a fresh read transaction per read).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import stead
from stead.errors import ReadOnly
from stead.providers.scripted import ScriptedProvider
from stead.store.sqlite import SqliteStore
from tests.fakes.postgres import raw_rows
from tests.fakes.slow_owner import AGENT_ID, ANSWER, MESSAGE_ID, QUESTION, SlowOwner

TIMEOUT = 10.0


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def texts(messages: list[stead.Message]) -> list[str]:
    return [m.text for m in messages if m.text]


async def test_readonly_inspector_sees_every_commit_of_a_running_owner(db_path: Path) -> None:
    """Item 2: two inspectors read a store while its owner (another process) is inside a slow tool call,
    then see the owner's later commits through the same open system."""
    url = f"sqlite:///{db_path}"
    with SlowOwner(url) as owner:
        owner.wait_for("tool-started")
        async with stead.open(url, readonly=True) as one, stead.open(url, readonly=True) as two:
            (info,) = await one.agents()
            assert (info.id, info.name, info.active) == (AGENT_ID, "slowpoke", True)
            agent = await two.get(AGENT_ID)
            history = await agent.history()
            assert [m.role for m in history] == ["user", "assistant"]
            assert history[0].id == MESSAGE_ID and history[0].text == QUESTION
            (run,) = await one.runs()
            assert run.status == "running" and run.agent_id == AGENT_ID
            tree = await two.run(run.id)
            assert [s.type for s in tree.steps][:1] == ["prompt"]
            with pytest.raises(stead.StoreLocked, match=r"pid \d+"):
                await stead.open(url)  # the owner still owns it; the message names its pid

            owner.go_on()  # the tool returns; the owner finishes the turn
            owner.wait_for("idle")
            (info,) = await one.agents()
            assert info.active is False
            assert texts(await agent.history())[-1] == ANSWER
            (run,) = await two.runs()
            assert run.status == "completed" and run.final_message == ANSWER
        owner.go_on()  # the owner closes the store and exits


async def _owing_store(url: str) -> str:
    """A store whose only agent owes work (its process died before the model answered)."""
    hang = ScriptedProvider(lambda r: asyncio.Event().wait())  # type: ignore[arg-type, return-value]
    system = await stead.open(url, providers={"p": hang})
    agent = await system.create(provider="p", model="m", name="owing")
    await agent.send("hello")
    system.abandon()
    await system.store.close()
    return agent.id


async def test_readonly_never_restores_never_calls_a_model_and_refuses_writes(db_url: str) -> None:
    """Item 2: no restore, no model call, every write refused with ReadOnly (a StoreError)."""
    aid = await _owing_store(db_url)
    provider = ScriptedProvider(lambda r: [stead.Text("should never run")])
    async with stead.open(db_url, providers={"p": provider}, readonly=True) as system:
        assert system.readonly and system.restored == []
        (info,) = await system.agents()
        assert info.id == aid and info.active is True
        agent = await system.get(aid)
        with pytest.raises(ReadOnly, match="readonly=True"):
            await agent.send("more")
        with pytest.raises(ReadOnly):
            await agent.steer("more")
        with pytest.raises(ReadOnly):
            await agent.deliver([stead.Input("more")])
        with pytest.raises(ReadOnly):
            await system.create(provider="p", model="m")
        with pytest.raises(ReadOnly):
            await system.get(aid, resume=True)
        with pytest.raises(ReadOnly):
            await system.delete(aid)
        async with system.store.transaction() as tx:
            with pytest.raises(ReadOnly):
                await tx.write(aid, "x", "y")
            with pytest.raises(ReadOnly):
                await tx.execute("DELETE FROM agents")
        assert issubclass(ReadOnly, stead.StoreError)
        assert provider.requests == []
    async with stead.open(db_url, providers={"p": provider}, restore=False) as system:
        assert [a.active for a in await system.agents()] == [True]  # nothing was written


async def test_open_logs_the_agents_it_resumed(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Item 4: opening as the owner resumes agents that owe work, and says so (INFO, stead.system)."""
    aid = await _owing_store(db_url)
    provider = ScriptedProvider(lambda r: [stead.Text("resumed")])
    with caplog.at_level(logging.INFO, logger="stead.system"):
        async with stead.open(db_url, providers={"p": provider}) as system:
            await (await system.get(aid)).wait_idle(TIMEOUT)
    (record,) = [r for r in caplog.records if r.name == "stead.system" and "resumed" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == f"resumed 1 agent(s) that owe work: {aid} (owing)"


async def test_open_is_an_async_context_manager_without_await(db_url: str) -> None:
    """Item 7: `async with stead.open(...)` (no await) opens and closes; the awaited form still works."""
    async with stead.open(db_url) as system:
        assert isinstance(system, stead.AgentSystem) and not system.closing
    assert system.closing
    async with await stead.open(db_url) as again:
        assert not again.closing
    assert again.closing
    system = await stead.open(db_url)
    await system.close()


def _write_meta(path: Path, version: int) -> None:
    raw_rows(path, "UPDATE stead_meta SET value=? WHERE key='schema_version'", (str(version),))


async def test_readonly_never_creates_or_migrates(tmp_path: Path) -> None:
    """Item 3: a missing file, another application's database and a newer stead's store are refused with
    one line naming the file; none of them is created or altered."""
    missing = tmp_path / "typo.db"
    with pytest.raises(stead.StoreError, match=f"{missing}: no such database file"):
        await stead.open(f"sqlite:///{missing}", readonly=True)
    assert names(tmp_path) == []

    other = tmp_path / "other.db"
    raw_rows(other, "CREATE TABLE invoices(id INTEGER)")  # another application's database
    before = other.read_bytes()
    with pytest.raises(stead.StoreError, match=f"{other} is not a stead store .*tables: invoices"):
        await stead.open(f"sqlite:///{other}", readonly=True)
    with pytest.raises(stead.StoreError, match="is not a stead store"):
        await stead.open(f"sqlite:///{other}")  # an owner does not take it over either
    assert other.read_bytes() == before
    assert names(tmp_path) == ["other.db"]  # no lock file left next to it

    newer = tmp_path / "newer.db"
    await (await stead.open(f"sqlite:///{newer}")).close()
    _write_meta(newer, 99)
    with pytest.raises(stead.SchemaTooNew, match=f"{newer} has schema version 99"):
        await stead.open(f"sqlite:///{newer}", readonly=True)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"hello, not a database " * 100), "is not a SQLite database"),
        (lambda p: p.mkdir(), "is a directory, not a database file"),
    ],
    ids=["not-a-database", "a-directory"],
)
async def test_unopenable_files_are_one_clear_error(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "x.db"
    make(path)  # type: ignore[operator]
    for readonly in (True, False):
        with pytest.raises(stead.StoreError) as info:
            await stead.open(f"sqlite:///{path}", readonly=readonly)
        assert str(info.value).startswith(str(path)) and message in str(info.value)
        assert "\n" not in str(info.value)


async def test_a_corrupted_store_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    await (await stead.open(f"sqlite:///{path}")).close()
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page
    path.write_bytes(bytes(data))
    for readonly in (True, False):
        with pytest.raises(stead.StoreError, match=f"{path} is (corrupted|not a SQLite database)"):
            await stead.open(f"sqlite:///{path}", readonly=readonly)


async def test_readonly_store_reads_in_fresh_transactions(db_path: Path) -> None:
    """Each `transaction()` of a read-only store is its own read snapshot, so commits made by the owner
    between two of them are seen by the second."""
    owner = await SqliteStore.open(f"sqlite:///{db_path}")
    reader = await SqliteStore.open(f"sqlite:///{db_path}", readonly=True)
    try:
        async with owner.transaction() as tx:
            await tx.write("a", "k", "1")
        async with reader.transaction() as rtx:
            assert await rtx.get("a", "k") == "1"
        async with owner.transaction() as tx:
            await tx.write("a", "k", "2")
        async with reader.transaction() as rtx:
            assert await rtx.get("a", "k") == "2"
    finally:
        await reader.close()
        await owner.close()
