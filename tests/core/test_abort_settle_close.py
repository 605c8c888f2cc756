"""Abort, settlement and shutdown promises X1–X4 (docs/promises.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import url_of
from tests.fakes.crash_points import KVLedger, crash
from tests.fakes.tools import hang
from tests.tools.test_tools import FAST_RETRY, TIMEOUT, assert_one_result_per_call, calls_then_text


class Ledger(KVLedger):
    """Activation / settlement hook calls, written durably in the transaction they describe."""

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        await self._log(ctx, ["activated", ctx.run_id, ctx.restored])

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        await self._log(ctx, ["settled", ctx.run_id, info.error])


class EventLog(stead.Hooks):
    def __init__(self) -> None:
        self.events: list[stead.Event] = []

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        self.events.append(event)


async def ledger_of(system: stead.AgentSystem, agent_id: str) -> list[list[Any]]:
    async with system.store.transaction() as tx:
        return json.loads(await tx.get(agent_id, "kv.a.ledger") or "[]")


async def queued_ids(system: stead.AgentSystem, agent_id: str) -> list[str]:
    async with system.store.transaction() as tx:
        return [json.loads(v)["id"] for _, v in await tx.read_prefix(agent_id, "q.") if v]


async def pending_of(system: stead.AgentSystem, agent_id: str) -> str | None:
    async with system.store.transaction() as tx:
        return await tx.get(agent_id, "pending")


def answer_to(request: stead.ProviderRequest) -> list[stead.Block]:
    return [stead.Text(f"answer to {request.messages[-1].text}")]


async def answering(path: Path, hooks: stead.Hooks) -> stead.AgentSystem:
    """A system on `path` whose model answers every message with `answer to <its text>`."""
    return await stead.open(url_of(path), providers={"scripted": ScriptedProvider(answer_to)}, hooks=hooks)


def streaming(request: stead.ProviderRequest) -> ScriptedResponse:
    """A response whose first block completes quickly and whose second block streams slowly."""
    return ScriptedResponse(
        blocks=[stead.Text("first block"), stead.Text("second block streams for a long time " * 20)],
        chunk=8,
        delay_between=0.02,
    )


# ---------------------------------------------------------------------------------------------- X1
async def test_X1_abort_mid_stream_keeps_finished_blocks_and_emits_one_cancelled_done(tmp_path: Path) -> None:
    log = EventLog()
    provider = ScriptedProvider(streaming)
    async with await stead.open(
        url_of(tmp_path / "x1.db"), providers={"scripted": provider}, hooks=log
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=[])
        events = agent.events()
        await agent.send("talk", id="talkmessage")
        async for ev in events:
            # the first block is durable and the second one is streaming
            if isinstance(ev, stead.TextDelta) and any(isinstance(e, stead.BlockEnd) for e in log.events):
                break
        await agent.abort()
        assert not agent.active
        history = await agent.history()
        assert await pending_of(system, agent.id) is None
    seen = log.events
    assert [type(e) for e in seen[-2:]] == [stead.Done, stead.Settled]  # the turn ends, then the run
    dones = [e for e in seen if isinstance(e, stead.Done)]
    assert [d.reason for d in dones] == ["cancelled"]
    assert any(isinstance(e, stead.BlockReset) for e in seen)  # the streaming block was dropped
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[0].id == "talkmessage"
    assert [b.text for b in history[1].content if isinstance(b, stead.Text)] == ["first block"]


async def test_X1_abort_mid_stream_records_a_cancelled_prompt_step_and_run(tmp_path: Path) -> None:
    """The inference cut by an abort still gets its end recorded (a cancelled prompt step) and the run is
    recorded as cancelled — in the abort's own transaction."""
    provider = ScriptedProvider(streaming)
    async with await stead.open(url_of(tmp_path / "x1r.db"), providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m", tools=[])
        events = agent.events()
        await agent.send("talk")
        async for ev in events:
            if isinstance(ev, stead.TextDelta):
                break
        await agent.abort()
        (run,) = await system.runs(agent_id=agent.id)
        full = await system.run(run.id)
    assert full.status == "cancelled"
    prompts = [s for s in full.steps if s.type == "prompt"]
    assert [s.status for s in prompts] == ["cancelled"]


async def test_X1_abort_during_tools_gives_running_calls_aborted_results(tmp_path: Path) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @stead.tool
    async def wait_forever() -> str:
        "Never finishes by itself."
        try:
            await hang(started)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    batch = [stead.ToolCall("wait_forever", {}), stead.ToolCall("wait_forever", {})]
    provider = ScriptedProvider(calls_then_text(batch))
    log = EventLog()
    async with await stead.open(
        url_of(tmp_path / "x1b.db"), providers={"scripted": provider}, tools=[wait_forever], hooks=log
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["wait_forever"])
        await agent.send("go")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        await agent.abort()
        assert cancelled.is_set()
        assert not agent.active
        history = await agent.history()
    seen = log.events
    results = assert_one_result_per_call(history)
    assert len(results) == 2
    assert all(r.is_error and "Aborted" in r.output for r in results.values())
    assert [d.reason for d in seen if isinstance(d, stead.Done)] == ["tool_call", "cancelled"]
    assert [type(e) for e in seen[-2:]] == [stead.Done, stead.Settled]
    assert len(provider.requests) == 1  # no inference after the abort


async def test_X1_queued_messages_stay_queued_but_the_agent_settles(tmp_path: Path) -> None:
    answers: list[str] = []

    def respond(request: stead.ProviderRequest) -> ScriptedResponse | list[stead.Block]:
        last = request.messages[-1].text
        if last == "first":
            return streaming(request)
        answers.append(last)
        return [stead.Text(f"answer to {last}")]

    async with await stead.open(
        url_of(tmp_path / "x1c.db"), providers={"scripted": ScriptedProvider(respond)}
    ) as system:
        agent = await system.create(provider="scripted", model="m")
        events = agent.events()
        await agent.send("first", id="firstmsg")
        async for ev in events:
            if isinstance(ev, stead.TextDelta):
                break
        await agent.send("second", id="secondmsg")  # waits behind the streaming response
        await agent.abort()
        assert not agent.active
        assert await pending_of(system, agent.id) is None
        assert await queued_ids(system, agent.id) == ["secondmsg"]
        assert "secondmsg" not in [m.id for m in await agent.history()]
        # a message sent after the abort still gets its turn; the queued one is answered first
        await agent.send("third", id="thirdmsg")
        await agent.wait_idle(timeout=TIMEOUT)
        assert await queued_ids(system, agent.id) == []
        users = [m.id for m in await agent.history() if m.role == "user"]
    assert users == ["firstmsg", "secondmsg", "thirdmsg"]
    assert answers == ["second", "third"]


# ---------------------------------------------------------------------------------------------- X2
async def test_X2_settlement_is_one_transaction(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    class Inspect(Ledger):
        async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            tx = ctx.tx
            assert tx is not None
            seen["pending"] = await tx.get(ctx.agent_id, "pending")
            seen["run_kv"] = await tx.read_prefix(ctx.agent_id, "kv.r.")
            await super().settled_tx(ctx, info)

    class Boom(stead.Hooks):
        calls = 0

        async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            Boom.calls += 1
            if Boom.calls == 1:
                raise RuntimeError("settlement refused once")

    @stead.tool
    async def note(ctx: stead.ToolContext) -> str:
        "Write run-scoped state."
        async with ctx.store.transaction() as tx:
            await tx.write(ctx.agent_id, "kv.r.scratch", "1")
        return "noted"

    async with await stead.open(
        url_of(tmp_path / "x2.db"),
        providers={"scripted": ScriptedProvider(calls_then_text([stead.ToolCall("note", {})]))},
        tools=[note],
        hooks=[Inspect(), Boom()],
    ) as system:
        system._env.store_retry_delay = 0.001
        agent = await system.create(provider="scripted", model="m", tools=["note"])
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        assert not agent.active
        ledger = await ledger_of(system, agent.id)
        async with system.store.transaction() as tx:
            run_kv = await tx.read_prefix(agent.id, "kv.r.")
    # inside the settle hook the pending record and the run KV were already gone (same transaction)
    assert seen == {"pending": None, "run_kv": []}
    assert run_kv == []
    # the refused settlement rolled back whole (its ledger entry too); the retry settled exactly once
    assert [e[0] for e in ledger] == ["activated", "settled"]


async def test_X2_work_accepted_while_settling_reopens_the_run(tmp_path: Path) -> None:
    holder: dict[str, Any] = {}
    sent: list[asyncio.Task[stead.Acceptance]] = []

    class SendWhileSettling(Ledger):
        async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            await super().settled_tx(ctx, info)
            if not sent:
                # another caller sends while the settlement transaction is still open
                sent.append(
                    asyncio.get_running_loop().create_task(holder["agent"].send("late", id="latemsg"))
                )
                for _ in range(10):  # let that send reach the store (it waits for this transaction)
                    await asyncio.sleep(0)

    async with await answering(tmp_path / "x2b.db", SendWhileSettling()) as system:
        agent = await system.create(provider="scripted", model="m")
        holder["agent"] = agent
        await agent.send("early", id="earlymsg")
        await agent.wait_idle(timeout=TIMEOUT)
        assert sent and (await asyncio.wait_for(sent[0], TIMEOUT)).created
        await agent.wait_idle(timeout=TIMEOUT)
        assert not agent.active
        history = await agent.history()
        ledger = await ledger_of(system, agent.id)
        assert await queued_ids(system, agent.id) == []
    assert [m.text for m in history] == ["early", "answer to early", "late", "answer to late"]
    # two active periods, each activated and settled exactly once
    assert [e[0] for e in ledger] == ["activated", "settled", "activated", "settled"]
    assert ledger[0][1] == ledger[1][1] != ledger[2][1] == ledger[3][1]


async def test_X2_work_accepted_inside_the_settlement_transaction_is_not_stranded(tmp_path: Path) -> None:
    holder: dict[str, Any] = {}

    class SendInsideSettlement(Ledger):
        async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            await super().settled_tx(ctx, info)
            if "done" not in holder:
                holder["done"] = True
                # accepted in the settlement's own transaction (A6): committed together with it
                await holder["agent"].send("follow-up", id="followupmsg")

    async with await answering(tmp_path / "x2c.db", SendInsideSettlement()) as system:
        agent = await system.create(provider="scripted", model="m")
        holder["agent"] = agent
        await agent.send("hello", id="hellomsg")
        await agent.wait_idle(timeout=TIMEOUT)
        durable_pending = await pending_of(system, agent.id)
        queued = await queued_ids(system, agent.id)
        history = await agent.history()
        active = agent.active
    assert (durable_pending, queued, active) == (None, [], False)
    assert [m.text for m in history] == ["hello", "answer to hello", "follow-up", "answer to follow-up"]


# ---------------------------------------------------------------------------------------------- X3
async def test_X3_activation_and_settlement_fire_once_per_active_period_across_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x3.db"
    started = asyncio.Event()
    block = [True]

    @stead.tool(durable=True)
    async def build() -> str:
        "A long build."
        if block[0]:
            await hang(started)
        return "built"

    respond = calls_then_text([stead.ToolCall("build", {})])
    faults = stead.store.Faults()
    system = await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(respond)},
        tools=[build],
        hooks=Ledger(),
        faults=faults,
    )
    agent = await system.create(provider="scripted", model="m", tools=["build"])
    await agent.send("build it")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    await crash(system, faults)
    block[0] = False

    observed = EventLog()
    async with await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(respond)},
        tools=[build],
        hooks=[Ledger(), observed],
    ) as system2:
        again = await system2.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        assert not again.active
        # a second active period in the same process
        await again.send("again")
        await again.wait_idle(timeout=TIMEOUT)
        ledger = await ledger_of(system2, agent.id)
    assert [(e[0], e[2]) for e in ledger] == [
        ("activated", False),
        ("activated", True),  # the first stage after the restart announces restored=True ...
        ("settled", None),  # ... and the period still settles exactly once
        ("activated", False),
        ("settled", None),
    ]
    assert ledger[0][1] == ledger[1][1] == ledger[2][1] != ledger[3][1]
    activations = [(e.run_id, e.restored) for e in observed.events if isinstance(e, stead.Activated)]
    assert activations == [(ledger[1][1], True), (ledger[3][1], False)]
    assert [e.run_id for e in observed.events if isinstance(e, stead.Settled)] == [ledger[2][1], ledger[4][1]]


# ---------------------------------------------------------------------------------------------- X4
async def test_X4_drain_stops_before_the_next_request_and_a_new_system_finishes(tmp_path: Path) -> None:
    path = tmp_path / "x4.db"
    started = asyncio.Event()
    release = asyncio.Event()

    @stead.tool
    async def step() -> str:
        "A step."
        started.set()
        await release.wait()
        return "stepped"

    respond = calls_then_text([stead.ToolCall("step", {})])
    first = ScriptedProvider(respond)
    system = await stead.open(url_of(path), providers={"scripted": first}, tools=[step], hooks=Ledger())
    agent = await system.create(provider="scripted", model="m", tools=["step"])
    await agent.send("go")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    drained = asyncio.ensure_future(system.drain())
    release.set()  # drain does not cancel the running tool; its result still commits
    await asyncio.wait_for(drained, TIMEOUT)
    assert len(first.requests) == 1  # stopped before the next provider request
    assert agent.active and await pending_of(system, agent.id) is not None
    await asyncio.wait_for(system.close(), TIMEOUT)

    second = ScriptedProvider(respond)
    async with await stead.open(
        url_of(path), providers={"scripted": second}, tools=[step], hooks=Ledger()
    ) as system2:
        again = await system2.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        history = await again.history()
        ledger = await ledger_of(system2, agent.id)
    assert len(second.requests) == 1
    assert_one_result_per_call(history)
    assert history[-1].text == "answered after 1 results"
    assert [(e[0], e[2]) for e in ledger] == [("activated", False), ("activated", True), ("settled", None)]


async def test_X4_close_waits_for_admitted_work(tmp_path: Path) -> None:
    path = tmp_path / "x4b.db"
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    system = await stead.open(url_of(path), providers={"scripted": provider})
    agent = await system.create(provider="scripted", model="m")
    sends = [asyncio.ensure_future(agent.send(f"message {i}", id=f"closemsg{i}")) for i in range(5)]
    await asyncio.sleep(0)  # one scheduling round: every send is admitted (waiting for its commit)
    await asyncio.wait_for(system.close(), TIMEOUT)
    acceptances = [s.result() for s in sends]  # all admitted sends were written and answered
    assert all(a.created for a in acceptances)
    with pytest.raises(stead.Closed):
        await agent.send("too late")
    async with await stead.open(url_of(path), providers={"scripted": provider}) as system2:
        again = await system2.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        users = [m.id for m in await again.history() if m.role == "user"]
    assert users == [f"closemsg{i}" for i in range(5)]


async def test_X4_close_from_inside_a_tool_raises_instead_of_hanging(tmp_path: Path) -> None:
    holder: dict[str, Any] = {}

    @stead.tool
    async def shutdown() -> str:
        "Try to close the system from inside the agent."
        try:
            await asyncio.wait_for(holder["system"].close(), TIMEOUT)
        except stead.CloseFromInside as e:
            return f"refused: {type(e).__name__}"
        return "closed?!"

    provider = ScriptedProvider(calls_then_text([stead.ToolCall("shutdown", {})]))
    system = await stead.open(
        url_of(tmp_path / "x4c.db"), providers={"scripted": provider}, tools=[shutdown], retry=FAST_RETRY
    )
    holder["system"] = system
    agent = await system.create(provider="scripted", model="m", tools=["shutdown"])
    await agent.send("shut down")
    await asyncio.wait_for(system.close(), TIMEOUT)  # the close requested from inside completes
    with pytest.raises(stead.Closed):
        await agent.send("more")
    async with await stead.open(
        url_of(tmp_path / "x4c.db"), providers={"scripted": provider}, tools=[shutdown]
    ) as s2:
        history = await (await s2.get(agent.id)).history()
    results = assert_one_result_per_call(history)
    assert [r.output for r in results.values()] == ["refused: CloseFromInside"]
