"""Workers, clients, leases and wake-ups on PostgreSQL, in one process (several systems on one database).

Each `stead.open(pg_url)` is a worker of the fleet (its own pool, listener and worker id); `run_agents=False`
opens a client. Steals and evictions are made with SQL, as another worker's sweep would make them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.core.fleet import FleetConfig
from stead.core.records import build_messages
from stead.providers.scripted import ScriptedProvider
from tests.conftest import tool_results_since_last_user
from tests.fakes.fleet import eventually, query

FAST = FleetConfig(lease_ttl=1.5, heartbeat=0.3, sweep=0.3, poll=0.3)
SLOW_POLL = FleetConfig(lease_ttl=30, heartbeat=0.3, sweep=0.3, poll=30)
"""Nothing moves by TTL and nothing is found by polling within a test: only a notification wakes."""

TIMEOUT = 20.0


def responder(request: stead.ProviderRequest) -> list[stead.Block]:
    """A call of the agent's first tool per user message (if it has tools), then a text answer."""
    if request.tools and tool_results_since_last_user(request) == 0:
        return [stead.ToolCall(request.tools[0].name, {})]
    last = next(m for m in reversed(request.messages) if m.role == "user")
    return [stead.Text(f"answer to {last.content[0].text}")]  # type: ignore[union-attr]


def open_node(url: str, *, tools: list[Any] | None = None, **kw: Any) -> stead.Opening:
    kw.setdefault("fleet", FAST)
    if kw.get("run_agents") is False:
        kw.pop("fleet")
    return stead.open(
        url, providers={"scripted": ScriptedProvider(responder)}, tools=tools or [], records=False, **kw
    )


@stead.tool
async def step() -> str:
    """One step."""
    return "stepped"


async def records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    async with system.store.transaction() as tx:
        return [json.loads(r) for r in await tx.load(agent_id)]


async def settled(system: stead.AgentSystem, agent_id: str, runs: int) -> bool:
    async with system.store.transaction() as tx:
        pending = await tx.get(agent_id, "pending")
        recs = [json.loads(r) for r in await tx.load(agent_id)]
    return pending is None and sum(1 for r in recs if r.get("k") == "e") >= runs


def owner_of(url: str, agent_id: str) -> tuple[str | None, int]:
    owner, epoch = query(url, "SELECT owner, epoch FROM agents WHERE id = %s", (agent_id,))[0]
    return (None if owner is None else str(owner), int(epoch))


async def test_W1_a_client_accepts_and_one_worker_runs_the_agent_and_keeps_it(pg_url: str) -> None:
    async with (
        open_node(pg_url, tools=[step]) as w1,
        open_node(pg_url, tools=[step]) as w2,
        open_node(pg_url, tools=[step], run_agents=False) as client,
    ):
        assert client.fleet is None and w1.fleet is not None and w2.fleet is not None
        agent = await client.create(provider="scripted", tools=["step"], agent_id="fleet-w1")
        assert owner_of(pg_url, "fleet-w1") == (None, 0)  # a client owns nothing
        assert (await agent.send("one", id="w1-m1")).created
        await eventually(lambda: settled(client, "fleet-w1", 1), TIMEOUT, "the first run")
        owner, epoch = owner_of(pg_url, "fleet-w1")
        node = w1 if owner == w1.fleet.me else w2
        other = w2 if node is w1 else w1
        assert node.fleet is not None and node.fleet.owned() == ["fleet-w1"]
        # sticky: the idle agent stays with its worker; the next message wakes that worker
        assert (await agent.steer("two", id="w1-m2")).created
        assert not (await agent.send("two", id="w1-m2")).created
        await eventually(lambda: settled(client, "fleet-w1", 2), TIMEOUT, "the second run")
        assert owner_of(pg_url, "fleet-w1") == (owner, epoch)
        assert other.loaded("fleet-w1") is None or not other._runtimes["fleet-w1"].owned
        # the owner's memory equals what a reload builds, although a client wrote its queue
        rt = node._runtimes["fleet-w1"]
        assert rt.records is not None
        reloaded = await records(client, "fleet-w1")
        assert rt.records == reloaded
        assert rt.messages() == build_messages(reloaded)
        users = [r["id"] for r in reloaded if r.get("k") == "u"]
        assert users == ["w1-m1", "w1-m2"]


async def test_W1_a_client_run_returns_the_result_of_the_run_a_worker_ran(pg_url: str) -> None:
    async with open_node(pg_url, tools=[step]) as w, open_node(pg_url, tools=[step], run_agents=False) as c:
        agent = await c.create(provider="scripted", tools=["step"], agent_id="fleet-run")
        result = await asyncio.wait_for(agent.run("hello", id="run-m1"), TIMEOUT)
        assert result.text == "answer to hello" and result.outcome is stead.Outcome.COMPLETED
        assert w.fleet is not None and w.fleet.owned() == ["fleet-run"]
        again = await asyncio.wait_for(agent.run("hello", id="run-m1"), TIMEOUT)  # A3: not sent twice
        assert again.run_id == result.run_id


def holding_tool() -> tuple[stead.Tool, asyncio.Event, asyncio.Event]:
    """A tool `hold` that sets `started` when it runs and returns `late` once the test sets `gate`."""
    started, gate = asyncio.Event(), asyncio.Event()

    @stead.tool
    async def hold() -> str:
        """Blocks until the test lets it go."""
        started.set()
        await gate.wait()
        return "late"

    return hold, started, gate


async def test_W2_a_lost_lease_stops_the_loop_for_good_writing_and_emitting_nothing(pg_url: str) -> None:
    hold, started, gate = holding_tool()
    async with open_node(pg_url, tools=[hold], fleet=FleetConfig(lease_ttl=30)) as w:
        assert w.fleet is not None
        agent = await w.create(provider="scripted", tools=["hold"], agent_id="fleet-w2")
        rt = w._runtimes["fleet-w2"]
        assert rt.owned
        await agent.send("go", id="w2-m1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        # another worker takes the agent over (as its sweep and claim would): the epoch moves
        other = "00000000-0000-4000-8000-000000000001"
        query(pg_url, "INSERT INTO stead_workers(id, host, pid) VALUES (%s, 'elsewhere', 1)", (other,))
        query(pg_url, "UPDATE agents SET owner = %s, epoch = epoch + 1 WHERE id = 'fleet-w2'", (other,))
        before = query(pg_url, "SELECT seq, epoch FROM history WHERE agent_id = 'fleet-w2' ORDER BY seq")
        events = rt.subscribe()
        gate.set()  # the tool returns; committing its result is fenced
        await eventually(lambda: not rt.owned, TIMEOUT, "the loop to stop")
        await rt.wait_stopped()
        assert w.fleet.lease_losses == 1
        assert "fleet-w2" not in w.store.held()  # type: ignore[attr-defined]
        assert rt.records is None and rt.pending is None  # its memory is dropped
        assert events.empty()  # nothing emitted after the lease was lost
        after = query(pg_url, "SELECT seq, epoch FROM history WHERE agent_id = 'fleet-w2' ORDER BY seq")
        assert after == before  # the zombie wrote nothing
        assert owner_of(pg_url, "fleet-w2")[0] == other
        # never retried: a later wake-up does not start it again here
        rt.wake()
        assert rt._loop_task is None


async def test_W3_wakeups_continue_after_the_listener_connection_is_killed(pg_url: str) -> None:
    async with open_node(pg_url, fleet=SLOW_POLL) as w, open_node(pg_url, run_agents=False) as client:
        assert w.fleet is not None
        agent = await client.create(provider="scripted", agent_id="fleet-w3")
        await agent.send("one", id="w3-m1")  # stead_claim wakes the worker at once (no poll: 30 s)
        await eventually(lambda: settled(client, "fleet-w3", 1), TIMEOUT, "the first run")
        await eventually(lambda: w.fleet.listening, TIMEOUT, "the listener")
        killed = query(
            pg_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"stead-worker {w.fleet.me}",),
        )
        assert killed == [(True,)]
        # sent while no listener may be connected: the rescan after reconnecting finds it
        await agent.send("two", id="w3-m2")
        await eventually(lambda: settled(client, "fleet-w3", 2), TIMEOUT, "the run after the kill")
        await eventually(lambda: w.fleet.listening, TIMEOUT, "the listener to reconnect")
        await agent.send("three", id="w3-m3")
        await eventually(lambda: settled(client, "fleet-w3", 3), TIMEOUT, "a run woken by a notification")
        assert w.fleet.owned() == ["fleet-w3"]


async def test_W4_a_draining_worker_hands_its_agents_to_another_at_once(pg_url: str) -> None:
    started, gate = asyncio.Event(), asyncio.Event()

    @stead.tool
    async def hold() -> str:
        """Blocks until the test lets it go."""
        started.set()
        await gate.wait()
        return "done"

    w2 = await open_node(pg_url, tools=[hold], fleet=SLOW_POLL)
    try:
        w1 = await open_node(pg_url, tools=[hold], fleet=SLOW_POLL)
        agent = await w1.create(provider="scripted", tools=["hold"], agent_id="fleet-w4")
        await agent.send("work", id="w4-m1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        assert w1.fleet is not None and w1.fleet.owned() == ["fleet-w4"]
        _, epoch = owner_of(pg_url, "fleet-w4")
        closing = asyncio.create_task(w1.close())  # X4: the tool finishes, no next provider request here
        await asyncio.sleep(0)
        gate.set()
        await closing
        # handed over: another worker continues now, not after a lease TTL (30 s) or a poll (30 s)
        await eventually(lambda: settled(w2, "fleet-w4", 1), TIMEOUT, "the other worker to finish it")
        owner, new_epoch = owner_of(pg_url, "fleet-w4")
        assert w2.fleet is not None and owner == w2.fleet.me and new_epoch > epoch
        texts = [r["b"].get("x") for r in await records(w2, "fleet-w4") if r.get("k") == "b"]
        assert "answer to work" in texts
    finally:
        await w2.close()


async def test_W5_an_evicted_worker_stops_everything_and_registers_again(pg_url: str) -> None:
    async with open_node(pg_url) as w:
        assert w.fleet is not None
        agent = await w.create(provider="scripted", agent_id="fleet-w5")
        first = w.fleet.me
        await agent.send("one", id="w5-m1")
        await eventually(lambda: settled(w, "fleet-w5", 1), TIMEOUT, "the first run")
        query(pg_url, "UPDATE stead_workers SET state = 'evicted' WHERE id = %s", (first,))
        await eventually(lambda: w.fleet.registrations == 2, TIMEOUT, "the worker to register again")
        assert w.fleet.me != first and w.fleet.lease_losses >= 1
        assert not w._runtimes["fleet-w5"].owned or owner_of(pg_url, "fleet-w5")[0] == w.fleet.me
        # the sweep releases what the evicted registration owned; work sent now runs under the new id
        await agent.send("two", id="w5-m2")
        await eventually(lambda: settled(w, "fleet-w5", 2), TIMEOUT, "the run after re-registering")
        assert owner_of(pg_url, "fleet-w5")[0] == w.fleet.me


SENDER = """
import asyncio, sys, time
from pathlib import Path
import stead
from stead.providers.scripted import ScriptedProvider

async def main(url, go):
    async with stead.open(url, run_agents=False, records=False,
                          providers={"scripted": ScriptedProvider(lambda r: [])}) as client:
        agent = await client.get("fleet-a3")
        print("ready", flush=True)
        while not Path(go).exists():
            time.sleep(0.001)
        acc = await agent.send("same", id="the-one-id")
        print("created" if acc.created else "seen", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_A3_one_message_id_sent_from_three_processes_is_created_once(
    pg_url: str, tmp_path: Path
) -> None:
    async with open_node(pg_url) as w:
        await w.create(provider="scripted", agent_id="fleet-a3")
        go = tmp_path / "go"
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - started once, read below
                [sys.executable, "-c", SENDER, pg_url, str(go)], stdout=subprocess.PIPE, text=True
            )
            for _ in range(3)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.write_text("go")
        outcomes = sorted(p.communicate(timeout=TIMEOUT)[0].strip() for p in procs)
        assert outcomes == ["created", "seen", "seen"]
        await eventually(lambda: settled(w, "fleet-a3", 1), TIMEOUT, "the run")
        users = [r["id"] for r in await records(w, "fleet-a3") if r.get("k") == "u"]
        assert users == ["the-one-id"]


async def test_A5_two_hundred_acceptors_racing_settlement_strand_nothing(pg_url: str) -> None:
    async with open_node(pg_url) as w:
        await w.create(provider="scripted", agent_id="fleet-a5")
        clients = [await open_node(pg_url, run_agents=False) for _ in range(4)]
        try:

            async def sender(c: stead.AgentSystem, k: int) -> None:
                agent = await c.get("fleet-a5")
                for i in range(50):
                    deliver = agent.steer if i % 3 == 0 else agent.send
                    assert (await deliver(f"m{k}-{i}", id=f"a5-{k}-{i}")).created

            await asyncio.gather(*(sender(c, k) for k, c in enumerate(clients)))
        finally:
            for c in clients:
                await c.close()

        async def drained() -> bool:
            async with w.store.transaction() as tx:
                queued = await tx.read_prefix("fleet-a5", "q.")
                return not queued and await tx.get("fleet-a5", "pending") is None

        await eventually(drained, 60, "every accepted message to be consumed")
        users = [r["id"] for r in await records(w, "fleet-a5") if r.get("k") == "u"]
        assert sorted(users) == sorted(f"a5-{k}-{i}" for k in range(4) for i in range(50))
        assert len(users) == len(set(users))


@stead.tool(approval="always")
async def guarded() -> str:
    """A step a human approves."""
    return "guarded"


async def test_W3_a_stale_wake_request_leaves_a_waiting_agent_waiting(pg_url: str) -> None:
    """A wake-up request answered by a loop that started after it does not restart the loop: a waiting
    agent stays `waiting` after `wait_idle` (a rescan that read the store before the agent's own loop ran
    used to restart it, so `state` flipped to `working`). A fresh request still wakes it."""
    async with open_node(pg_url, fleet=SLOW_POLL, tools=[guarded], approvals=True) as w:
        assert w.fleet is not None
        agent = await w.create(provider="scripted", tools=["guarded"])
        rt = agent._rt
        before_send = rt.loop_runs  # what a rescan that began before the send saw
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"
        runs = rt.loop_runs
        w.fleet.wake(agent.id, since=before_send)
        await asyncio.gather(*w.fleet._rechecks.values())
        assert agent.state == "waiting" and rt.loop_runs == runs
        w.fleet.wake(agent.id)  # as a notification of another process's decision
        await asyncio.gather(*w.fleet._rechecks.values())
        assert rt.loop_runs == runs + 1
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"


async def test_W3_a_decision_made_in_another_process_wakes_the_owning_worker(pg_url: str) -> None:
    """An approval decided by a client (or another worker) notifies the agent's owner when it commits:
    with no polling (30 s) the approved call still runs at once, exactly once."""
    ran: list[str] = []

    @stead.tool(approval="always", name="guarded")
    async def counted() -> str:
        """A step a human approves."""
        ran.append("x")
        return "guarded"

    async with (
        open_node(pg_url, fleet=SLOW_POLL, tools=[counted], approvals=True) as w,
        open_node(pg_url, run_agents=False, tools=[counted], approvals=True) as client,
    ):
        agent = await w.create(provider="scripted", tools=["guarded"], agent_id="fleet-w3-decide")
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"
        (approval,) = await client.approvals()
        assert (await client.approve(approval.id)).decided
        await eventually(lambda: settled(client, "fleet-w3-decide", 1), TIMEOUT, "the approved run")
        assert ran == ["x"]


def _cluster_versions() -> list[str]:
    """The local PostgreSQL clusters' versions (Debian's layout: /etc/postgresql/<version>/main)."""
    etc = Path("/etc/postgresql")
    return sorted(p.name for p in etc.iterdir()) if etc.is_dir() else []


async def test_W3_owners_continue_after_postgresql_restarts(pg_url: str) -> None:
    """Restarts the local cluster (every session drops): the worker's pool and listener and the client's
    pool reconnect, and the owner continues with its epoch. Tests run one at a time, so nothing else is
    using the cluster meanwhile (the test databases are reached through fresh connections)."""
    async with open_node(pg_url) as w, open_node(pg_url, run_agents=False) as client:
        assert w.fleet is not None
        agent = await client.create(provider="scripted", agent_id="fleet-restart")
        await agent.send("one", id="r-m1")
        await eventually(lambda: settled(client, "fleet-restart", 1), TIMEOUT, "the first run")
        owner, epoch = owner_of(pg_url, "fleet-restart")
        versions = _cluster_versions()
        if not versions:
            pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster)")
        restart = ["pg_ctlcluster", "--skip-systemctl-redirect", versions[0], "main", "restart"]
        await asyncio.to_thread(subprocess.run, restart, check=True, timeout=60)

        async def send_again() -> bool:
            try:
                await agent.send("two", id="r-m2")
                return True
            except stead.StoreError:
                return False  # the client's pool reconnects too

        await eventually(send_again, 60, "the client to accept again")
        await eventually(lambda: settled(client, "fleet-restart", 2), 60, "the owner to continue")
        assert owner_of(pg_url, "fleet-restart") == (owner, epoch)  # epochs unchanged, owner continues


async def test_W6_a_loop_that_outlives_its_dropped_lease_commits_nothing(pg_url: str) -> None:
    """The process gives the lease up (its heartbeat found it evicted: every agent stopped, holds dropped)
    but the agent's loop goes on — here a tool that ignores the cancellation; asyncio can also lose one. Its
    result commit is refused (`LeaseLost`) although the process holds no lease on the agent any more: a
    loop's transactions run under the lease it started with, never as an unfenced acceptor's."""
    started, gate, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @stead.tool(durable=True)
    async def stubborn() -> str:
        """Finishes whatever happens."""
        started.set()
        while True:
            try:
                await gate.wait()
                return "late"
            except asyncio.CancelledError:
                cancelled.set()

    async with open_node(pg_url, tools=[stubborn], fleet=FleetConfig(lease_ttl=30)) as w:
        assert w.fleet is not None
        agent = await w.create(provider="scripted", tools=["stubborn"], agent_id="fleet-w6")
        rt = w._runtimes["fleet-w6"]
        await agent.send("go", id="w6-m1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        other = "00000000-0000-4000-8000-000000000006"
        query(pg_url, "INSERT INTO stead_workers(id, host, pid) VALUES (%s, 'elsewhere', 1)", (other,))
        query(pg_url, "UPDATE agents SET owner = %s, epoch = epoch + 1 WHERE id = 'fleet-w6'", (other,))
        before = query(
            pg_url, "SELECT seq, epoch, record FROM history WHERE agent_id = 'fleet-w6' ORDER BY seq"
        )
        w.fleet._lose_all("evicted (as its heartbeat finds it)")
        await asyncio.wait_for(cancelled.wait(), TIMEOUT)
        assert "fleet-w6" not in w.store.held()  # type: ignore[attr-defined]
        gate.set()  # the loop goes on to commit the result
        await rt.wait_stopped()
        after = query(
            pg_url, "SELECT seq, epoch, record FROM history WHERE agent_id = 'fleet-w6' ORDER BY seq"
        )
        assert after == before, "the loop committed after its process gave the lease up"
        assert w.fleet.lease_losses == 2  # the eviction, then the refused commit
        assert query(
            pg_url, "SELECT count(*) FROM kv WHERE agent_id = 'fleet-w6' AND key LIKE 'tool.%%'"
        ) == [(1,)]


async def test_W6_a_loop_that_outlives_a_lease_taken_again_stops_and_the_new_lease_runs_the_agent(
    pg_url: str,
) -> None:
    """As above, but before the old loop's run of the tool returns, this worker takes the agent again (it
    was released: a new epoch). The old loop's commit is refused and only that loop stops: the agent stays
    with this worker, a new loop under the new lease runs the durable call again and finishes the run."""
    started, gate, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    @stead.tool(durable=True)
    async def stubborn() -> str:
        """Finishes whatever happens."""
        runs.append("run")
        started.set()
        while True:
            try:
                await gate.wait()
                return f"run {len(runs)}"
            except asyncio.CancelledError:
                cancelled.set()

    config = FleetConfig(lease_ttl=30, heartbeat=0.3, sweep=0.3, poll=0.3)
    async with open_node(pg_url, tools=[stubborn], fleet=config) as w:
        assert w.fleet is not None
        agent = await w.create(provider="scripted", tools=["stubborn"], agent_id="fleet-w6-again")
        rt = w._runtimes["fleet-w6-again"]
        await agent.send("go", id="w6a-m1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        _, first = owner_of(pg_url, "fleet-w6-again")
        w.fleet._lose_all("evicted (as its heartbeat finds it)")
        await asyncio.wait_for(cancelled.wait(), TIMEOUT)
        # released (as a sweep releases an evicted worker's agents): this worker's claim takes it again
        query(pg_url, "UPDATE agents SET owner = NULL, epoch = epoch + 1 WHERE id = 'fleet-w6-again'")
        await eventually(lambda: w.store.held().get("fleet-w6-again", 0) > first, TIMEOUT, "the claim")  # type: ignore[attr-defined]
        again = w.store.held()["fleet-w6-again"]  # type: ignore[attr-defined]
        gate.set()  # the old loop's run returns: its commit is refused, the new loop runs the call again
        await eventually(lambda: settled(w, "fleet-w6-again", 1), TIMEOUT, "the run under the new lease")
        assert rt.owned and w.fleet.owned() == ["fleet-w6-again"] and w.fleet.lease_losses == 1
        assert owner_of(pg_url, "fleet-w6-again") == (w.fleet.me, again)
        rows = query(
            pg_url, "SELECT epoch, record FROM history WHERE agent_id = 'fleet-w6-again' ORDER BY seq"
        )
        results = [(e, json.loads(r)["b"]["o"]) for e, r in rows if json.loads(r)["k"] == "t"]
        assert results == [(again, "run 2")]  # the new loop's run, committed under the new lease


async def test_W7_a_client_run_finds_its_result_when_the_consumption_commits_between_its_reads(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's `agent.run()` reads the queue, then (once the message left it) the history — each read
    in its own snapshot on PostgreSQL. The worker consumes the message right after the queue read saw it
    queued: the run is still found (a message the queue no longer holds is in the history at every later
    read) and its result returned, never `RunNotFound`."""
    import stead.agent as agent_module

    hold, started, gate = holding_tool()
    real = agent_module.is_queued
    injected: list[str] = []

    async def between(tx: Any, agent_id: str, message_id: str) -> Any:
        queued = await real(tx, agent_id, message_id)
        if message_id == "w7-m2" and queued and not injected:
            injected.append(message_id)
            gate.set()  # the first run ends and the worker consumes m2, while this client reads
            await eventually(lambda: consumed(worker, "fleet-w7", "w7-m2"), TIMEOUT, "m2 consumed")
        return queued

    monkeypatch.setattr(agent_module, "is_queued", between)
    async with (
        open_node(pg_url, tools=[hold]) as worker,
        open_node(pg_url, tools=[hold], run_agents=False) as client,
    ):
        agent = await client.create(provider="scripted", tools=["hold"], agent_id="fleet-w7")
        assert (await agent.send("first", id="w7-m1")).created
        await asyncio.wait_for(started.wait(), TIMEOUT)  # the worker runs m1's tool: m2 stays queued
        result = await asyncio.wait_for(agent.run("second", id="w7-m2"), TIMEOUT)
        assert injected == ["w7-m2"]
        assert result.text == "answer to second" and result.outcome is stead.Outcome.COMPLETED
        assert result.message_id == "w7-m2"


async def test_W8_a_client_run_returns_awaiting_input_when_the_worker_waits_for_a_decision(
    pg_url: str,
) -> None:
    """A client's `agent.run()` for an agent a worker runs, whose tool call is held for approval: the run
    returns `awaiting_input` with the messages so far (as it does in the owning process), instead of
    polling until someone decides; after the client approves, the same call with the same id returns the
    completed run."""

    @stead.tool(approval="always", name="guarded")
    async def guarded() -> str:
        """A step a human approves."""
        return "guarded"

    async with (
        open_node(pg_url, tools=[guarded], approvals=True),
        open_node(pg_url, run_agents=False, tools=[guarded], approvals=True) as client,
    ):
        agent = await client.create(provider="scripted", tools=["guarded"], agent_id="fleet-w8")
        waiting = await asyncio.wait_for(agent.run("go", id="w8-m1"), TIMEOUT)
        assert waiting.outcome is stead.Outcome.AWAITING_INPUT
        assert waiting.message_id == "w8-m1" and waiting.run_id
        assert [m.role for m in waiting.messages] == ["user", "assistant"]
        (approval,) = await client.approvals()
        assert (await client.approve(approval.id)).decided
        done = await asyncio.wait_for(agent.run("go", id="w8-m1"), TIMEOUT)
        assert done.outcome is stead.Outcome.COMPLETED and done.text == "answer to go"
        assert done.run_id == waiting.run_id


async def consumed(system: stead.AgentSystem, agent_id: str, message_id: str) -> bool:
    """Whether `message_id` is in the history (its consumption committed)."""
    return any(r.get("k") == "u" and r.get("id") == message_id for r in await records(system, agent_id))


async def test_C4_a_call_rejected_in_another_process_reaches_the_owner_s_next_request(pg_url: str) -> None:
    """A client rejects a held call of an agent a worker runs: the rejection's error result is committed by
    the client, not by the owner, so the owner's memory lacks it. The owner's next provider request is
    still built from the store: it carries the rejection (the responder answers instead of calling again),
    and the owner's memory equals a reload."""

    @stead.tool(approval="always", name="guarded")
    async def guarded() -> str:
        """A step a human approves."""
        return "guarded"

    async with (
        open_node(pg_url, fleet=SLOW_POLL, tools=[guarded], approvals=True) as w,
        open_node(pg_url, run_agents=False, tools=[guarded], approvals=True) as client,
    ):
        agent = await w.create(provider="scripted", tools=["guarded"], agent_id="fleet-c4-reject")
        await agent.send("go", id="c4r-m1")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"
        (approval,) = await client.approvals()
        assert (await client.reject(approval.id, note="no")).decided
        await eventually(lambda: settled(client, "fleet-c4-reject", 1), TIMEOUT, "the rejected run")
        stored = await records(client, "fleet-c4-reject")
        assert [(r["k"], r.get("b", {}).get("t")) for r in stored] == [
            ("u", None),
            ("b", "c"),
            ("t", "r"),
            ("b", "x"),
            ("e", None),
        ]
        assert stored[2]["b"]["o"] == "rejected by reviewer: no" and stored[3]["b"]["x"] == "answer to go"
        rt = w._runtimes["fleet-c4-reject"]
        assert rt.records == stored and rt.messages() == build_messages(stored)
