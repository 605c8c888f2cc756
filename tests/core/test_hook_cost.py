"""Hooks cost nothing when unused (issue 8 item 5): `HookSet` dispatches only to the hook objects that
override a method, and the kernel builds a `HookContext` — or an event — only when someone listens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import stead
from stead.core import state as state_module
from stead.core.hooks import HOOK_METHODS, HookContext, HookSet, overrides
from stead.core.state import AgentState
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider
from tests.conftest import tool_loop

TIMEOUT = 5.0


@stead.tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class OnlySettledTx(stead.Hooks):
    def __init__(self) -> None:
        self.calls = 0

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.calls += 1


class OnlyEvents(stead.Hooks):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        self.events.append(event.type)


@pytest.fixture
def contexts(monkeypatch: pytest.MonkeyPatch) -> list[HookContext]:
    """Every HookContext the kernel builds (they are all built in `AgentState.hook_ctx`)."""
    built: list[HookContext] = []

    class Counting(HookContext):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(state_module, "HookContext", Counting)
    return built


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[stead.Event]:
    """Every event the kernel emits."""
    out: list[stead.Event] = []
    original = AgentState.emit

    def emit(self: AgentState, event: stead.Event) -> None:
        out.append(event)
        original(self, event)

    monkeypatch.setattr(AgentState, "emit", emit)
    return out


async def _conversation(url: str, hooks: list[stead.Hooks], k: int = 3) -> stead.Agent:
    provider = ScriptedProvider(tool_loop("add", k))
    system = await stead.open(url, providers={"p": provider}, tools=[add], hooks=hooks, records=False)
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        for _ in range(5):
            await asyncio.sleep(0)  # let the observing `settled` hooks (background tasks) run
        assert len(await agent.history()) == 2 + 2 * k
    return agent


def test_hookset_indexes_overriders() -> None:
    only, events = OnlySettledTx(), OnlyEvents()
    hooks = HookSet([only, events, stead.Hooks()])
    assert [m for m in HOOK_METHODS if hooks.wants(m)] == ["settled_tx", "on_event"]
    assert overrides(only, "settled_tx") and not overrides(only, "block_tx")
    assert not HookSet([]).wants("on_event")


async def test_a_hook_overriding_only_settled_tx_is_never_called_for_anything_else(
    db_url: str, monkeypatch: pytest.MonkeyPatch, contexts: list[HookContext]
) -> None:
    called: list[str] = []
    for name in HOOK_METHODS:
        base = getattr(stead.Hooks, name)

        if name in ("offered_tools", "on_event"):

            def sync(self: Any, *args: Any, _name: str = name, _base: Any = base) -> Any:
                called.append(_name)
                return _base(self, *args)

            monkeypatch.setattr(stead.Hooks, name, sync)
        else:

            async def coro(self: Any, *args: Any, _name: str = name, _base: Any = base) -> Any:
                called.append(_name)
                return await _base(self, *args)

            monkeypatch.setattr(stead.Hooks, name, coro)
    hook = OnlySettledTx()
    await _conversation(db_url, [hook])
    assert hook.calls == 1
    assert called == []  # no inherited (default) method was ever called
    assert len(contexts) == 1  # one context, for the settlement


async def test_no_hook_context_or_event_is_built_when_nobody_listens(
    db_url: str, contexts: list[HookContext], emitted: list[stead.Event]
) -> None:
    await _conversation(db_url, [], k=3)
    assert contexts == []
    assert emitted == []


async def test_events_are_built_for_a_subscriber(db_url: str, emitted: list[stead.Event]) -> None:
    provider = ScriptedProvider(tool_loop("add", 1))
    async with await stead.open(db_url, providers={"p": provider}, tools=[add], records=False) as system:
        agent = await system.create(provider="p", tools=["add"])
        stream = agent.events()
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        await stream.aclose()
    kinds = [e.type for e in emitted]
    assert kinds[0] == "activated" and kinds[-1] == "settled"
    assert kinds.count("block_end") == 2 and kinds.count("done") == 2 and kinds.count("tool_finished") == 1


async def test_on_event_fans_out_only_to_overriders(
    db_url: str, contexts: list[HookContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    monkeypatch.setattr(stead.Hooks, "on_event", lambda self, agent_id, event: seen.append(event.type))
    listener = OnlyEvents()
    await _conversation(db_url, [OnlySettledTx(), listener, stead.Hooks()], k=1)
    assert seen == []  # the hooks that do not override on_event got nothing
    assert listener.events[0] == "activated" and listener.events[-1] == "settled"
    assert "block_end" in listener.events
    assert len(contexts) == 1  # still only the settlement's context: events need none
