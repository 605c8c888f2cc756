"""Hooks (docs/promises.md "Hooks", X3): transactional hooks run inside the transaction they describe and
roll it back on failure; observing hooks run after commit and never fail a run; activation and settlement
hooks fire exactly once per active period."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import stead
from stead.extend import (
    BeforeToolCallInfo,
    BlockInfo,
    MessageConsumedInfo,
    PermissionModeChangedInfo,
    SettledInfo,
    ToolDispatchedInfo,
    ToolResultInfo,
)
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 5.0

executed: list[str] = []


@stead.tool
async def act(label: str) -> str:
    "Record an effect."
    executed.append(label)
    return f"did {label}"


def one_call_then_answer(request: stead.ProviderRequest) -> list[stead.Block]:
    if request.messages[-1].role == "user":
        return [stead.ToolCall("act", {"label": request.messages[-1].text})]
    return [stead.Text("answered")]


async def kv(system: stead.AgentSystem, agent_id: str, prefix: str = "") -> dict[str, str]:
    async with system.store.transaction() as tx:
        return dict(await tx.read_prefix(agent_id, prefix))


TX_HOOKS = [
    "message_consumed_tx",
    "permission_mode_changed_tx",
    "block_tx",
    "response_tx",
    "tool_dispatched_tx",
    "tool_result_tx",
    "settled_tx",
]


class FailFirst(stead.Hooks):
    """Each transactional hook writes a marker through its transaction; `failing` raises on its first call."""

    def __init__(self, failing: str) -> None:
        self.failing = failing
        self.calls: dict[str, int] = {}

    async def _mark(self, name: str, ctx: stead.HookContext) -> None:
        assert ctx.tx is not None, f"{name} must run inside a transaction"
        n = self.calls[name] = self.calls.get(name, 0) + 1
        await ctx.tx.write(ctx.agent_id, f"kv.a.{name}.{n}", "written")
        if name == self.failing and n == 1:
            raise RuntimeError(f"{name} failed")

    async def message_consumed_tx(self, ctx: stead.HookContext, info: MessageConsumedInfo) -> None:
        await self._mark("message_consumed_tx", ctx)

    async def permission_mode_changed_tx(
        self, ctx: stead.HookContext, info: PermissionModeChangedInfo
    ) -> None:
        await self._mark("permission_mode_changed_tx", ctx)

    async def block_tx(self, ctx: stead.HookContext, info: BlockInfo) -> None:
        await self._mark("block_tx", ctx)

    async def response_tx(self, ctx: stead.HookContext, info: stead.ResponseInfo) -> None:
        await self._mark("response_tx", ctx)

    async def tool_dispatched_tx(self, ctx: stead.HookContext, info: ToolDispatchedInfo) -> None:
        await self._mark("tool_dispatched_tx", ctx)

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        await self._mark("tool_result_tx", ctx)

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        await self._mark("settled_tx", ctx)


@pytest.mark.parametrize("failing", TX_HOOKS)
async def test_transactional_hook_failure_rolls_back_its_transaction(db_url: str, failing: str) -> None:
    executed.clear()
    hooks = FailFirst(failing)
    provider = ScriptedProvider(one_call_then_answer)
    async with await stead.open(db_url, providers={"p": provider}, tools=[act], hooks=hooks) as system:
        agent = await system.create(provider="p", tools=["act"])
        await agent.send("x", permission_mode="read_only")
        await agent.wait_idle(TIMEOUT)
        assert hooks.calls[failing] >= 2, "the failed transaction was retried"
        markers = await kv(system, agent.id, f"kv.a.{failing}.")
        assert f"kv.a.{failing}.1" not in markers, "the failing hook's own write was rolled back"
        assert markers, "the retried transaction committed the hook's write"
        # the conversation is whole: one input, one call with exactly one result, one answer
        history = await agent.history()
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        assert history[-1].text == "answered"
        assert executed == ["x"], "the tool ran exactly once"
        assert agent.settings["permission_mode"] == "read_only"
        assert agent._rt.messages() == history
        assert not agent.active


async def test_transactional_hooks_see_the_open_transaction_and_commit_with_it(db_url: str) -> None:
    executed.clear()

    class Count(stead.Hooks):
        async def block_tx(self, ctx: stead.HookContext, info: BlockInfo) -> None:
            assert ctx.tx is not None
            raw = await ctx.tx.get(ctx.agent_id, "kv.a.blocks")
            await ctx.tx.write(ctx.agent_id, "kv.a.blocks", str(int(raw or 0) + 1))

        async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
            assert ctx.tx is not None
            # the result record is being committed in this very transaction
            records = [json.loads(r) for r in await ctx.tx.load(ctx.agent_id)]
            assert records[-1]["k"] == "t" and records[-1]["b"]["i"] == info.call.id
            await ctx.tx.write(ctx.agent_id, f"kv.a.result.{info.call.id}", info.result.output)

    provider = ScriptedProvider(one_call_then_answer)
    async with await stead.open(db_url, providers={"p": provider}, tools=[act], hooks=Count()) as system:
        agent = await system.create(provider="p", tools=["act"])
        await agent.send("y")
        await agent.wait_idle(TIMEOUT)
        state = await kv(system, agent.id, "kv.a.")
        assert state.pop("kv.a.blocks") == "2"
        assert list(state.values()) == ["did y"]


async def test_observing_hooks_never_fail_a_run(db_url: str) -> None:
    settled_calls: list[str | None] = []

    class Broken(stead.Hooks):
        async def settled(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            settled_calls.append(info.error)
            raise RuntimeError("observer bug")

        def on_event(self, agent_id: str, event: stead.Event) -> None:
            raise RuntimeError("observer bug")

    done = asyncio.Event()

    class After(stead.Hooks):
        async def settled(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            done.set()

    provider = ScriptedProvider(lambda r: [stead.Text("fine")])
    async with await stead.open(db_url, providers={"p": provider}, hooks=[Broken(), After()]) as system:
        agent = await system.create(provider="p")
        await agent.send("hi")
        await agent.wait_idle(TIMEOUT)
        await asyncio.wait_for(done.wait(), TIMEOUT)  # a later observer still ran
        assert settled_calls == [None]
        assert [m.text for m in await agent.history()] == ["hi", "fine"]
        assert not agent.active
        await agent.send("again")
        await agent.wait_idle(TIMEOUT)
        assert len(provider.requests) == 2


async def test_observing_settled_hook_runs_after_the_settlement_committed(db_url: str) -> None:
    seen: list[tuple[Any, bool, str | None]] = []
    done = asyncio.Event()

    class Observe(stead.Hooks):
        async def settled(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            async with ctx.store.transaction() as tx:
                pending = await tx.get(ctx.agent_id, "pending")
            seen.append((ctx.tx, pending is None, ctx.run_id))
            done.set()

    provider = ScriptedProvider(lambda r: [stead.Text("fine")])
    events: list[stead.Event] = []

    class Events(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            events.append(event)

    async with await stead.open(db_url, providers={"p": provider}, hooks=[Observe(), Events()]) as system:
        agent = await system.create(provider="p")
        await agent.send("hi")
        await agent.wait_idle(TIMEOUT)
        await asyncio.wait_for(done.wait(), TIMEOUT)
        (activated,) = [e for e in events if isinstance(e, stead.Activated)]
        assert seen == [(None, True, activated.run_id)]


async def test_transactional_hooks_chain_in_order_and_the_first_failure_stops_the_chain(db_url: str) -> None:
    order: list[str] = []

    class H(stead.Hooks):
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        async def activated_tx(self, ctx: stead.HookContext) -> None:
            order.append(self.name)
            if self.fail:
                raise PermissionError(self.name)

    provider = ScriptedProvider(lambda r: [stead.Text("fine")])
    hooks = [H("a"), H("b", fail=True), H("c")]
    async with await stead.open(db_url, providers={"p": provider}, hooks=hooks) as system:
        agent = await system.create(provider="p")
        with pytest.raises(PermissionError, match="b"):
            await agent.send("hi")
        assert order == ["a", "b"]
        assert await kv(system, agent.id) == {}


async def test_before_tool_call_can_answer_a_call_without_running_it(db_url: str) -> None:
    executed.clear()

    class Deny(stead.Hooks):
        async def before_tool_call(
            self, ctx: stead.HookContext, info: BeforeToolCallInfo
        ) -> stead.ToolResult | None:
            if ctx.permission_mode == "read_only":
                return stead.ToolResult(info.call.id or "", "denied: read_only", True)
            return None

    provider = ScriptedProvider(one_call_then_answer)
    async with await stead.open(db_url, providers={"p": provider}, tools=[act], hooks=Deny()) as system:
        agent = await system.create(provider="p", tools=["act"])
        await agent.send("blocked", permission_mode="read_only")
        await agent.wait_idle(TIMEOUT)
        await agent.send("allowed", permission_mode="auto")
        await agent.wait_idle(TIMEOUT)
        assert executed == ["allowed"]
        results = [b for m in await agent.history() if m.role == "tool" for b in m.content]
        assert [(r.output, r.is_error) for r in results] == [  # type: ignore[union-attr]
            ("denied: read_only", True),
            ("did allowed", False),
        ]


# ---------------------------------------------------------------------------------------------- X3
class Ledger(stead.Hooks):
    def __init__(self) -> None:
        self.entries: list[tuple[str, str | None, Any]] = []
        self.observed = asyncio.Event()

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        self.entries.append(("activated_tx", ctx.run_id, ctx.restored))

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.entries.append(("settled_tx", ctx.run_id, info.error))

    async def settled(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.entries.append(("settled", ctx.run_id, info.error))
        self.observed.set()

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        if isinstance(event, stead.Activated):
            self.entries.append(("Activated", event.run_id, event.restored))
        elif isinstance(event, stead.Settled):
            self.entries.append(("Settled", event.run_id, event.error))

    async def period_end(self) -> None:
        await asyncio.wait_for(self.observed.wait(), TIMEOUT)
        self.observed.clear()


async def test_X3_activation_and_settlement_hooks_fire_exactly_once_per_active_period(db_url: str) -> None:
    executed.clear()
    ledger = Ledger()
    release = asyncio.Event()
    asked_four = asyncio.Event()

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].text == "four":
            asked_four.set()
        await asyncio.wait_for(release.wait(), TIMEOUT)
        if request.messages[-1].text == "fail":
            raise stead.ProviderError("broken", retryable=False)
        return one_call_then_answer(request)

    provider = ScriptedProvider(respond)
    async with await stead.open(db_url, providers={"p": provider}, tools=[act], hooks=ledger) as system:
        agent = await system.create(provider="p", tools=["act"])
        # period 1: several messages, tool round trips, a message arriving mid-run
        await agent.send("one")
        await agent.steer("two")
        release.set()
        await agent.send("three")
        await agent.wait_idle(TIMEOUT)
        await ledger.period_end()
        # period 2: a failing turn
        await agent.send("fail")
        await agent.wait_idle(TIMEOUT)
        await ledger.period_end()
        # period 3: aborted mid-inference
        release.clear()
        await agent.send("four")
        await asyncio.wait_for(asked_four.wait(), TIMEOUT)
        await asyncio.wait_for(agent.abort(), TIMEOUT)
        await agent.wait_idle(TIMEOUT)
        await ledger.period_end()

    periods: list[list[tuple[str, str | None, Any]]] = []
    for entry in ledger.entries:
        if entry[0] == "activated_tx":
            periods.append([])
        periods[-1].append(entry)
    assert len(periods) == 3
    for period, error in zip(periods, [None, "broken", "aborted"], strict=True):
        run_id = period[0][1]
        assert run_id is not None
        assert period == [
            ("activated_tx", run_id, False),
            ("Activated", run_id, False),
            ("settled_tx", run_id, error),
            ("Settled", run_id, error),
            ("settled", run_id, error),
        ]
    assert len({p[0][1] for p in periods}) == 3
    assert sorted(executed) == ["one", "three", "two"]


async def test_X3_restart_announces_the_active_period_once_with_restored(db_url: str) -> None:
    ledger = Ledger()
    hang = asyncio.Event()

    async def never(request: stead.ProviderRequest) -> list[stead.Block]:
        hang.set()
        await asyncio.Event().wait()
        return []  # pragma: no cover

    system = await stead.open(db_url, providers={"p": ScriptedProvider(never)}, hooks=ledger)
    agent = await system.create(provider="p")
    await agent.send("hello")
    await asyncio.wait_for(hang.wait(), TIMEOUT)
    system.abandon()  # the process dies mid-inference
    await system.store.close()

    ledger2 = Ledger()
    provider = ScriptedProvider(lambda r: [stead.Text("resumed")])
    async with await stead.open(db_url, providers={"p": provider}, hooks=ledger2) as system:
        agent = await system.get(agent.id)
        await agent.wait_idle(TIMEOUT)
        await ledger2.period_end()
    (run_id,) = {e[1] for e in ledger.entries}
    assert ledger.entries == [("activated_tx", run_id, False), ("Activated", run_id, False)]
    assert ledger2.entries == [
        ("activated_tx", run_id, True),
        ("Activated", run_id, True),
        ("settled_tx", run_id, None),
        ("Settled", run_id, None),
        ("settled", run_id, None),
    ]
