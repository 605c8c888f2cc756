"""The PostgreSQL store beyond the shared contract suite (which runs on both stores through `db_url`): its
code-point key order, placeholder translation, transactions across processes, the fence, racing
migrations, read-only openers and round trips per commit."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest

import stead
from stead.core.fleet import FleetConfig
from stead.errors import LeaseLost, ReadOnly
from stead.providers.scripted import ScriptedProvider
from stead.store import open_store
from stead.store._pg_schema import SCHEMA_VERSION
from stead.store._pg_sql import translate
from stead.store.base import AgentRow
from stead.store.postgres import PostgresStore
from tests.conftest import tool_loop
from tests.fakes.postgres import raw_rows

A = "agentaaaaaaaaaaaaaaaaaaa"
B = "agentbbbbbbbbbbbbbbbbbbb"


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = await open_store(pg_url)
    assert isinstance(s, PostgresStore)
    yield s
    await s.close()


async def add_agent(store: PostgresStore, agent_id: str = A) -> None:
    async with store.transaction() as tx:
        await tx.insert_agent(AgentRow(agent_id, None, "{}", 1.0))


# ---------------------------------------------------------------------------------------------- KV order
KEYS = [
    "a",
    "B",
    "_x",
    "a-b",
    "a.b",
    "a_b",
    "ab",
    "a b",
    "é",
    "~",
    "Z",
    "q.send.0001",
    "q.steer.0001",
    "\U0001f600",
]


async def test_PG1_kv_keys_sort_by_code_point_not_by_locale(store: PostgresStore) -> None:
    async with store.transaction() as tx:
        for k in KEYS:
            await tx.write(A, k, k)
    async with store.transaction() as tx:
        got = [k for k, _ in await tx.read_prefix(A, "")]
        assert got == sorted(KEYS)  # Python sorts str by code point, as SQLite does
        assert [k for k, _ in await tx.read_prefix(A, "a")] == sorted(k for k in KEYS if k.startswith("a"))
        assert await tx.last_key(A, "q.") == "q.steer.0001"
        assert await tx.last_key(A, "") == max(KEYS)


# ---------------------------------------------------------------------------------------------- placeholders
def test_placeholder_translation_leaves_literals_comments_and_identifiers_alone() -> None:
    assert translate("SELECT ?") == "SELECT %s"
    assert translate("SELECT '?', ?") == "SELECT '?', %s"
    assert translate("SELECT 'it''s ?', ? -- why?\n, ?") == "SELECT 'it''s ?', %s -- why?\n, %s"
    assert translate('SELECT "we?ird", ? /* ? */') == 'SELECT "we?ird", %s /* ? */'
    assert translate("SELECT '100%' LIKE ?") == "SELECT '100%%' LIKE %s"
    assert translate("SELECT 5 % 3") == "SELECT 5 %% 3"


async def test_PG1_placeholders_bind_and_literals_survive_on_the_server(store: PostgresStore) -> None:
    async with store.transaction() as tx:
        rows = await tx.fetch("SELECT '?' || ?, 'it''s 100%', ? LIKE 'a%', 7 % 4", ("x", "abc"))
    assert rows == [("?x", "it's 100%", True, 3)]


# ---------------------------------------------------------------------------------------------- transactions
async def test_PG1_nested_transaction_joins_and_after_commit_runs_after_the_outermost_commit(
    store: PostgresStore, pg_url: str
) -> None:
    ran: list[str] = []
    async with store.transaction() as outer:
        await outer.write(A, "k", "v")
        async with store.transaction() as inner:
            assert inner is outer and store.current() is outer
            inner.after_commit(lambda: ran.append("inner"))
        assert ran == []
        assert raw_rows(pg_url, "SELECT count(*) FROM kv") == [(0,)]  # not committed yet
    assert ran == ["inner"]
    assert raw_rows(pg_url, "SELECT value FROM kv WHERE agent_id = ?", (A,)) == [("v",)]
    assert store.current() is None


async def test_PG1_savepoint_rollback_drops_its_writes_and_callbacks_only(store: PostgresStore) -> None:
    ran: list[str] = []
    async with store.transaction() as tx:
        await tx.write(A, "before", "1")
        with pytest.raises(ZeroDivisionError):
            async with tx.savepoint():
                await tx.write(A, "inside", "1")
                tx.after_commit(lambda: ran.append("inside"))
                raise ZeroDivisionError
        with pytest.raises(stead.StoreError):  # a failing statement inside a section: only it rolls back
            async with tx.savepoint():
                await tx.write(A, "inside2", "1")
                await tx.fetch("SELECT 1/0")
        await tx.write(A, "after", "1")
        tx.after_commit(lambda: ran.append("outer"))
    async with store.transaction() as tx:
        assert [k for k, _ in await tx.read_prefix(A, "")] == ["after", "before"]
    assert ran == ["outer"]


async def test_PG1_write_if_absent_from_two_connections_exactly_one_wins(pg_url: str) -> None:
    first = await open_store(pg_url)
    second = await open_store(pg_url)
    try:
        await add_agent(first)  # type: ignore[arg-type]
        results: list[bool] = []

        async def contender(s: stead.store.Store, started: asyncio.Event, go: asyncio.Event) -> None:
            async with s.transaction() as tx:
                won = await tx.write_if_absent(A, "msg.x", "1")
                started.set()
                await go.wait()  # hold the transaction open while the other one tries
            results.append(won)

        go = asyncio.Event()
        s1, s2 = asyncio.Event(), asyncio.Event()
        t1 = asyncio.create_task(contender(first, s1, go))
        await s1.wait()  # the first holds the row (and the agent's lock), uncommitted
        t2 = asyncio.create_task(contender(second, s2, go))
        go.set()
        await asyncio.wait_for(asyncio.gather(t1, t2), 30)
        assert sorted(results) == [False, True]
        assert raw_rows(pg_url, "SELECT count(*) FROM kv WHERE key = 'msg.x'") == [(1,)]
    finally:
        await first.close()
        await second.close()


async def test_PG1_a_batch_locks_its_agents_in_one_order(pg_url: str) -> None:
    """Batched acceptance in two processes that share agents cannot deadlock: `write_if_absent_many`
    row-locks its agents in the order of their ids, whatever the order of its rows. A batch waiting for the
    lock of A has therefore locked nothing after A (here: not B). In the order of its rows it would have
    locked B first, and a second batch holding A and wanting B would have deadlocked with it: PostgreSQL
    breaks that only after `deadlock_timeout` (1 s) by failing one of them."""
    first = await open_store(pg_url)
    second = await open_store(pg_url)
    holding, release = asyncio.Event(), asyncio.Event()
    try:
        await add_agent(first, A)  # type: ignore[arg-type]
        await add_agent(first, B)  # type: ignore[arg-type]

        async def hold_a() -> None:
            async with first.transaction() as tx:
                await tx.write(A, "x", "1")
                await tx.fetch("SELECT 1")  # waits for the server: A's row lock is held from here
                holding.set()
                await release.wait()

        async def batch() -> list[bool]:
            async with second.transaction() as tx:
                return await tx.write_if_absent_many([(B, "msg.1", "send"), (A, "msg.2", "send")])

        holder = asyncio.create_task(hold_a())
        await holding.wait()
        batcher = asyncio.create_task(batch())
        waiting = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        for _ in range(1000):  # until the batch waits for A's lock (observed, not assumed)
            if await asyncio.to_thread(raw_rows, pg_url, waiting) == [(1,)]:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the batch never waited for A's lock")
        lock_b = "SELECT id FROM agents WHERE id = ? FOR NO KEY UPDATE NOWAIT"
        assert await asyncio.to_thread(raw_rows, pg_url, lock_b, (B,)) == [(B,)]  # B is free
        release.set()
        await asyncio.wait_for(holder, 30)
        assert await asyncio.wait_for(batcher, 30) == [True, True]
    finally:
        release.set()  # a failed check must not leave a transaction open
        await first.close()
        await second.close()


# ---------------------------------------------------------------------------------------------- the fence
async def test_PG2_fence_raises_lease_lost_after_an_epoch_bump_and_nothing_commits(
    store: PostgresStore, pg_url: str
) -> None:
    await add_agent(store)
    async with store.transaction() as tx:
        await tx.write(A, "pending", "{}")
    me = await store.register_worker("host", 1, 10)
    assert await store.claim(10) == [(A, 1)]
    assert store.held() == {A: 1} and await store.owned() == {A: 1}
    async with store.transaction() as tx:  # the owner writes while it holds the lease
        await tx.write(A, "k", "mine")
        await tx.append(A, ["r1"])
    assert raw_rows(pg_url, "SELECT seq, epoch FROM history WHERE agent_id = ?", (A,)) == [(1, 1)]

    raw_rows(pg_url, "UPDATE agents SET owner = NULL, epoch = epoch + 1 WHERE id = ?", (A,))  # stolen
    with pytest.raises(LeaseLost) as caught:
        async with store.transaction() as tx:
            await tx.write(A, "k", "zombie")
            await tx.append(A, ["zombie"])
    assert caught.value.agent_id == A
    assert isinstance(caught.value, stead.StoreError)
    with pytest.raises(LeaseLost):  # a read touching it is fenced too, until the hold is dropped
        async with store.transaction() as tx:
            await tx.get(A, "k")
    assert raw_rows(pg_url, "SELECT value FROM kv WHERE agent_id = ? AND key = 'k'", (A,)) == [("mine",)]
    assert raw_rows(pg_url, "SELECT record FROM history WHERE agent_id = ?", (A,)) == [("r1",)]
    store.forget(A)  # what the runtime does after LeaseLost: stop fencing, write nothing
    assert not await store.release(A)  # not held any more: release writes nothing
    assert raw_rows(pg_url, "SELECT owner, epoch FROM agents WHERE id = ?", (A,)) == [(None, 2)]
    assert me


async def test_PG2_a_worker_s_own_sweep_never_evicts_it(pg_url: str) -> None:
    """A worker whose event loop was starved (its heartbeat late past the TTL) but that runs its sweep is
    alive: its own sweep leaves it registered; another worker's sweep evicts it."""
    me_store = await open_store(pg_url)
    other = await open_store(pg_url)
    assert isinstance(me_store, PostgresStore) and isinstance(other, PostgresStore)
    try:
        me = await me_store.register_worker("h", 1, 5)
        await other.register_worker("h", 2, 5)
        raw_rows(
            pg_url, "UPDATE stead_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = ?", (me,)
        )
        assert await me_store.sweep(10.0) == []
        assert await me_store.heartbeat(me) == "live"
        raw_rows(
            pg_url, "UPDATE stead_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = ?", (me,)
        )
        assert await other.sweep(10.0) == [me]
        assert await me_store.heartbeat(me) is None
    finally:
        await me_store.close()
        await other.close()


async def test_PG2_sweep_evicts_a_silent_worker_and_its_agents_move_with_a_new_epoch(pg_url: str) -> None:
    old = await open_store(pg_url)
    new = await open_store(pg_url)
    assert isinstance(old, PostgresStore) and isinstance(new, PostgresStore)
    try:
        await add_agent(old)
        async with old.transaction() as tx:
            await tx.write(A, "q.send.0001", "{}")  # a queued message is owed work too
        dead = await old.register_worker("h", 1, 5)
        await new.register_worker("h", 2, 5)
        assert await old.claim(5) == [(A, 1)]
        assert await new.claim(5) == []  # owned: not claimable
        assert await new.sweep(10.0) == []  # fresh heartbeats: nobody is evicted
        raw_rows(
            pg_url, "UPDATE stead_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = ?", (dead,)
        )
        assert await new.sweep(10.0) == [dead]
        assert await old.heartbeat(dead) is None  # the evicted worker learns it at its next heartbeat
        assert await new.claim(5) == [(A, 3)]  # released with epoch 2, claimed with epoch 3
        with pytest.raises(LeaseLost):
            async with old.transaction() as tx:
                await tx.write(A, "k", "zombie")
        async with new.transaction() as tx:
            await tx.write(A, "k", "owner")
        assert await new.release(A)
        assert raw_rows(pg_url, "SELECT owner, epoch FROM agents WHERE id = ?", (A,)) == [(None, 4)]
    finally:
        await old.close()
        await new.close()


async def test_acceptor_notifies_the_owner_channel_once_per_commit(pg_url: str) -> None:
    import psycopg

    owner = await open_store(pg_url)
    acceptor = await open_store(pg_url)
    assert isinstance(owner, PostgresStore) and isinstance(acceptor, PostgresStore)
    listener = await psycopg.AsyncConnection.connect(owner.conninfo, autocommit=True)
    try:
        await add_agent(owner)
        async with owner.transaction() as tx:
            await tx.write(A, "pending", "{}")
        wid = await owner.register_worker("h", 1, 5)
        await owner.claim(5)
        channel = "stead_w_" + wid.replace("-", "")
        await listener.execute(f"LISTEN {channel}".encode())
        await listener.execute(b"LISTEN stead_claim")
        async with acceptor.transaction() as tx:
            await tx.write(A, "q.send.0002", "{}")
            await tx.notify_owner(A)
            await tx.notify_owner(A)  # once per agent per commit
        got = []
        async for n in listener.notifies(timeout=5, stop_after=1):
            got.append((n.channel, n.payload))
        assert got == [(channel, A)]
    finally:
        await listener.close()
        await owner.close()
        await acceptor.close()


# ---------------------------------------------------------------------------------------------- migrations
RACE = """
import asyncio, sys
from stead.store import open_store

async def main():
    mod = ["CREATE TABLE mod_t(x integer)", "ALTER TABLE mod_t ADD y text"]
    store = await open_store(sys.argv[1], migrations={"mod": mod})
    print(store.migrations_applied, flush=True)
    await store.close()

asyncio.run(main())
"""


async def test_PG3_migrations_racing_from_several_processes_apply_exactly_once(pg_url: str) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", RACE, pg_url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        for _ in range(4)
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    assert [p.returncode for p in procs] == [0] * 4, [err.decode() for _, err in outs]
    applied = sorted(int(out) for out, _ in outs)
    assert applied == [0, 0, 0, SCHEMA_VERSION + 2]  # one process applied everything, the others nothing
    meta = dict(raw_rows(pg_url, "SELECT key, value FROM stead_meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) and meta["schema_version:mod"] == "2"


async def test_PG3_a_foreign_database_and_a_newer_schema_are_refused(pg_url: str) -> None:
    raw_rows(pg_url, "CREATE TABLE customers(id integer)")
    with pytest.raises(stead.StoreError, match=r"not a stead store.*customers"):
        await open_store(pg_url)
    raw_rows(pg_url, "DROP TABLE customers")
    await (await open_store(pg_url)).close()
    raw_rows(
        pg_url, "UPDATE stead_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    with pytest.raises(stead.SchemaTooNew):
        await open_store(pg_url)
    with pytest.raises(stead.SchemaTooNew):
        await open_store(pg_url, readonly=True)


# ---------------------------------------------------------------------------------------------- read-only
async def test_PG4_readonly_open_migrates_nothing_and_refuses_writes(pg_url: str) -> None:
    with pytest.raises(stead.StoreError, match="not a stead store"):
        await open_store(pg_url, readonly=True)  # an empty schema is not created by an inspector
    assert raw_rows(
        pg_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    ) == [(0,)]
    async with await stead.open(pg_url, providers={"scripted": ScriptedProvider(tool_loop())}) as system:
        agent = await system.create(provider="scripted", model="m", instructions="hi")
    async with await stead.open(pg_url, readonly=True) as inspector:
        assert [a.id for a in await inspector.agents()] == [agent.id]
        with pytest.raises(ReadOnly):
            async with inspector.store.transaction() as tx:
                await tx.write(agent.id, "k", "v")
        with pytest.raises(ReadOnly):
            async with inspector.store.transaction() as tx:
                await tx.execute("DELETE FROM kv")


# ---------------------------------------------------------------------------------------------- round trips
async def test_a_writing_commit_costs_one_round_trip(store: PostgresStore) -> None:
    await add_agent(store)
    before = store.stats.round_trips
    async with store.transaction() as tx:
        await tx.write(A, "pending", "{}")
        await tx.append(A, ["r1", "r2"])
        await tx.write(A, "kv.x", "1")
    assert store.stats.round_trips - before == 1  # BEGIN, lock, writes and COMMIT in one pipeline sync


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_agents_and_history_read_a_postgresql_url(pg_url: str) -> None:
    import json

    from typer.testing import CliRunner

    from stead.cli import app

    async def setup() -> str:
        async with await stead.open(
            pg_url, providers={"scripted": ScriptedProvider(tool_loop(k=0))}
        ) as system:
            agent = await system.create(provider="scripted", model="m", instructions="hi", name="pg-agent")
            await agent.send("hello")
            await agent.wait_idle(timeout=10)
            return agent.id

    agent_id = asyncio.run(setup())
    result = CliRunner().invoke(app, ["agents", "--db", pg_url, "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["id"], r["name"], r["owner"], r["epoch"]) for r in rows] == [(agent_id, "pg-agent", None, 2)]
    result = CliRunner().invoke(app, ["history", agent_id, "--db", pg_url])
    assert result.exit_code == 0, result.stderr
    assert "hello" in result.stdout and "done after 0 calls" in result.stdout


# ---------------------------------------------------------------------------------------------- failures
def kill_sessions(pg_url: str, app: str) -> int:
    """Terminate every server session of one application name, as a PostgreSQL restart would."""
    rows = raw_rows(
        pg_url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?",
        (app,),
    )
    return int(str(rows[0][0]))


async def test_lost_connections_are_transient_store_errors_and_the_pool_reconnects(pg_url: str) -> None:
    store = await open_store(pg_url + "&application_name=stead-loss-test")
    try:
        await add_agent(store)  # type: ignore[arg-type]
        assert kill_sessions(pg_url, "stead-loss-test") >= 1  # idle pooled connections die
        async with store.transaction() as tx:  # checked on checkout: a fresh connection serves it
            await tx.write(A, "k", "1")

        with pytest.raises(stead.StoreError) as caught:  # a connection dying inside a transaction
            async with store.transaction() as tx:
                await tx.write(A, "k", "2")
                assert await tx.get(A, "k") == "2"
                kill_sessions(pg_url, "stead-loss-test")
                await tx.get(A, "k")
        assert not isinstance(caught.value, (LeaseLost, stead.StoreCrashed))
        async with store.transaction() as tx:  # nothing of it committed; the store works on
            assert await tx.get(A, "k") == "1"
            await tx.write(A, "k", "3")
        assert raw_rows(pg_url, "SELECT value FROM kv WHERE key = 'k'") == [("3",)]
    finally:
        await store.close()


async def test_a_deadlock_between_two_processes_is_a_transient_store_error(pg_url: str) -> None:
    first = await open_store(pg_url)
    second = await open_store(pg_url)
    try:
        await add_agent(first)  # type: ignore[arg-type]
        await add_agent(first, B)  # type: ignore[arg-type]
        locked = [asyncio.Event(), asyncio.Event()]

        async def writer(s: stead.store.Store, me: int, a: str, b: str) -> str:
            try:
                async with s.transaction() as tx:
                    await tx.write(a, "k", "x")
                    await tx.get(a, "k")  # the row lock is taken (the pipeline was flushed)
                    locked[me].set()
                    await locked[1 - me].wait()
                    await tx.write(b, "k", "x")
                    await tx.get(b, "k")
                return "committed"
            except stead.StoreError as e:
                return str(e)

        outcomes = await asyncio.wait_for(asyncio.gather(writer(first, 0, A, B), writer(second, 1, B, A)), 30)
        assert sorted(o == "committed" for o in outcomes) == [False, True]
        assert any("deadlock" in o and "transient" in o for o in outcomes), outcomes
    finally:
        await first.close()
        await second.close()


async def test_a_tool_loop_conversation_stays_within_its_round_trip_budget_per_commit(
    pg_url: str,
) -> None:
    @stead.tool
    async def add(a: int, b: int) -> int:
        "Add two integers."
        return a + b

    # the fleet's timers (heartbeat, sweep, poll: every 2 s by default) quiet, so that only the conversation's
    # own transactions are counted however long it takes on a loaded machine (3.0 was seen once under load)
    quiet = FleetConfig(lease_ttl=600, heartbeat=300, sweep=300, poll=300)
    async with await stead.open(
        pg_url, providers={"scripted": ScriptedProvider(tool_loop())}, tools=[add], fleet=quiet
    ) as system:
        store = system.store
        assert isinstance(store, PostgresStore)
        agent = await system.create(provider="scripted", model="any", instructions="be brief", tools=["add"])
        commits, trips, writing = (
            store.stats.commits,
            store.stats.round_trips,
            store.stats.writing_round_trips,
        )
        await agent.send("hello")
        await agent.wait_idle(timeout=10)
        assert store.stats.commits - commits == 12  # the same commits as on SQLite
        # every writing commit: its writes and COMMIT in one pipeline sync, plus the reads it must answer
        # (2.33 per writing commit without leases; 2.58 measured for a worker, whose transactions are fenced)
        assert (store.stats.writing_round_trips - writing) / 12 <= 2.75
        assert (store.stats.round_trips - trips) / 12 <= 4  # read-only transactions (turn reloads) included


def test_url_options_are_stead_s_or_libpq_s_and_passwords_stay_out_of_messages() -> None:
    from stead.store.postgres import parse_postgres_url, redact

    conninfo, options = parse_postgres_url(
        "postgres://u:secret@db:5433/app?pool_min=3&pool_max=20&pool_timeout=2.5&options=-c%20x%3D1&sslmode=disable"
    )
    assert options == {"pool_min": 3, "pool_max": 20, "pool_timeout": 2.5}
    assert conninfo == "postgresql://u:secret@db:5433/app?options=-c%20x%3D1&sslmode=disable"  # %20, not '+'
    assert redact("postgresql://u:secret@db/app") == "postgresql://u:***@db/app"
    with pytest.raises(stead.InvalidInput):
        parse_postgres_url("postgresql://db/app?pool_max=many")


async def test_an_unreachable_server_is_a_store_error_naming_the_url_without_its_password() -> None:
    with pytest.raises(
        stead.StoreError, match=r"cannot connect to postgresql://u:\*\*\*@127\.0\.0\.1:1/x"
    ) as e:
        await open_store("postgresql://u:pw@127.0.0.1:1/x?pool_timeout=1")
    assert "pw" not in str(e.value)
