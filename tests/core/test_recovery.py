"""Recovery promises R1–R4 (docs/promises.md): what a restarted process does with the work it inherits."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import stead
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import url_of
from tests.fakes.crash_points import crash
from tests.fakes.tools import hang
from tests.tools.test_tools import FAST_RETRY, TIMEOUT, assert_one_result_per_call, calls_then_text


class Ledger(stead.Hooks):
    """Remembers activation and settlement hook calls (in memory: fine for a single process here)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, bool]] = []

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        self.events.append(("activated", ctx.run_id, ctx.restored))

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.events.append(("settled", ctx.run_id, False))


class OpRecorder(stead.store.Faults):
    """A fault plan that injects nothing and records the name of every store operation."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def check(self, op: str) -> None:
        self.names.append(op)
        super().check(op)


# ---------------------------------------------------------------------------------------------- R1
async def test_R1_only_the_pending_record_decides_whether_a_restarted_agent_is_active(tmp_path: Path) -> None:
    path = tmp_path / "r1.db"
    provider = ScriptedProvider(lambda r: [stead.Text("hi")])
    async with await stead.open(url_of(path), providers={"scripted": provider}) as system:
        answered = await system.create(provider="scripted", model="m")
        await answered.send("hello")
        await answered.wait_idle(timeout=TIMEOUT)
        unanswered = await system.create(provider="scripted", model="m")
        garbled = await system.create(provider="scripted", model="m")
        idle = await system.create(provider="scripted", model="m")
    # a conversation ending with a user message but no pending record is not work; an unreadable
    # pending record counts as absent; a pending record with an empty conversation is work.
    async with (
        await stead.open(url_of(path), providers={"scripted": provider}) as system,
        system.store.transaction() as tx,
    ):
        await tx.append(unanswered.id, [json.dumps({"k": "u", "id": "orphanmsg01", "r": "user", "c": []})])
        await tx.write(garbled.id, "pending", "{not json")
        await tx.write(idle.id, "pending", json.dumps({"st": "inference", "run": "runrestored01"}))
    ledger = Ledger()
    async with await stead.open(url_of(path), providers={"scripted": provider}, hooks=ledger) as system:
        assert system.restored == [idle.id]
        restored = await system.get(idle.id)
        await restored.wait_idle(timeout=TIMEOUT)
        assert not restored.active
        for other in (answered, unanswered, garbled):
            assert not (await system.get(other.id)).active
        listed = {a.id: a.active for a in await system.agents()}
        assert listed == {answered.id: False, unanswered.id: False, garbled.id: False, idle.id: False}
        # the restored period settled without an inference (nothing was owed but the record)
        assert ledger.events == [("activated", "runrestored01", True), ("settled", "runrestored01", False)]
    assert len(provider.requests) == 1


# ---------------------------------------------------------------------------------------------- R2
async def test_R2_restart_finishes_the_dispatched_batch_before_new_messages(tmp_path: Path) -> None:
    path = tmp_path / "r2.db"
    started = asyncio.Event()
    block = [True]

    @stead.tool(durable=True)
    async def fetch(ctx: stead.ToolContext) -> str:
        "Fetch."
        if block[0]:
            await hang(started)
        return "fetched"

    first_only = calls_then_text([stead.ToolCall("fetch", {})])

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if len([m for m in request.messages if m.role == "user"]) > 1:
            return [stead.Text("second answered")]
        return first_only(request)

    faults = stead.store.Faults()
    ledger = Ledger()
    system = await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(respond)},
        tools=[fetch],
        hooks=ledger,
        faults=faults,
    )
    agent = await system.create(provider="scripted", model="m", tools=["fetch"])
    await agent.send("first", id="firstmessage")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    await agent.send("second", id="secondmessage")  # queued behind the running batch
    await crash(system, faults)
    block[0] = False

    provider = ScriptedProvider(respond)
    async with await stead.open(
        url_of(path), providers={"scripted": provider}, tools=[fetch], hooks=ledger
    ) as system2:
        again = await system2.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        history = await again.history()
    assert_one_result_per_call(history)
    roles = [(m.role, m.id if m.role == "user" else None) for m in history]
    assert roles == [
        ("user", "firstmessage"),
        ("assistant", None),
        ("tool", None),  # the inherited batch's result comes first ...
        ("assistant", None),
        ("user", "secondmessage"),  # ... then the message that waited in the queue
        ("assistant", None),
    ]
    # lifecycle ids are reused: one run, announced restored=True by the new process, settled once
    run_ids = {run for _, run, _ in ledger.events}
    assert len(run_ids) == 1
    assert [(kind, restored) for kind, _, restored in ledger.events] == [
        ("activated", False),
        ("activated", True),
        ("settled", False),
    ]


async def test_R2_an_inference_that_produced_a_block_is_retired_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "r2b.db"
    first_block_durable = asyncio.Event()

    def slow(request: stead.ProviderRequest) -> ScriptedResponse:
        return ScriptedResponse(
            blocks=[stead.Text("part one"), stead.Text("part two, which never completes")],
            chunk=4,
            delay_between=0.05,
        )

    faults = stead.store.Faults()
    live = ScriptedProvider(slow)
    system = await stead.open(url_of(path), providers={"scripted": live}, faults=faults)
    agent = await system.create(provider="scripted", model="m")
    events = agent.events()
    await agent.send("go")
    async for ev in events:
        if isinstance(ev, stead.BlockEnd):  # emitted only after the block is durable
            first_block_durable.set()
            break
    await crash(system, faults)

    restarted = ScriptedProvider(lambda r: [stead.Text("fresh answer")])
    async with await stead.open(url_of(path), providers={"scripted": restarted}) as system2:
        again = await system2.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        history = await again.history()
    assert len(live.requests) == 1 and len(restarted.requests) == 1
    assert restarted.requests[0].inference_id != live.requests[0].inference_id
    texts = [b.text for m in history if m.role == "assistant" for b in m.content if isinstance(b, stead.Text)]
    assert texts == ["part one", "fresh answer"]  # the half-streamed block was dropped


async def test_R2_an_open_request_without_output_is_asked_again_identically(tmp_path: Path) -> None:
    path = tmp_path / "r2c.db"
    asked = asyncio.Event()

    async def hang(request: stead.ProviderRequest) -> list[stead.Block]:
        asked.set()
        await asyncio.Event().wait()
        return []

    faults = stead.store.Faults()
    live = ScriptedProvider(hang)
    system = await stead.open(url_of(path), providers={"scripted": live}, faults=faults)
    agent = await system.create(provider="scripted", model="m")
    await agent.send("go")
    await asyncio.wait_for(asked.wait(), TIMEOUT)
    await crash(system, faults)
    restarted = ScriptedProvider(lambda r: [stead.Text("answer")])
    async with await stead.open(url_of(path), providers={"scripted": restarted}) as system2:
        await (await system2.get(agent.id)).wait_idle(timeout=TIMEOUT)
    # nothing durable came of the request (its message stayed queued): it is asked again, identically
    assert len(restarted.requests) == 1
    assert restarted.requests[0].messages == live.requests[0].messages


# ---------------------------------------------------------------------------------------------- R3
def _load_bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "restore.py"
    spec = importlib.util.spec_from_file_location("stead_bench_restore", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_R3_restore_reads_only_agents_owing_work(tmp_path: Path) -> None:
    bench = _load_bench()
    path = tmp_path / "r3.db"
    owing = await bench.build(path, idle=500, owing=10, history=4)
    assert len(owing) == 10
    recorder = OpRecorder()
    system = await stead.open(
        url_of(path), providers={"scripted": ScriptedProvider(bench.never_answer)}, faults=recorder
    )
    try:
        # opening restored exactly the owing agents, with one query over small records: no transcript
        assert sorted(system.restored) == sorted(owing)
        assert "load" not in recorder.names and "list_agents" not in recorder.names
        assert len(recorder.names) <= 3, recorder.names
        agents = await system.agents()
        assert sum(a.active for a in agents) == 10 and len(agents) == 510
    finally:
        system.abandon()
        await system.store.close()


# ---------------------------------------------------------------------------------------------- R4
async def test_R4_provider_request_after_restart_equals_the_one_before_the_crash(tmp_path: Path) -> None:
    path = tmp_path / "r4.db"
    second_request = asyncio.Event()

    @stead.tool
    async def lookup(q: str) -> str:
        "Look something up."
        return f"result for {q}"

    def script(request: stead.ProviderRequest) -> list[stead.Block]:
        if not any(m.role == "tool" for m in request.messages):
            return [
                stead.Reasoning("I should look it up", signature="sig-abc"),
                stead.Text("Let me check."),
                stead.ToolCall("lookup", {"q": "weather"}),
            ]
        return [stead.Text("It is sunny.")]

    async def live_respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if any(m.role == "tool" for m in request.messages):
            second_request.set()
            await asyncio.Event().wait()  # the process dies while this request is open
        return script(request)

    faults = stead.store.Faults()
    live = ScriptedProvider(live_respond)
    system = await stead.open(
        url_of(path), providers={"scripted": live}, tools=[lookup], faults=faults, retry=FAST_RETRY
    )
    agent = await system.create(provider="scripted", model="m", instructions="be exact", tools=["lookup"])
    await agent.send("weather?", metadata={"from": "test"})
    await asyncio.wait_for(second_request.wait(), TIMEOUT)
    await crash(system, faults)

    restarted = ScriptedProvider(script)
    async with await stead.open(
        url_of(path), providers={"scripted": restarted}, tools=[lookup], retry=FAST_RETRY
    ) as system2:
        await (await system2.get(agent.id)).wait_idle(timeout=TIMEOUT)
    before, after = live.requests[-1], restarted.requests[0]
    assert after.messages == before.messages
    assert after.inference_id == before.inference_id  # R2: the persisted, unanswered inference id is reused
    assert (after.model, after.instructions, after.tools) == (before.model, before.instructions, before.tools)
    reasoning = [b for m in after.messages for b in m.content if isinstance(b, stead.Reasoning)]
    assert reasoning == [stead.Reasoning("I should look it up", signature="sig-abc")]
