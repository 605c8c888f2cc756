"""Streaming promises S1–S4 (docs/promises.md): only completed blocks persist; observers see every event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import stead
from stead.core import records as R
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import conversation_records
from tests.fakes.postgres import raw_rows

TIMEOUT = 5.0
ONE_ATTEMPT = stead.RetryPolicy(max_attempts=1, base_delay=0.0, max_delay=0.0)
NO_WAIT = stead.RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0)


class Recorder(stead.Hooks):
    def __init__(self) -> None:
        self.events: list[stead.Event] = []

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    return await conversation_records(system, agent_id)


async def reloaded_history(url: str, agent_id: str) -> list[stead.Message]:
    async with await stead.open(url, providers={"p": ScriptedProvider(lambda r: [])}) as system:
        return await (await system.get(agent_id)).history()


@asynccontextmanager
async def answered_hi(
    db_url: str, provider: stead.Provider, tools: Sequence[stead.Tool] = (), **kw: Any
) -> AsyncIterator[tuple[stead.AgentSystem, stead.Agent, Recorder]]:
    """An agent on `provider` (offered `tools`) that was sent "hi" and is idle again, every event recorded;
    `kw` go to `stead.open`."""
    rec = Recorder()
    async with await stead.open(db_url, providers={"p": provider}, tools=tools, hooks=rec, **kw) as system:
        agent = await system.create(provider="p", tools=[t.name for t in tools])
        await agent.send("hi")
        await agent.wait_idle(TIMEOUT)
        yield system, agent, rec


# ---------------------------------------------------------------------------------------------- S1
async def test_S1_each_completed_block_is_persisted_as_one_record(db_url: str) -> None:
    blocks: list[stead.Block] = [stead.Reasoning("let me think", signature="sig"), stead.Text("hello world")]
    blocks.append(stead.Text("second paragraph"))
    provider = ScriptedProvider(lambda r: ScriptedResponse(blocks=list(blocks), chunk=3))
    async with answered_hi(db_url, provider) as (system, agent, rec):
        recs = await records(system, agent.id)
        assert [r["k"] for r in recs] == ["u", "b", "b", "b"]  # one record per block, none per delta
        assert len({r["i"] for r in recs[1:]}) == 1
        history = await agent.history()
        assert history[-1].content == blocks
        assert len(rec.of(stead.TextDelta)) > 4 and len(rec.of(stead.ReasoningDelta)) == 4
        assert [e.block for e in rec.of(stead.BlockEnd)] == blocks
        assert agent._rt.messages() == history
        aid = agent.id
    assert await reloaded_history(db_url, aid) == history


async def test_S1_half_streamed_block_is_dropped_and_memory_equals_reload(db_url: str) -> None:
    provider = ScriptedProvider(
        lambda r: ScriptedResponse(blocks=[stead.Text("kept")], half_block="never fini")
    )
    async with answered_hi(db_url, provider) as (system, agent, rec):
        assert "never fini" in [e.text for e in rec.of(stead.TextDelta)]  # observers saw it live ...
        history = await agent.history()
        assert [(m.role, m.content) for m in history] == [
            ("user", [stead.Text("hi")]),
            ("assistant", [stead.Text("kept")]),
        ]  # ... but it was never persisted
        assert "never fini" not in json.dumps(await records(system, agent.id))
        assert agent._rt.messages() == history
        aid = agent.id
    assert await reloaded_history(db_url, aid) == history


class TwoBlocks:
    """A provider that pauses while its second block streams."""

    def __init__(self) -> None:
        self.streaming_second = asyncio.Event()
        self.finish = asyncio.Event()

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        yield stead.ReasoningDelta("hmm")
        yield stead.BlockEnd(stead.Reasoning("hmm"))
        yield stead.TextDelta("first ")
        yield stead.BlockEnd(stead.Text("first "))
        yield stead.TextDelta("sec")
        self.streaming_second.set()
        await asyncio.wait_for(self.finish.wait(), TIMEOUT)
        yield stead.TextDelta("ond")
        yield stead.BlockEnd(stead.Text("second"))
        yield stead.Done("stop")


async def test_S1_completed_blocks_are_durable_before_block_end_reaches_observers(
    db_url: str, db_target: Path | str
) -> None:
    provider = TwoBlocks()
    durable_at_block_end: list[bool] = []

    def stored_blocks(agent_id: str) -> list[Any]:
        rows = raw_rows(db_target, "SELECT record FROM history WHERE agent_id=? ORDER BY seq", (agent_id,))
        return [json.loads(str(r[0])).get("b") for r in rows]

    class Check(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            if isinstance(event, stead.BlockEnd):
                durable_at_block_end.append(
                    stead.messages.encode_block(event.block) in stored_blocks(agent_id)
                )

    async with await stead.open(db_url, providers={"p": provider}, hooks=Check()) as system:
        agent = await system.create(provider="p")
        await agent.send("hi")
        await asyncio.wait_for(provider.streaming_second.wait(), TIMEOUT)
        # the two completed blocks were committed at the block boundary, mid-response
        assert [b for b in stored_blocks(agent.id) if b is not None] == [
            {"t": "z", "x": "hmm"},
            {"t": "x", "x": "first "},
        ]
        assert agent.active
        provider.finish.set()
        await agent.wait_idle(TIMEOUT)
        assert durable_at_block_end == [True, True, True]
        assert agent._rt.messages() == await agent.history()


# ---------------------------------------------------------------------------------------------- S2
async def test_S2_every_stream_event_reaches_observers_even_if_an_observer_throws(db_url: str) -> None:
    class Throws(stead.Hooks):
        calls = 0

        def on_event(self, agent_id: str, event: stead.Event) -> None:
            Throws.calls += 1
            raise RuntimeError("observer bug")

    before, after = Recorder(), Recorder()
    provider = ScriptedProvider(
        lambda r: ScriptedResponse(blocks=[stead.Reasoning("abc"), stead.Text("hello there")], chunk=2)
    )
    async with await stead.open(db_url, providers={"p": provider}, hooks=[before, Throws(), after]) as system:
        agent = await system.create(provider="p")
        stream = agent.events()
        streamed: list[stead.Event] = []

        async def consume() -> None:
            async for ev in stream:
                streamed.append(ev)
                if isinstance(ev, stead.Settled):
                    return

        consumer = asyncio.create_task(consume())
        await agent.send("hi")
        await agent.wait_idle(TIMEOUT)
        await asyncio.wait_for(consumer, TIMEOUT)
        assert [e.type for e in after.events] == [
            "activated",
            "reasoning_delta",
            "reasoning_delta",
            # the next block starts streaming: the reasoning block commits with the consumption first
            "message_consumed",
            "block_end",
            "text_delta",
            "text_delta",
            "text_delta",
            "text_delta",
            "text_delta",
            "text_delta",
            "usage",
            "block_end",
            "done",
            "settled",
        ]
        assert before.events == after.events == streamed
        assert Throws.calls == len(after.events)
        assert [e.type for e in after.events][-2:] == ["done", "settled"]
        assert "".join(e.text for e in after.of(stead.TextDelta)) == "hello there"
        assert "".join(e.text for e in after.of(stead.ReasoningDelta)) == "abc"
        assert len(after.of(stead.BlockEnd)) == 2 and len(after.of(stead.UsageEvent)) == 1


async def test_S2_a_slow_or_absent_event_reader_does_not_block_the_agent(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: ScriptedResponse(blocks=[stead.Text("x" * 50)], chunk=1))
    async with await stead.open(db_url, providers={"p": provider}) as system:
        agent = await system.create(provider="p")
        never_read = agent.events()
        await agent.send("hi")
        await agent.wait_idle(TIMEOUT)
        first = await asyncio.wait_for(never_read.__anext__(), TIMEOUT)
        assert isinstance(first, stead.Activated)
        await never_read.aclose()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- S3
def cut_mid_second_block(request: stead.ProviderRequest) -> ScriptedResponse:
    # events: "on", "e", BlockEnd(one), "tw", "o ", "tw", "o", BlockEnd, usage, done: cut after 5
    return ScriptedResponse(blocks=[stead.Text("one"), stead.Text("two two")], chunk=2, end_after=5)


async def test_S3_stream_without_done_keeps_only_persisted_blocks_and_emits_block_reset(db_url: str) -> None:
    provider = ScriptedProvider(cut_mid_second_block)
    async with answered_hi(db_url, provider, retry=ONE_ATTEMPT) as (system, agent, rec):
        history = await agent.history()
        assert [(m.role, m.text) for m in history] == [
            ("user", "hi"),
            ("assistant", "one"),
            ("system", "The last turn failed: the model's response ended before it was complete"),
        ]
        stored_texts = [r["b"].get("x") for r in await records(system, agent.id) if r["k"] == "b"]
        assert stored_texts == ["one"]  # nothing of the half-streamed "two two" block was stored
        types = [e.type for e in rec.events]
        assert types.count("block_reset") == 1
        assert types.index("block_reset") > types.index("block_end")
        assert [e.reason for e in rec.of(stead.Done)] == ["error"]
        assert agent._rt.messages() == history
        aid = agent.id
    assert await reloaded_history(db_url, aid) == history


async def test_S3_cut_stream_is_retried_with_a_fresh_inference(db_url: str) -> None:
    def respond(request: stead.ProviderRequest) -> Any:
        if len(provider.requests) == 1:
            return cut_mid_second_block(request)
        return [stead.Text("complete")]

    provider = ScriptedProvider(respond)
    async with answered_hi(db_url, provider, retry=NO_WAIT) as (system, agent, rec):
        assert len(provider.requests) == 2
        # the retry sees what was persisted, and never reuses the inference that produced a block
        assert [(m.role, m.text) for m in provider.requests[1].messages] == [
            ("user", "hi"),
            ("assistant", "one"),
        ]
        assert provider.requests[0].inference_id != provider.requests[1].inference_id
        blocks = [r for r in await records(system, agent.id) if r["k"] == "b"]
        assert [r["b"]["x"] for r in blocks] == ["one", "complete"]
        assert blocks[0]["i"] != blocks[1]["i"]
        assert [e.type for e in rec.events].count("block_reset") == 1
        assert [e.reason for e in rec.of(stead.Done)] == ["stop"]
        assert not [r for r in await records(system, agent.id) if r["k"] == "s"]


async def test_S3_a_stream_that_always_ends_early_gives_up_after_the_retry_budget(db_url: str) -> None:
    provider = ScriptedProvider(
        lambda r: ScriptedResponse(blocks=[stead.Text("abcdef")], chunk=2, end_after=2)
    )
    async with answered_hi(db_url, provider, retry=NO_WAIT) as (_, agent, rec):
        assert len(provider.requests) == NO_WAIT.max_attempts
        assert [(m.role, m.text) for m in await agent.history()] == [
            ("user", "hi"),
            ("system", "The last turn failed: the model's response ended before it was complete"),
        ]
        assert [e.type for e in rec.events].count("block_reset") == NO_WAIT.max_attempts
        assert [e.reason for e in rec.of(stead.Done)] == ["error"]


# ---------------------------------------------------------------------------------------------- S4
def usage_of(n: int) -> stead.Usage:
    return stead.Usage(input_tokens=100 * n, output_tokens=n, cached_tokens=n, cost=n / 1000)


@stead.tool
async def ping() -> str:
    "Ping."
    return "pong"


async def test_S4_token_usage_is_recorded_per_inference(db_url: str) -> None:
    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        n = sum(1 for m in request.messages if m.role == "tool")
        blocks: list[stead.Block] = [stead.ToolCall("ping", {})] if n < 2 else [stead.Text("done")]
        return ScriptedResponse(blocks=blocks, usage=usage_of(n + 1))

    provider = ScriptedProvider(respond)
    async with answered_hi(db_url, provider, [ping]) as (_, agent, rec):
        history = await agent.history()
        assert [m.usage for m in history if m.role == "assistant"] == [usage_of(1), usage_of(2), usage_of(3)]
        assert [e.usage for e in rec.of(stead.Done)] == [usage_of(1), usage_of(2), usage_of(3)]
        assert [e.usage for e in rec.of(stead.UsageEvent)] == [usage_of(1), usage_of(2), usage_of(3)]
        aid = agent.id
    assert [m.usage for m in await reloaded_history(db_url, aid) if m.role == "assistant"] == [
        usage_of(1),
        usage_of(2),
        usage_of(3),
    ]


async def _measurement(system: stead.AgentSystem, agent_id: str) -> Any:
    """The latest durable usage: the `usage` key and the last assistant block record carrying one."""
    async with system.store.transaction() as tx:
        key = await tx.get(agent_id, R.USAGE)
        recs = [json.loads(r) for r in await tx.load(agent_id)]
    on_blocks = [r["u"] for r in recs if r["k"] == "b" and "u" in r]
    return (json.loads(key) if key else None, on_blocks[-1] if on_blocks else None)


async def test_S4_failed_response_keeps_the_previous_measurement(db_url: str) -> None:
    responses = iter(
        [
            ScriptedResponse(blocks=[stead.Text("ok")], usage=usage_of(1)),
            ScriptedResponse(blocks=[], usage=usage_of(7), done="error"),
            ScriptedResponse(blocks=[stead.Text("partial")], usage=usage_of(8), done="error"),
        ]
    )
    provider = ScriptedProvider(lambda r: next(responses))
    async with await stead.open(db_url, providers={"p": provider}, retry=ONE_ATTEMPT) as system:
        agent = await system.create(provider="p")
        await agent.send("one")
        await agent.wait_idle(TIMEOUT)
        measured = await _measurement(system, agent.id)
        await agent.send("two")
        await agent.wait_idle(TIMEOUT)
        assert await _measurement(system, agent.id) == measured
        await agent.send("three")
        await agent.wait_idle(TIMEOUT)
        assert await _measurement(system, agent.id) == measured
        assert [m.usage for m in await agent.history() if m.role == "assistant"] == [usage_of(1), None]


class UsageThenHang:
    def __init__(self) -> None:
        self.hanging = asyncio.Event()
        self.n = 0

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        self.n += 1
        if self.n == 1:
            yield stead.TextDelta("fine")
            yield stead.BlockEnd(stead.Text("fine"))
            yield stead.UsageEvent(usage_of(1))
            yield stead.Done("stop")
            return
        yield stead.TextDelta("kept")
        yield stead.BlockEnd(stead.Text("kept"))
        yield stead.UsageEvent(usage_of(9))
        self.hanging.set()
        await asyncio.Event().wait()  # until aborted
        yield stead.Done("stop")  # pragma: no cover


async def test_S4_cancelled_response_keeps_the_previous_measurement(db_url: str) -> None:
    provider = UsageThenHang()
    async with await stead.open(db_url, providers={"p": provider}) as system:
        agent = await system.create(provider="p")
        await agent.send("one")
        await agent.wait_idle(TIMEOUT)
        measured = await _measurement(system, agent.id)
        await agent.send("two")
        await asyncio.wait_for(provider.hanging.wait(), TIMEOUT)
        await asyncio.wait_for(agent.abort(), TIMEOUT)
        await agent.wait_idle(TIMEOUT)
        assert await _measurement(system, agent.id) == measured
        history = await agent.history()
        assert [(m.text, m.usage) for m in history if m.role == "assistant"] == [
            ("fine", usage_of(1)),
            ("kept", None),
        ]


# ---------------------------------------------------------------------------------------------- hot path
class _ClosingProvider:
    """Streams a tool call, then a final answer; notes when each response's generator is closed, and how
    many responses had been closed when each request arrived."""

    def __init__(self) -> None:
        self.closed = 0
        self.closed_at_request: list[int] = []

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[stead.StreamEvent]:
        self.closed_at_request.append(self.closed)
        rounds = sum(1 for m in request.messages if m.role == "tool")
        try:
            if rounds < 2:
                yield stead.BlockEnd(stead.ToolCall("add", {"a": rounds, "b": 1}))
                yield stead.Done("tool_call")
            else:
                yield stead.BlockEnd(stead.Text("done"))
                yield stead.Done("stop")
            yield stead.TextDelta("never read: the kernel stops at the terminal event")
        finally:
            self.closed += 1


async def test_provider_stream_is_closed_at_its_terminal_event_before_the_next_request(db_url: str) -> None:
    @stead.tool
    async def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    provider = _ClosingProvider()
    async with await stead.open(db_url, providers={"p": provider}, tools=[add]) as system:
        agent = await system.create(provider="p", tools=["add"])
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        # each response's generator was closed by the kernel (not later by the garbage collector's
        # finalizer task), so it was closed before the next request went out
        assert provider.closed_at_request == [0, 1, 2]
        assert provider.closed == 3


class _FailingCleanupProvider:
    """Streams a complete answer; its clean-up (the generator's `finally`) raises."""

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[stead.StreamEvent]:
        try:
            yield stead.BlockEnd(stead.Text("complete"))
            yield stead.Done("stop")
        finally:
            raise RuntimeError("clean-up failed")


async def test_a_failing_stream_clean_up_does_not_fail_a_complete_response(db_url: str) -> None:
    async with await stead.open(db_url, providers={"p": _FailingCleanupProvider()}) as system:
        agent = await system.create(provider="p")
        await agent.send("go")
        await agent.wait_idle(TIMEOUT)
        history = await agent.history()
        assert history[-1].content == [stead.Text("complete")]
        assert [r["k"] for r in await records(system, agent.id)] == ["u", "b"]
