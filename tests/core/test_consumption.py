"""Consumption and turns C1–C6, and permission modes carried by messages (P1) (docs/promises.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import stead
from stead._ids import new_id
from stead.core import records as R
from stead.core.records import Queued
from stead.extend import (
    BeforeToolCallInfo,
    MessageConsumedInfo,
    PermissionModeChangedInfo,
    SettledInfo,
    ToolResultInfo,
)
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from stead.store import Faults
from tests.conftest import conversation_records

TIMEOUT = 5.0
NO_WAIT = stead.RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0)


class Gate:
    """A responder that blocks each request until released (once released, it stays open)."""

    def __init__(self, answer: Callable[[stead.ProviderRequest], Any] | None = None) -> None:
        self.requests: list[stead.ProviderRequest] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.answer = answer or (lambda r: [stead.Text(f"re: {r.messages[-1].text}")])

    async def __call__(self, request: stead.ProviderRequest) -> Any:
        self.requests.append(request)
        self.started.set()
        await asyncio.wait_for(self.release.wait(), TIMEOUT)
        return self.answer(request)


@asynccontextmanager
async def first_in_flight(
    db_url: str, **settings: Any
) -> AsyncIterator[tuple[stead.AgentSystem, stead.Agent, Gate]]:
    """A system whose agent (created with `settings`) has sent "first": its request is in flight, waiting
    on the yielded `Gate` until the test releases it."""
    gate = Gate()
    async with await stead.open(db_url, providers={"p": ScriptedProvider(gate)}) as system:
        agent = await system.create(provider="p", **settings)
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        yield system, agent, gate


async def kv(system: stead.AgentSystem, agent_id: str, prefix: str = "") -> dict[str, str]:
    async with system.store.transaction() as tx:
        return dict(await tx.read_prefix(agent_id, prefix))


async def records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    return await conversation_records(system, agent_id)


def users(request: stead.ProviderRequest) -> list[str]:
    return [m.text for m in request.messages if m.role == "user"]


def texts(history: list[stead.Message], role: str = "user") -> list[str]:
    return [m.text for m in history if m.role == role]


# ---------------------------------------------------------------------------------------------- C1
class Stepper:
    """A provider whose stream stops at points the test controls."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.first_block = asyncio.Event()
        self.at_second_block = asyncio.Event()
        self.finish = asyncio.Event()

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        self.started.set()
        await asyncio.wait_for(self.first_block.wait(), TIMEOUT)
        yield stead.TextDelta("a")
        yield stead.BlockEnd(stead.Text("a"))
        yield stead.TextDelta("b")
        self.at_second_block.set()
        await asyncio.wait_for(self.finish.wait(), TIMEOUT)
        yield stead.BlockEnd(stead.Text("b"))
        yield stead.Done("stop")


async def test_C1_consumption_moves_the_message_from_queue_to_history_in_one_transaction(db_url: str) -> None:
    stepper = Stepper()
    consumed: list[stead.Event] = []

    class Watch(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.MessageConsumed):
                consumed.append(event)

    async with await stead.open(db_url, providers={"p": stepper}, hooks=Watch()) as system:
        agent = await system.create(provider="p")
        acc = await agent.send("hello")
        await asyncio.wait_for(stepper.started.wait(), TIMEOUT)
        # the request is in flight: consumption is only staged, the message is still queued
        assert len(await kv(system, agent.id, "q.")) == 1
        assert await records(system, agent.id) == []
        assert consumed == []
        stepper.first_block.set()
        await asyncio.wait_for(stepper.at_second_block.wait(), TIMEOUT)
        # the first completed block committed together with the consumption
        assert await kv(system, agent.id, "q.") == {}
        recs = await records(system, agent.id)
        assert [r["k"] for r in recs] == ["u", "b"]
        assert recs[0]["id"] == acc.id
        assert len(consumed) == 1
        stepper.finish.set()
        await agent.wait_idle(TIMEOUT)
        assert [r["k"] for r in await records(system, agent.id)] == ["u", "b", "b"]
        assert len(consumed) == 1


async def test_C1_crash_at_any_operation_leaves_the_message_queued_or_in_history_never_both_nor_neither(
    tmp_path: Path,
) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("one"), stead.Text("two")])
    crashes = 0
    for k in range(200):  # crash at each store operation of the conversation in turn
        url = f"sqlite:///{tmp_path / f'c1-{k}.db'}?synchronous=normal"
        faults = Faults()
        system = await stead.open(url, providers={"p": provider}, faults=faults)
        agent = await system.create(provider="p")
        mid = new_id()
        faults.crash_at = faults.ops + k
        try:
            await agent.send("hello", id=mid)
            await agent.wait_idle(TIMEOUT)
        except stead.StoreCrashed:
            pass
        if not faults.crashed:
            await system.close()
            break
        crashes += 1
        system.abandon()
        async with await stead.open(url, providers={"p": provider}) as system:
            async with system.store.transaction() as tx:
                accepted = await tx.get(agent.id, R.msg_key(mid)) is not None
                queued = [Queued.decode(q, v).id for q, v in await tx.read_prefix(agent.id, R.QUEUE) if v]
                in_history = [r["id"] for r in map(json.loads, await tx.load(agent.id)) if r["k"] == "u"]
            if not accepted:
                assert queued == [] and in_history == [], f"crash at {k}"
                continue
            assert len(queued) + len(in_history) == 1, f"crash at {k}: queued={queued} history={in_history}"
            restarted = await system.get(agent.id)
            await restarted.wait_idle(TIMEOUT)
            history = await restarted.history()
            assert texts(history) == ["hello"], f"crash at {k}"
            assert history[-1].role == "assistant"
    assert crashes > 5


async def test_C1_memory_changes_only_after_commit(db_url: str) -> None:
    """A consumption whose transaction rolls back (a failing hook) leaves memory untouched: the retried
    inference sees the message once, and it is announced once."""

    class FailOnce(stead.Hooks):
        def __init__(self) -> None:
            self.failed = False
            self.consumed: list[str] = []

        async def message_consumed_tx(self, ctx: stead.HookContext, info: MessageConsumedInfo) -> None:
            if not self.failed:
                self.failed = True
                raise RuntimeError("hook failed once")

        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.MessageConsumed):
                self.consumed.append(event.message.text)

    hooks = FailOnce()
    provider = ScriptedProvider(lambda r: [stead.Text("answer")])
    async with await stead.open(db_url, providers={"p": provider}, hooks=hooks) as system:
        agent = await system.create(provider="p")
        await agent.send("hello")
        await agent.wait_idle(TIMEOUT)
        assert hooks.failed
        assert len(provider.requests) == 2
        assert [m.text for m in provider.requests[1].messages] == ["hello"]
        assert hooks.consumed == ["hello"]
        history = await agent.history()
        assert [(m.role, m.text) for m in history] == [("user", "hello"), ("assistant", "answer")]
        assert agent._rt.messages() == history


# ---------------------------------------------------------------------------------------------- C2
async def test_C2_steering_outranks_sends(db_url: str) -> None:
    async with first_in_flight(db_url) as (_, agent, gate):
        await agent.send("send 1")
        await agent.send("send 2")
        await agent.steer("steer 1")
        await agent.steer("steer 2")
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert texts(await agent.history()) == ["first", "steer 1", "steer 2", "send 1", "send 2"]
        assert [users(r)[-1] for r in gate.requests] == ["first", "steer 1", "steer 2", "send 1", "send 2"]


tool_gate: dict[str, asyncio.Event] = {}


@stead.tool
async def slow(n: int) -> str:
    "Wait until the test releases the call."
    tool_gate["started"].set()
    await asyncio.wait_for(tool_gate["release"].wait(), TIMEOUT)
    return f"slow {n}"


def one_tool_round(request: stead.ProviderRequest) -> list[stead.Block]:
    """Call `slow` once after the first user message, then answer every later request with text."""
    if len(request.messages) == 1:
        return [stead.ToolCall("slow", {"n": 1})]
    return [stead.Text(f"re: {request.messages[-1].role} {request.messages[-1].text}")]


@asynccontextmanager
async def tool_in_flight(db_url: str) -> AsyncIterator[tuple[stead.Agent, ScriptedProvider]]:
    """An agent that sent "start" and whose one `slow` call is running (until `tool_gate["release"]`)."""
    tool_gate["release"] = asyncio.Event()
    tool_gate["started"] = asyncio.Event()
    provider = ScriptedProvider(one_tool_round)
    async with await stead.open(db_url, providers={"p": provider}, tools=[slow]) as system:
        agent = await system.create(provider="p", tools=["slow"])
        await agent.send("start")
        await asyncio.wait_for(tool_gate["started"].wait(), TIMEOUT)
        yield agent, provider


async def test_C2_sends_wait_for_tool_results_and_owed_inference(db_url: str) -> None:
    async with tool_in_flight(db_url) as (agent, provider):
        await agent.send("later")
        tool_gate["release"].set()
        await agent.wait_idle(TIMEOUT)
        # the inference owed after the tool results ran without the send; the send came after the answer
        assert len(provider.requests) == 3
        assert [m.role for m in provider.requests[1].messages] == ["user", "assistant", "tool"]
        assert users(provider.requests[1]) == ["start"]
        assert users(provider.requests[2])[-1] == "later"
        assert [m.role for m in await agent.history()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]


async def test_C2_steering_joins_at_the_next_boundary_after_tool_results(db_url: str) -> None:
    async with tool_in_flight(db_url) as (agent, provider):
        await agent.send("a send")
        await agent.steer("a steer")
        tool_gate["release"].set()
        await agent.wait_idle(TIMEOUT)
        assert len(provider.requests) == 3
        assert [m.role for m in provider.requests[1].messages] == ["user", "assistant", "tool", "user"]
        assert users(provider.requests[1]) == ["start", "a steer"]
        assert users(provider.requests[2]) == ["start", "a steer", "a send"]


@pytest.mark.parametrize("delivery", ["send", "steer"])
async def test_C2_queue_mode_all_consumes_every_queued_message_at_once(db_url: str, delivery: str) -> None:
    async with first_in_flight(db_url, send_mode="all", steering_mode="all") as (_, agent, gate):
        await agent.deliver([stead.Input(f"m{i}", delivery=delivery) for i in range(3)])  # type: ignore[arg-type]
        await agent.deliver([stead.Input("m3", delivery=delivery)])  # type: ignore[arg-type]
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 2
        assert users(gate.requests[1]) == ["first", "m0", "m1", "m2", "m3"]


async def test_C2_queue_mode_one_at_a_time_is_the_default(db_url: str) -> None:
    async with first_in_flight(db_url) as (_, agent, gate):
        await agent.deliver([stead.Input(f"m{i}") for i in range(3)])
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert [users(r)[-1] for r in gate.requests] == ["first", "m0", "m1", "m2"]


async def test_C2_invalid_queue_mode_is_refused(db_url: str) -> None:
    async with await stead.open(db_url, providers={"p": ScriptedProvider(lambda r: [])}) as system:
        with pytest.raises(stead.InvalidInput):
            await system.create(provider="p", send_mode="batch")


# ---------------------------------------------------------------------------------------------- C3
async def test_C3_message_settings_take_effect_at_consumption_and_survive_restarts(db_url: str) -> None:
    async with first_in_flight(db_url, model="base") as (system, agent, gate):
        aid = agent.id
        await agent.send("switch", model="m2", effort="high")
        # accepted but not consumed: no effect yet
        assert agent.settings["model"] == "base"
        assert "settings" not in await kv(system, aid, "settings")
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert [(r.model, r.effort) for r in gate.requests] == [("base", None), ("m2", "high")]
        assert agent.settings["model"] == "m2" and agent.settings["effort"] == "high"
        stored = json.loads((await kv(system, aid, "settings"))["settings"])
        assert stored["model"] == "m2" and stored["effort"] == "high"

    provider2 = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with await stead.open(db_url, providers={"p": provider2}) as system:
        agent = await system.get(aid)
        assert agent.settings["model"] == "m2" and agent.settings["effort"] == "high"
        await agent.send("after restart")
        await agent.wait_idle(TIMEOUT)
        assert [(r.model, r.effort) for r in provider2.requests] == [("m2", "high")]
        # a later message carrying nothing keeps the settings; one carrying a value changes only that
        await agent.send("cheaper", effort="low")
        await agent.wait_idle(TIMEOUT)
        assert (provider2.requests[-1].model, provider2.requests[-1].effort) == ("m2", "low")


async def test_C3_provider_and_profile_travel_with_messages(db_url: str) -> None:
    first = ScriptedProvider(lambda r: [stead.Text("from first")])
    second = ScriptedProvider(lambda r: [stead.Text("from second")])
    async with await stead.open(db_url, providers={"a": first, "b": second}) as system:
        agent = await system.create(provider="a", model="x")
        await agent.send("one")
        await agent.wait_idle(TIMEOUT)
        await agent.send("two", provider="b", model="y", profile="fast")
        await agent.wait_idle(TIMEOUT)
        assert len(first.requests) == 1 and len(second.requests) == 1
        assert second.requests[0].model == "y"
        assert agent.settings["provider"] == "b" and agent.settings["profile"] == "fast"
        aid = agent.id
    async with await stead.open(db_url, providers={"a": first, "b": second}) as system:
        agent = await system.get(aid)
        await agent.send("three")
        await agent.wait_idle(TIMEOUT)
        assert len(first.requests) == 1 and len(second.requests) == 2


# ---------------------------------------------------------------------------------------------- C4
async def test_C4_a_queue_entry_written_behind_the_kernel_is_consumed(db_url: str) -> None:
    async with first_in_flight(db_url) as (system, agent, gate):
        # another writer (an outer transaction, not the runtime) puts a message in the queue
        injected = new_id()
        async with system.store.transaction() as tx:
            key = R.queue_key(R.SEND, 1, 0)
            await tx.write(
                agent.id,
                key,
                Queued(key, injected, "user", [{"t": "x", "x": "from the store"}], None, {}).encode(),
            )
            await tx.write(agent.id, R.msg_key(injected), "send")
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 2
        assert users(gate.requests[1])[-1] == "from the store"
        history = await agent.history()
        assert texts(history) == ["first", "from the store"]
        assert [m.id for m in history if m.role == "user"][1] == injected


async def test_C4_a_queue_entry_removed_behind_the_kernel_is_not_consumed(db_url: str) -> None:
    async with first_in_flight(db_url) as (system, agent, gate):
        await agent.send("withdrawn")
        await agent.send("kept")
        async with system.store.transaction() as tx:
            for key, raw in await tx.read_prefix(agent.id, R.SEND):
                if Queued.decode(key, raw).content == [{"t": "x", "x": "withdrawn"}]:
                    assert await tx.delete(agent.id, key)
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert texts(await agent.history()) == ["first", "kept"]
        assert len(gate.requests) == 2


async def test_C4_each_turn_reads_the_pending_record_from_the_store(db_url: str) -> None:
    """Withdrawing queued work behind the kernel's back: the end of the turn finds nothing and settles."""
    async with first_in_flight(db_url) as (system, agent, gate):
        await agent.steer("second")
        async with system.store.transaction() as tx:
            await tx.delete_prefix(agent.id, R.STEER)
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 1
        assert not agent.active
        assert "pending" not in await kv(system, agent.id)


# ---------------------------------------------------------------------------------------------- C5
async def test_C5_turn_that_consumed_the_last_work_does_not_buy_an_extra_turn(db_url: str) -> None:
    gate = Gate()
    provider = ScriptedProvider(gate)
    settled: list[stead.Event] = []
    dones: list[stead.Event] = []

    class Watch(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.Settled):
                settled.append(event)
            elif isinstance(event, stead.Done):
                dones.append(event)

    async with await stead.open(db_url, providers={"p": provider}, hooks=Watch()) as system:
        agent = await system.create(provider="p")
        gate.release.set()
        await agent.send("one")
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 1
        gate.release.clear()
        gate.started.clear()
        await agent.send("two")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await agent.send("three")
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 3
        assert len(dones) == 3 and len(settled) == 2
        # the answer to the last message settled in the same commit: no stage ran after it
        ops = system.store.ops
        await asyncio.sleep(0)
        assert system.store.ops == ops


async def test_C5_tool_round_trips_cost_one_inference_each(db_url: str) -> None:
    calls = 0

    @stead.tool
    async def noop() -> str:
        "Do nothing."
        nonlocal calls
        calls += 1
        return "ok"

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        n = sum(1 for m in request.messages if m.role == "tool")
        return [stead.ToolCall("noop", {})] if n < 2 else [stead.Text("finished")]

    provider = ScriptedProvider(respond)
    async with await stead.open(db_url, providers={"p": provider}, tools=[noop]) as system:
        agent = await system.create(provider="p", tools=["noop"])
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        assert calls == 2
        assert len(provider.requests) == 3


# ---------------------------------------------------------------------------------------------- C6
async def test_C6_failed_turn_appends_one_system_record_the_next_inference_sees(db_url: str) -> None:
    def answer(request: stead.ProviderRequest) -> Any:
        if users(request)[-1] == "first":
            return ScriptedResponse(error="model exploded", retryable=False)
        return [stead.Text("fine")]

    gate = Gate(answer)
    provider = ScriptedProvider(gate)
    errors: list[str | None] = []

    class Watch(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.Done):
                errors.append(event.error)

    async with await stead.open(db_url, providers={"p": provider}, hooks=Watch(), retry=NO_WAIT) as system:
        agent = await system.create(provider="p")
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await agent.send("second")  # a provider error does not stop queued messages from being answered
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert len(gate.requests) == 2
        second = gate.requests[1].messages
        assert [(m.role, m.text) for m in second] == [
            ("user", "first"),
            ("system", "The last turn failed: model exploded"),
            ("user", "second"),
        ]
        history = await agent.history()
        assert [(m.role, m.text) for m in history] == [
            *[(m.role, m.text) for m in second],
            ("assistant", "fine"),
        ]
        notes = [r for r in await records(system, agent.id) if r["k"] == "s"]
        assert len(notes) == 1
        assert errors == ["model exploded", None]


async def test_C6_retryable_errors_exhausted_leave_one_note_and_settle_with_the_error(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: ScriptedResponse(error="overloaded", retryable=True))
    settled: list[stead.Settled] = []

    class Watch(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.Settled):
                settled.append(event)

    async with await stead.open(db_url, providers={"p": provider}, hooks=Watch(), retry=NO_WAIT) as system:
        agent = await system.create(provider="p")
        await agent.send("hello")
        await agent.wait_idle(TIMEOUT)
        assert len(provider.requests) == NO_WAIT.max_attempts
        history = await agent.history()
        assert [(m.role, m.text) for m in history] == [
            ("user", "hello"),
            ("system", "The last turn failed: overloaded"),
        ]
        assert [s.error for s in settled] == ["overloaded"]
        # the next message is answered normally and sees the note
        provider._respond = lambda r: [stead.Text("recovered")]  # type: ignore[method-assign]
        await agent.send("again")
        await agent.wait_idle(TIMEOUT)
        assert [m.role for m in provider.requests[-1].messages] == ["user", "system", "user"]
        assert (await agent.history())[-1].text == "recovered"


@pytest.mark.parametrize(
    "response",
    [
        ScriptedResponse(blocks=[stead.Text("partial answer")], done="error"),
        ScriptedResponse(blocks=[], done="error"),
    ],
)
async def test_C6_done_error_from_the_provider_is_a_failed_turn(
    db_url: str, response: ScriptedResponse
) -> None:
    provider = ScriptedProvider(lambda r: response if len(provider.requests) == 1 else [stead.Text("ok")])
    async with await stead.open(db_url, providers={"p": provider}, retry=NO_WAIT) as system:
        agent = await system.create(provider="p")
        await agent.send("hello")
        await agent.wait_idle(TIMEOUT)
        notes = [r["x"] for r in await records(system, agent.id) if r["k"] == "s"]
        assert len(notes) == 1 and notes[0].startswith("The last turn failed: ")
        await agent.send("next")
        await agent.wait_idle(TIMEOUT)
        assert any(m.role == "system" for m in provider.requests[-1].messages)


async def test_C6_an_exception_in_the_provider_fails_the_turn_not_the_agent(db_url: str) -> None:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if len(request.messages) == 1:
            raise KeyError("bug in provider")
        return [stead.Text("ok")]

    provider = ScriptedProvider(respond)
    async with await stead.open(db_url, providers={"p": provider}, retry=NO_WAIT) as system:
        agent = await system.create(provider="p")
        await agent.send("hello")
        await agent.wait_idle(TIMEOUT)
        notes = [r["x"] for r in await records(system, agent.id) if r["k"] == "s"]
        assert len(notes) == 1 and "KeyError" in notes[0]
        await agent.send("again")
        await agent.wait_idle(TIMEOUT)
        assert (await agent.history())[-1].text == "ok"


# ---------------------------------------------------------------------------------------------- P1
tool_modes: list[str] = []
"""The permission mode each `whoami` call ran with."""


class ModeLedger(stead.Hooks):
    """Records the permission mode every hook sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.changes: list[tuple[str, str]] = []

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        self.seen.append(("activated", ctx.permission_mode))

    async def message_consumed_tx(self, ctx: stead.HookContext, info: MessageConsumedInfo) -> None:
        self.seen.append((f"consumed {info.message.text}", ctx.permission_mode))

    async def permission_mode_changed_tx(
        self, ctx: stead.HookContext, info: PermissionModeChangedInfo
    ) -> None:
        self.changes.append((info.old, info.new))
        assert ctx.permission_mode == info.new

    async def response_tx(self, ctx: stead.HookContext, info: stead.ResponseInfo) -> None:
        self.seen.append(("response", ctx.permission_mode))

    async def before_tool_call(
        self, ctx: stead.HookContext, info: BeforeToolCallInfo
    ) -> stead.ToolResult | None:
        self.seen.append(("before_tool_call", ctx.permission_mode))
        return None

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        self.seen.append(("tool_result", ctx.permission_mode))

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.seen.append(("settled", ctx.permission_mode))


@stead.tool
async def whoami(ctx: stead.ToolContext) -> str:
    "Report the permission mode."
    tool_modes.append(ctx.permission_mode)
    return ctx.permission_mode


def call_whoami_once(request: stead.ProviderRequest) -> list[stead.Block]:
    if request.messages[-1].role == "user":
        return [stead.ToolCall("whoami", {})]
    return [stead.Text("done")]


async def test_P1_permission_mode_travels_with_messages_and_takes_effect_at_consumption(db_url: str) -> None:
    tool_modes.clear()
    release = asyncio.Event()
    answering = asyncio.Event()

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if users(request) == ["first"] and request.messages[-1].role == "tool":
            answering.set()
            await asyncio.wait_for(release.wait(), TIMEOUT)
        return call_whoami_once(request)

    provider = ScriptedProvider(respond)
    ledger = ModeLedger()
    async with await stead.open(db_url, providers={"p": provider}, tools=[whoami], hooks=ledger) as system:
        agent = await system.create(provider="p", tools=["whoami"])
        assert agent.settings["permission_mode"] == "auto"
        await agent.send("first")
        await asyncio.wait_for(answering.wait(), TIMEOUT)
        await agent.send("lock down", permission_mode="read_only")
        assert agent.settings["permission_mode"] == "auto"  # accepted, not yet consumed
        release.set()
        await agent.wait_idle(TIMEOUT)
        assert tool_modes == ["auto", "read_only"]
        assert ledger.changes == [("auto", "read_only")]
        assert agent.settings["permission_mode"] == "read_only"
        before = ledger.seen.index(("consumed lock down", "read_only"))
        assert all(mode == "auto" for _, mode in ledger.seen[:before])
        assert all(mode == "read_only" for _, mode in ledger.seen[before:]), ledger.seen[before:]
        aid = agent.id

    ledger2 = ModeLedger()
    async with await stead.open(
        db_url, providers={"p": ScriptedProvider(call_whoami_once)}, tools=[whoami], hooks=ledger2
    ) as system:
        agent = await system.get(aid)
        assert agent.settings["permission_mode"] == "read_only"
        await agent.send("after restart")
        await agent.wait_idle(TIMEOUT)
        assert tool_modes == ["auto", "read_only", "read_only"]
        assert ledger2.changes == []
        assert {mode for _, mode in ledger2.seen} == {"read_only"}, ledger2.seen


async def test_P1_unknown_permission_mode_is_refused(db_url: str) -> None:
    async with await stead.open(db_url, providers={"p": ScriptedProvider(lambda r: [])}) as system:
        with pytest.raises(stead.InvalidInput, match="permission_mode"):
            await system.create(provider="p", permission_mode="sudo")
        agent = await system.create(provider="p", permission_mode="workspace_write")
        assert agent.settings["permission_mode"] == "workspace_write"
        with pytest.raises(stead.InvalidInput, match="permission_mode"):
            await agent.send("x", permission_mode="sudo")
        for mode in ("read_only", "workspace_write", "auto", "full_access"):
            assert (await agent.send("ok", permission_mode=mode)).created
        await agent.wait_idle(TIMEOUT)


# ---------------------------------------------------------------------------------------------- queue order
class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


async def test_queue_keys_stay_ordered_across_restarts_and_a_clock_moving_backwards(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stead.core import admission  # where queue keys are made

    clock = Clock(2_000_000.0)
    monkeypatch.setattr(admission, "time", clock)
    hang = ScriptedProvider(lambda r: asyncio.Event().wait())  # type: ignore[arg-type, return-value]
    system = await stead.open(db_url, providers={"p": hang})
    agent = await system.create(provider="p")
    for i in range(3):
        await agent.send(f"m{i}")
        clock.now -= 100.0  # the clock moves backwards between sends
    system.abandon()  # the first message's request never returns: the process dies
    await system.store.close()

    clock.now = 1_000_000.0  # restarted on a machine whose clock is far behind
    gate = Gate()
    async with await stead.open(db_url, providers={"p": ScriptedProvider(gate)}) as system:
        agent = await system.get(agent.id)
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        for i in range(3, 6):
            await agent.send(f"m{i}")
            clock.now -= 100.0
        keys = list(await kv(system, agent.id, R.SEND))
        assert keys == sorted(keys) and len(keys) == 6
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert texts(await agent.history()) == [f"m{i}" for i in range(6)]
