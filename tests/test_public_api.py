"""The public API contract (issue #2): names exported by `stead` and the behaviour users rely on."""

from __future__ import annotations

import asyncio

import pytest

import stead
from stead._ids import is_valid_id, new_id
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 5.0

EXPORTS = [
    "IN_DOUBT",
    "RUN_AGAIN",
    "Acceptance",
    "Activated",
    "Agent",
    "AgentInfo",
    "AgentNotFound",
    "AgentSystem",
    "Approval",
    "ApprovalDecided",
    "ApprovalRequested",
    "Block",
    "BlockEnd",
    "BlockReset",
    "CallKV",
    "CloseFromInside",
    "Closed",
    "Compacted",
    "CompactionFailed",
    "ConfigurationError",
    "ContextPolicy",
    "Decision",
    "DefinitionError",
    "Done",
    "Event",
    "HookContext",
    "Hooks",
    "Input",
    "InvalidId",
    "InvalidInput",
    "Message",
    "MessageConsumed",
    "ModelOptions",
    "NotFound",
    "Outcome",
    "Plugin",
    "Provider",
    "ProviderError",
    "ProviderRequest",
    "Reasoning",
    "ReasoningDelta",
    "ResponseInfo",
    "RetryPolicy",
    "Run",
    "RunFailed",
    "RunNotFound",
    "RunResult",
    "RuntimeChange",
    "SchemaTooNew",
    "Settled",
    "SteadError",
    "Step",
    "StoreCrashed",
    "StoreError",
    "StoreLocked",
    "Text",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolFinished",
    "ToolResult",
    "ToolSpec",
    "ToolStarted",
    "Usage",
    "UsageEvent",
    "__version__",
    "open",
    "tool",
]


def test_all_is_pinned() -> None:
    assert stead.__all__ == EXPORTS
    for name in stead.__all__:
        assert hasattr(stead, name), name


def test_error_hierarchy() -> None:
    for err in (
        stead.InvalidInput,
        stead.NotFound,
        stead.Closed,
        stead.StoreError,
        stead.ProviderError,
        stead.ConfigurationError,
        stead.CloseFromInside,
    ):
        assert issubclass(err, stead.SteadError)
    assert issubclass(stead.InvalidId, stead.InvalidInput) and issubclass(stead.InvalidInput, ValueError)
    assert issubclass(stead.AgentNotFound, stead.NotFound) and issubclass(stead.AgentNotFound, LookupError)
    for err in (stead.StoreLocked, stead.StoreCrashed, stead.SchemaTooNew):
        assert issubclass(err, stead.StoreError)


@stead.tool
async def add(a: int, b: int) -> int:
    "Add two integers."
    return a + b


def add_once(request: stead.ProviderRequest) -> list[stead.Block]:
    if request.messages[-1].role == "user":
        return [stead.ToolCall(name="add", arguments={"a": 2, "b": 3})]  # no id: stead assigns one
    return [stead.Text(f"the sum is {request.messages[-1].content[0].output}")]  # type: ignore[union-attr]


async def test_open_create_send_wait_idle_history_close(db_url: str) -> None:
    provider = ScriptedProvider(add_once)
    system = await stead.open(db_url, providers={"scripted": provider}, tools=[add])
    assert isinstance(system, stead.AgentSystem)
    agent = await system.create(
        provider="scripted", model="m", instructions="be brief", tools=["add"], name="calc"
    )
    assert isinstance(agent, stead.Agent)
    assert is_valid_id(agent.id) and agent.name == "calc"
    assert not agent.active
    acc = await agent.send("what is 2+3?")
    assert (
        isinstance(acc, stead.Acceptance) and acc.created and acc.delivery == "send" and is_valid_id(acc.id)
    )
    await agent.wait_idle(timeout=TIMEOUT)
    assert not agent.active
    history = await agent.history()
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[0].id == acc.id and history[0].text == "what is 2+3?"
    (call,) = history[1].content
    (result,) = history[2].content
    assert isinstance(call, stead.ToolCall) and isinstance(result, stead.ToolResult)
    assert call.id is not None and is_valid_id(call.id)  # assigned when omitted
    assert result.call_id == call.id and result.output == "5" and not result.is_error
    assert history[3].text == "the sum is 5"
    assert provider.requests[0].instructions == "be brief" and provider.requests[0].model == "m"
    assert [t.name for t in provider.requests[0].tools] == ["add"]
    await system.close()
    await system.close()  # idempotent
    with pytest.raises(stead.Closed):
        await system.create(provider="scripted")
    with pytest.raises(stead.Closed):
        await agent.send("after close")


async def test_get_finds_agents_and_raises_agent_not_found(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("hi")])
    async with await stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted")
        same = await system.get(agent.id)
        assert same.id == agent.id
        with pytest.raises(stead.AgentNotFound):
            await system.get(new_id())
        with pytest.raises(stead.AgentNotFound):
            await system.get("not a valid id!")
        await agent.send("hello")
        await agent.wait_idle(TIMEOUT)
        aid = agent.id
        assert [(a.id, a.active) for a in await system.agents()] == [(aid, False)]
    async with await stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.get(aid)
        assert [m.text for m in await agent.history()] == ["hello", "hi"]


async def test_create_refuses_bad_configuration(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [])
    async with await stead.open(db_url, providers={"scripted": provider}) as system:
        with pytest.raises(stead.ConfigurationError, match="unknown provider"):
            await system.create(provider="nope")
        with pytest.raises(stead.ConfigurationError, match="unknown tool"):
            await system.create(provider="scripted", tools=["missing"])
        with pytest.raises(stead.InvalidId):
            await system.create(provider="scripted", agent_id="Bad Id")
        assert await system.agents() == []  # the refused creations wrote nothing
        agent = await system.create(provider="scripted")  # the only provider is the default
        with pytest.raises(stead.InvalidInput):
            await system.create(provider="scripted", agent_id=agent.id)
        assert [a.id for a in await system.agents()] == [agent.id]


async def test_steer_returns_a_steer_acceptance(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with await stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted")
        mid = new_id()
        acc = await agent.steer("turn left", id=mid)
        assert acc == stead.Acceptance(mid, "steer", True)
        await agent.wait_idle(TIMEOUT)
        assert [m.text for m in await agent.history()] == ["turn left", "ok"]


async def test_abort_cancels_the_turn_and_is_a_no_op_when_idle(db_url: str) -> None:
    asked = asyncio.Event()

    async def hang(request: stead.ProviderRequest) -> list[stead.Block]:
        asked.set()
        await asyncio.Event().wait()
        return []  # pragma: no cover

    async with await stead.open(db_url, providers={"scripted": ScriptedProvider(hang)}) as system:
        agent = await system.create(provider="scripted")
        await agent.abort()  # idle: nothing happens
        await agent.send("hello")
        await asyncio.wait_for(asked.wait(), TIMEOUT)
        assert agent.active
        await asyncio.wait_for(agent.abort(), TIMEOUT)
        await agent.wait_idle(TIMEOUT)
        assert not agent.active
        assert [m.role for m in await agent.history()] == ["user"]


async def test_wait_idle_timeout_raises_timeout_error(db_url: str) -> None:
    release = asyncio.Event()

    async def slow(request: stead.ProviderRequest) -> list[stead.Block]:
        await asyncio.wait_for(release.wait(), TIMEOUT)
        return [stead.Text("late")]

    async with await stead.open(db_url, providers={"scripted": ScriptedProvider(slow)}) as system:
        agent = await system.create(provider="scripted")
        await agent.wait_idle(timeout=0.01)  # idle already
        await agent.send("hello")
        with pytest.raises(TimeoutError):
            await agent.wait_idle(timeout=0.01)
        release.set()
        await agent.wait_idle(timeout=TIMEOUT)


async def test_events_stream_live_events_and_ends_when_the_system_closes(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("hello there")])
    system = await stead.open(db_url, providers={"scripted": provider})
    agent = await system.create(provider="scripted")
    events = agent.events()

    async def consume() -> list[stead.Event]:
        return [ev async for ev in events]

    consumer = asyncio.create_task(consume())
    await agent.send("hi")
    await agent.wait_idle(TIMEOUT)
    await system.close()
    seen = await asyncio.wait_for(consumer, TIMEOUT)  # the stream ended with the system
    assert [e.type for e in seen] == [
        "activated",
        "text_delta",
        "usage",
        "message_consumed",
        "block_end",
        "done",
        "settled",
    ]
    done = seen[-2]
    assert isinstance(done, stead.Done) and done.reason == "stop" and done.usage is not None
    assert done.inference_id is not None


async def test_tool_call_ids_are_assigned_and_results_have_role_tool(db_url: str) -> None:
    def two_calls(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].role == "user":
            return [stead.ToolCall("add", {"a": 1, "b": 1}), stead.ToolCall("add", {"a": 2, "b": 2})]
        return [stead.Text("done")]

    provider = ScriptedProvider(two_calls)
    async with await stead.open(db_url, providers={"scripted": provider}, tools=[add]) as system:
        agent = await system.create(provider="scripted", tools=["add"])
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        history = await agent.history()
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        calls = history[1].content
        results = history[2].content
        ids = [c.id for c in calls if isinstance(c, stead.ToolCall)]
        assert len(set(ids)) == 2 and all(i is not None and is_valid_id(i) for i in ids)
        assert [(r.call_id, r.output) for r in results if isinstance(r, stead.ToolResult)] == [
            (ids[0], "2"),
            (ids[1], "4"),
        ]
        # the provider saw the same ids in the continuation
        continuation = provider.requests[1].messages
        assert [m.role for m in continuation] == ["user", "assistant", "tool"]
        assert [c.id for c in continuation[1].content if isinstance(c, stead.ToolCall)] == ids
