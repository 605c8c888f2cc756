"""The store contract (docs/architecture.md), tested on the SQLite store directly."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import stead
from stead.store import Faults, open_store
from stead.store.base import AgentRow
from stead.store.sqlite import SCHEMA_VERSION, SqliteStore
from tests.fakes.postgres import raw_rows

A = "agentaaaaaaaaaaaaaaaaaaa"
B = "agentbbbbbbbbbbbbbbbbbbb"


class Boom(Exception):
    pass


def raw_kv(db: Path | str, agent_id: str = A) -> dict[str, str]:
    """What another connection sees: only committed data."""
    rows = raw_rows(db, "SELECT key, value FROM kv WHERE agent_id=? ORDER BY key", (agent_id,))
    return {str(k): str(v) for k, v in rows}


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[SqliteStore]:
    s = await open_store(db_url)
    yield s
    await s.close()


# ---------------------------------------------------------------------------------------------- transactions
async def test_transaction_commits_atomically(store: SqliteStore, db_target: Path | str) -> None:
    async with store.transaction() as tx:
        await tx.write(A, "k1", "v1")
        await tx.write(A, "k2", "v2")
        assert raw_kv(db_target) == {}  # nothing is visible before the commit
    assert raw_kv(db_target) == {"k1": "v1", "k2": "v2"}


async def test_transaction_rolls_back_everything_on_error(store: SqliteStore, db_target: Path | str) -> None:
    with pytest.raises(Boom):
        async with store.transaction() as tx:
            await tx.write(A, "k1", "v1")
            await tx.append(A, ["r1"])
            assert await tx.insert_agent(AgentRow(A, None, "{}", 0.0))
            raise Boom
    assert raw_kv(db_target) == {}
    async with store.transaction() as tx:
        assert await tx.load(A) == []
        assert await tx.get_agent(A) is None


async def test_nested_transaction_joins_the_outer_one(store: SqliteStore, db_target: Path | str) -> None:
    async with store.transaction() as outer:
        assert store.current() is outer
        async with store.transaction() as inner:
            assert inner is outer
            await inner.write(A, "k", "v")
        assert raw_kv(db_target) == {}  # the inner exit did not commit
        assert await outer.get(A, "k") == "v"
    assert raw_kv(db_target) == {"k": "v"}
    assert store.current() is None


async def test_failure_in_a_nested_transaction_rolls_back_the_outer_one(
    store: SqliteStore, db_target: Path | str
) -> None:
    with pytest.raises(Boom):
        async with store.transaction() as outer:
            await outer.write(A, "outer", "1")
            async with store.transaction() as inner:
                await inner.write(A, "inner", "1")
                raise Boom
    assert raw_kv(db_target) == {}


async def test_after_commit_runs_only_after_the_outermost_commit(
    store: SqliteStore, db_target: Path | str
) -> None:
    ran: list[str] = []
    async with store.transaction() as outer:
        outer.after_commit(lambda: ran.append("outer"))
        async with store.transaction() as inner:
            await inner.write(A, "k", "v")
            inner.after_commit(lambda: ran.append("inner"))
        assert ran == []
    assert ran == ["outer", "inner"]  # in registration order, once
    assert raw_kv(db_target) == {"k": "v"}


async def test_after_commit_never_runs_when_the_commit_fails(db_url: str) -> None:
    faults = Faults()
    store = await open_store(db_url, faults=faults)
    ran: list[str] = []
    try:
        with pytest.raises(stead.StoreError):
            async with store.transaction() as tx:
                await tx.write(A, "k", "v")
                tx.after_commit(lambda: ran.append("callback"))
                faults.flaky = 1.0  # the commit operation fails
        faults.flaky = 0.0
        assert ran == []
        async with store.transaction() as tx:
            assert await tx.get(A, "k") is None
    finally:
        await store.close()


async def test_failing_after_commit_callback_is_logged_not_raised(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def bad() -> None:
        raise RuntimeError("callback bug")

    with caplog.at_level(logging.ERROR):
        async with store.transaction() as tx:
            await tx.write(A, "k", "v")
            tx.after_commit(bad)
            tx.after_commit(lambda: ran.append("next"))
    assert ran == ["next"]
    assert "after-commit callback failed" in caplog.text


async def test_savepoint_rollback_drops_its_writes_and_callbacks(
    store: SqliteStore, db_target: Path | str
) -> None:
    ran: list[str] = []
    async with store.transaction() as tx:
        await tx.write(A, "before", "1")
        tx.after_commit(lambda: ran.append("before"))
        with pytest.raises(Boom):
            async with tx.savepoint():
                await tx.write(A, "inside", "1")
                await tx.append(A, ["inside"])
                tx.after_commit(lambda: ran.append("inside"))
                raise Boom
        assert await tx.get(A, "inside") is None
        async with tx.savepoint():
            await tx.write(A, "kept", "1")
            tx.after_commit(lambda: ran.append("kept"))
        tx.after_commit(lambda: ran.append("after"))
    assert ran == ["before", "kept", "after"]
    assert raw_kv(db_target) == {"before": "1", "kept": "1"}
    async with store.transaction() as tx:
        assert await tx.load(A) == []


async def test_transactions_of_concurrent_tasks_are_serialized(store: SqliteStore) -> None:
    first_wrote = asyncio.Event()
    finish_first = asyncio.Event()
    seen: list[str | None] = []

    async def first() -> None:
        async with store.transaction() as tx:
            await tx.write(A, "k", "first")
            first_wrote.set()
            await finish_first.wait()

    async def second() -> None:
        async with store.transaction() as tx:
            seen.append(await tx.get(A, "k"))

    t1 = asyncio.create_task(first())
    await first_wrote.wait()
    t2 = asyncio.create_task(second())
    for _ in range(5):
        await asyncio.sleep(0)
    assert seen == []  # the second transaction waits for the first
    assert store.current() is None  # another task's transaction is not this task's
    finish_first.set()
    await asyncio.wait_for(asyncio.gather(t1, t2), 5)
    assert seen == ["first"]


# ---------------------------------------------------------------------------------------------- KV
async def test_kv_write_get_and_overwrite(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        assert await tx.get(A, "k") is None
        await tx.write(A, "k", "1")
        await tx.write(A, "k", "2")
        assert await tx.get(A, "k") == "2"
        assert await tx.get(B, "k") is None  # per agent


async def test_kv_write_if_absent_reports_whether_it_wrote(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        assert await tx.write_if_absent(A, "k", "first")
        assert not await tx.write_if_absent(A, "k", "second")
        assert await tx.get(A, "k") == "first"
        assert await tx.write_if_absent(B, "k", "other agent")
    async with store.transaction() as tx:
        assert not await tx.write_if_absent(A, "k", "third")


async def test_kv_read_prefix_is_sorted_by_key_and_bounded_by_the_prefix(store: SqliteStore) -> None:
    keys = ["q.send.3", "q.send.1", "q.steer.2", "q.send.10", "q", "qa", "q.send.2", "r.send.1"]
    async with store.transaction() as tx:
        for k in keys:
            await tx.write(A, k, k.upper())
        await tx.write(B, "q.send.0", "other agent")
        sends = await tx.read_prefix(A, "q.send.")
        assert sends == [(k, k.upper()) for k in sorted(k for k in keys if k.startswith("q.send."))]
        assert [k for k, _ in await tx.read_prefix(A, "q.")] == sorted(k for k in keys if k.startswith("q."))
        assert [k for k, _ in await tx.read_prefix(A, "")] == sorted(keys)
        assert await tx.read_prefix(A, "zzz") == []


async def test_kv_last_key(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        assert await tx.last_key(A, "q.") is None
        for k in ["q.a", "q.c", "q.b", "r.z"]:
            await tx.write(A, k, "")
        assert await tx.last_key(A, "q.") == "q.c"
        assert await tx.last_key(B, "q.") is None


async def test_kv_delete_and_delete_prefix(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        for k in ["kv.c.1.a", "kv.c.1.b", "kv.c.10.a", "kv.c.2.a", "pending"]:
            await tx.write(A, k, "x")
        await tx.write(B, "kv.c.1.a", "x")
        assert await tx.delete(A, "pending")
        assert not await tx.delete(A, "pending")  # reports whether it existed (a delete can arbitrate)
        assert await tx.delete_prefix(A, "kv.c.1.") == 2
        assert [k for k, _ in await tx.read_prefix(A, "")] == ["kv.c.10.a", "kv.c.2.a"]
        assert await tx.get(B, "kv.c.1.a") == "x"
        assert await tx.delete_prefix(A, "nothing.") == 0


# ---------------------------------------------------------------------------------------------- history
async def test_history_append_load_and_clear(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        await tx.append(A, ["r1", "r2"])
        await tx.append(A, [])
        await tx.append(B, ["b1"])
    async with store.transaction() as tx:
        await tx.append(A, ["r3"])
        assert await tx.load(A) == ["r1", "r2", "r3"]
        assert await tx.load(B) == ["b1"]
    async with store.transaction() as tx:
        await tx.clear(A)
        assert await tx.load(A) == []
        await tx.append(A, ["after clear"])
    async with store.transaction() as tx:
        assert await tx.load(A) == ["after clear"]
        assert await tx.load(B) == ["b1"]


async def test_history_append_rolled_back_leaves_no_gap(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        await tx.append(A, ["r1"])
    with pytest.raises(Boom):
        async with store.transaction() as tx:
            await tx.append(A, ["lost"])
            raise Boom
    async with store.transaction() as tx:
        await tx.append(A, ["r2"])
    async with store.transaction() as tx:
        assert await tx.load(A) == ["r1", "r2"]


async def test_agents_table(store: SqliteStore) -> None:
    async with store.transaction() as tx:
        assert await tx.insert_agent(AgentRow(A, "a", "{}", 1.0))
        assert not await tx.insert_agent(AgentRow(A, "dup", "{}", 2.0))
        assert await tx.insert_agent(AgentRow(B, None, "{}", 2.0))
        await tx.write(B, "pending", "{}")
        await tx.append(A, ["r"])
        assert await tx.get_agent(A) == AgentRow(A, "a", "{}", 1.0)
        assert [(r.id, active) for r, active in await tx.list_agents()] == [(A, False), (B, True)]
        assert [(r.id, p) for r, p in await tx.agents_owing_work()] == [(B, "{}")]
        assert await tx.delete_agent(A)
        assert not await tx.delete_agent(A)
        assert await tx.load(A) == []


# ---------------------------------------------------------------------------------------------- schema
def meta(db: Path | str) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw_rows(db, "SELECT key, value FROM stead_meta")}


async def test_schema_version_is_recorded_on_open(db_url: str, db_target: Path | str) -> None:
    store = await open_store(db_url)
    async with store.transaction() as tx:
        await tx.write(A, "k", "v")
    await store.close()
    assert meta(db_target)["schema_version"] == str(SCHEMA_VERSION)
    store = await open_store(db_url)  # reopening migrates nothing and keeps the data
    async with store.transaction() as tx:
        assert await tx.get(A, "k") == "v"
    await store.close()
    assert meta(db_target)["schema_version"] == str(SCHEMA_VERSION)


async def test_a_newer_schema_refuses_to_open(db_url: str, db_target: Path | str) -> None:
    store = await open_store(db_url)
    await store.close()
    raw_rows(
        db_target, "UPDATE stead_meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    with pytest.raises(stead.SchemaTooNew, match=str(SCHEMA_VERSION + 1)):
        await open_store(db_url)
    with pytest.raises(stead.SchemaTooNew):  # refused again: not StoreLocked, the lock was released
        await stead.open(db_url)
    assert issubclass(stead.SchemaTooNew, stead.StoreError)


# ---------------------------------------------------------------------------------------------- URL options
async def pragma_synchronous(url: str) -> int:
    store = await open_store(url)
    try:
        async with store.transaction() as tx:
            ((value,),) = await tx.fetch("PRAGMA synchronous")
        return int(value)
    finally:
        await store.close()


async def test_synchronous_option_is_honoured(db_path: Path) -> None:
    base = f"sqlite:///{db_path}"
    assert await pragma_synchronous(base) == 2  # FULL by default
    assert await pragma_synchronous(base + "?synchronous=normal") == 1
    assert await pragma_synchronous(base + "?synchronous=full") == 2
    assert await pragma_synchronous(base + "?synchronous=NORMAL") == 1


@pytest.mark.parametrize(
    "suffix",
    ["?journal=delete", "?synchronous=normal&cache=shared", "?synchronous=fast"],
)
async def test_unknown_or_invalid_url_option_is_refused(db_path: Path, suffix: str) -> None:
    with pytest.raises(stead.InvalidInput):
        await open_store(f"sqlite:///{db_path}{suffix}")
    with pytest.raises(stead.InvalidInput):
        await stead.open(f"sqlite:///{db_path}{suffix}")
    await (await open_store(f"sqlite:///{db_path}")).close()  # nothing was left locked


@pytest.mark.parametrize("url", ["mysql://localhost/db", "sqlite:", "stead.db"])
async def test_unsupported_store_url_is_refused(url: str) -> None:
    with pytest.raises(stead.InvalidInput):
        await open_store(url)


# ---------------------------------------------------------------------------------------------- ownership
@pytest.mark.sqlite_only("one owning process per SQLite file (flock)")
async def test_second_open_of_the_same_file_raises_store_locked_immediately(db_url: str) -> None:
    first = await open_store(db_url)
    try:
        started = time.monotonic()
        with pytest.raises(stead.StoreLocked, match="owned by another process"):
            await open_store(db_url)
        with pytest.raises(stead.StoreLocked):
            await stead.open(db_url)
        assert time.monotonic() - started < 1.0
    finally:
        await first.close()
    second = await open_store(db_url)  # released on close
    await second.close()


async def test_a_crashed_store_releases_its_lock(db_url: str) -> None:
    faults = Faults(crash_at=3)
    store = await open_store(db_url, faults=faults)
    with pytest.raises(stead.StoreCrashed):
        for _ in range(5):
            async with store.transaction() as tx:
                await tx.write(A, "k", "v")
    again = await open_store(db_url)
    await again.close()


HOLD = """
import asyncio, sys
from stead.store import open_store

async def main():
    store = await open_store(sys.argv[1])
    print("READY", flush=True)
    sys.stdin.readline()

asyncio.run(main())
"""

TRY = """
import asyncio, sys
import stead

async def main():
    try:
        system = await stead.open(sys.argv[1])
    except stead.StoreLocked:
        sys.exit(3)
    await system.close()
    sys.exit(0)

asyncio.run(main())
"""


async def _run(code: str, url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        url,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


@pytest.mark.sqlite_only("one owning process per SQLite file (flock)")
async def test_store_locked_across_processes_when_this_process_owns_it(db_url: str) -> None:
    store = await open_store(db_url)
    try:
        child = await _run(TRY, db_url)
        assert await asyncio.wait_for(child.wait(), 20) == 3
    finally:
        await store.close()
    child = await _run(TRY, db_url)
    assert await asyncio.wait_for(child.wait(), 20) == 0


@pytest.mark.sqlite_only("one owning process per SQLite file (flock)")
async def test_store_locked_when_another_process_owns_it_and_released_when_it_dies(db_url: str) -> None:
    child = await _run(HOLD, db_url)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 20)
        assert line.strip() == b"READY"
        started = time.monotonic()
        with pytest.raises(stead.StoreLocked):
            await open_store(db_url)
        assert time.monotonic() - started < 1.0
    finally:
        child.kill()  # like kill -9: the kernel drops the lock with the process
        await child.wait()
    store = await open_store(db_url)
    await store.close()
