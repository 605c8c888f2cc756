"""Issue #3: real providers through the KERNEL (`stead.open` / `create` / `send` / `wait_idle` / `history`).

The same behaviour suite runs for the scripted provider, the OpenAI driver against the fake OpenAI server and
the Anthropic driver against the fake Anthropic server. The real drivers are reached through the model
catalog (no `providers=`): `openai-compatible:gpt-x@http://127.0.0.1:PORT/v1` and
`anthropic:claude-haiku-4-5@http://127.0.0.1:PORT` (the `@URL` overrides the vendor's endpoint; the key
comes from `ANTHROPIC_API_KEY`). Faults are retried by the kernel with a tiny `RetryPolicy`; fatal errors
fail the turn with one system note and the agent settles. A retried inference never duplicates a persisted
block or a tool call (cuts after a completed block and mid-block, for each fake).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.messages import Reasoning, Text, ToolCall, ToolResult, Usage
from stead.providers.anthropic import AnthropicProvider
from stead.providers.openai import OpenAIProvider
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.fakes import DEFAULT_USAGE, FakeServer, Reply
from tests.fakes.anthropic_server import AnthropicFakeServer, fake_signature
from tests.fakes.openai_server import OpenAIFakeServer

FAST = stead.RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05)

# -------------------------------------------------------------------------------------------- tools
executions: Counter[str] = Counter()
"""Call id → how many times `lookup` ran for it (reset before each test)."""


@pytest.fixture(autouse=True)
def _reset_executions() -> None:
    executions.clear()


@stead.tool
async def lookup(city: str, ctx: stead.ToolContext) -> str:
    "Look up the weather of a city."
    executions[ctx.call_id] += 1
    return f"sunny in {city}"


# -------------------------------------------------------------------------------------------- kits
@dataclass
class Kit:
    """One provider kind, reached through the kernel: how to open a system on it and script its answers."""

    name: str
    model: str
    providers: dict[str, stead.Provider]
    server: FakeServer | None = None
    queue: deque[Reply | ScriptedResponse] = field(default_factory=deque)
    scripted: ScriptedProvider | None = None

    def push(self, *items: Reply | ScriptedResponse) -> None:
        if self.server is not None:
            assert all(isinstance(i, Reply) for i in items)
            self.server.push(*items)  # type: ignore[arg-type]
        else:
            self.queue.extend(items)

    async def open(self, url: str, **kwargs: Any) -> stead.AgentSystem:
        kwargs.setdefault("retry", FAST)
        kwargs.setdefault("tools", [lookup])
        return await stead.open(url, providers=dict(self.providers), **kwargs)

    async def create(self, system: stead.AgentSystem, **kwargs: Any) -> stead.Agent:
        kwargs.setdefault("tools", ["lookup"])
        kwargs.setdefault("instructions", "Be brief.")
        return await system.create(model=self.model, **kwargs)

    @property
    def request_count(self) -> int:
        if self.server is not None:
            return len([r for r in self.server.requests if r.path == self.server.path])
        assert self.scripted is not None
        return len(self.scripted.requests)

    def last_request_text(self) -> str:
        """Everything the last request carried, as text (to look for notes and replayed blocks)."""
        if self.server is not None:
            return json.dumps(self.server.requests[-1].body)
        assert self.scripted is not None
        return repr(self.scripted.requests[-1])

    def reasoning(self, text: str) -> Reasoning:
        """The reasoning block this kind persists for scripted reasoning `text`."""
        if self.name == "anthropic":
            return Reasoning(text, fake_signature(text))
        return Reasoning(text)

    def usage(self, usage: Usage) -> Usage:
        """The usage this kind reports for a scripted usage (with the cost when the route has prices)."""
        if self.name == "anthropic":
            from stead.providers.catalog import load_catalog

            prices = load_catalog().models["claude-haiku-4-5"].prices
            assert prices is not None
            return Usage(usage.input_tokens, usage.output_tokens, usage.cached_tokens, prices.cost(usage))
        return usage

    # -- faults, in each kind's terms
    def fault(self, kind: str) -> Reply | ScriptedResponse:
        if self.server is None:
            retryable = kind not in ("401", "400")
            return ScriptedResponse(error=f"injected {kind}", retryable=retryable)
        statuses = {"429": 429, "500": 500, "401": 401, "400": 400}
        if kind in statuses:
            headers = {"retry-after": "1"} if kind == "429" else {}
            return Reply(status=statuses[kind], headers=headers)
        if kind == "overloaded":
            if self.name == "anthropic":
                return Reply(status=529, error_type="overloaded_error", error_message="Overloaded")
            return Reply(status=503)
        if kind == "stream_error":
            return Reply([Text("never completed text")], chunk=3, stream_error_after=3)
        raise AssertionError(kind)

    def cut_mid_text(self, text: str) -> Reply | ScriptedResponse:
        """A response cut while its first (text) block streams: no completed block."""
        if self.server is None:
            return ScriptedResponse(half_block=text[:5], end_after=1)
        reply = Reply([Text(text)], chunk=3)
        reply.cut_after = frame_index(self.server, reply, json.dumps(text[3:6])[1:-1]) + 1
        return reply


def frame_index(server: FakeServer, reply: Reply, marker: str, start: int = 0) -> int:
    """The index of the first frame (from `start`) of `reply` rendered by `server` that contains `marker`."""
    frames = server.render(reply, {"model": "m", "stream_options": {"include_usage": True}}, 1)
    for i, frame in enumerate(frames):
        if i >= start and marker in frame.decode():
            return i
    raise AssertionError(f"no frame contains {marker!r}")


def scripted_kit() -> Kit:
    kit = Kit("scripted", "scripted:demo", {})

    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        item = kit.queue.popleft()
        if isinstance(item, ScriptedResponse):
            return item
        return ScriptedResponse(blocks=list(item.blocks), usage=item.usage or DEFAULT_USAGE, chunk=item.chunk)

    kit.scripted = ScriptedProvider(respond)
    kit.providers = {"scripted": kit.scripted}
    return kit


@pytest.fixture
async def openai_kit() -> AsyncIterator[Kit]:
    server = OpenAIFakeServer()
    await server.start()
    try:
        yield Kit("openai", f"openai-compatible:gpt-x@{server.base_url}", {}, server)
    finally:
        await server.close()


@pytest.fixture
async def anthropic_kit(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Kit]:
    server = AnthropicFakeServer()
    await server.start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    try:
        yield Kit("anthropic", f"anthropic:claude-haiku-4-5@{server.url}", {}, server)
    finally:
        await server.close()


@pytest.fixture(params=["scripted", "openai", "anthropic"])
def kit(request: pytest.FixtureRequest) -> Kit:
    if request.param == "scripted":
        return scripted_kit()
    return request.getfixturevalue(f"{request.param}_kit")  # type: ignore[no-any-return]


@pytest.fixture(params=["openai", "anthropic"])
def fake_kit(request: pytest.FixtureRequest) -> Kit:
    return request.getfixturevalue(f"{request.param}_kit")  # type: ignore[no-any-return]


# -------------------------------------------------------------------------------------------- helpers
class Watch:
    """Collects an agent's events from subscription until the first `Settled`."""

    def __init__(self, agent: stead.Agent) -> None:
        self.events: list[stead.Event] = []
        stream = agent.events()

        async def run() -> None:
            async for ev in stream:
                self.events.append(ev)
                if isinstance(ev, stead.Settled):
                    return

        self.task = asyncio.get_running_loop().create_task(run())

    async def done(self) -> list[stead.Event]:
        await asyncio.wait_for(self.task, 10)
        return self.events

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def ask(agent: stead.Agent, text: str, **kwargs: Any) -> Watch:
    watch = Watch(agent)
    await agent.send(text, **kwargs)
    await agent.wait_idle(timeout=20)
    await watch.done()
    return watch


async def converse(kit: Kit, url: str, text: str) -> tuple[stead.Agent, list[stead.Message], Watch]:
    """A new agent once it has answered `text` (its system closed again), its history and what it emitted
    meanwhile."""
    async with await kit.open(url) as system:
        agent = await kit.create(system)
        watch = await ask(agent, text)
        return agent, await agent.history(), watch


def shape(history: list[stead.Message]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """History without ids: what the conversation says, comparable across providers."""
    out: list[tuple[str, list[tuple[Any, ...]]]] = []
    for m in history:
        parts: list[tuple[Any, ...]] = []
        for b in m.content:
            if isinstance(b, Text):
                parts.append(("text", b.text))
            elif isinstance(b, Reasoning):
                parts.append(("reasoning", b.text))
            elif isinstance(b, ToolCall):
                parts.append(("call", b.name, b.arguments))
            elif isinstance(b, ToolResult):
                parts.append(("result", b.output, b.is_error))
        out.append((m.role, parts))
    return out


def calls_and_results(history: list[stead.Message]) -> tuple[list[ToolCall], list[ToolResult]]:
    calls = [b for m in history for b in m.content if isinstance(b, ToolCall)]
    results = [b for m in history for b in m.content if isinstance(b, ToolResult)]
    return calls, results


def assert_calls_settled_once(history: list[stead.Message]) -> None:
    """T4: every call appears once and has exactly one result; no result without its call."""
    calls, results = calls_and_results(history)
    ids = [c.id for c in calls]
    assert len(ids) == len(set(ids)), ids
    assert Counter(r.call_id for r in results) == Counter(ids)


# -------------------------------------------------------------------------------------------- behaviour
async def test_plain_answer_streams_deltas_and_records_usage(kit: Kit, db_url: str) -> None:
    usage = Usage(input_tokens=120, output_tokens=30, cached_tokens=20)
    kit.push(Reply([Text("Hello there, friend.")], chunk=4, usage=usage))
    agent, history, watch = await converse(kit, db_url, "hi")
    assert shape(history) == [("user", [("text", "hi")]), ("assistant", [("text", "Hello there, friend.")])]
    deltas = watch.of(stead.TextDelta)
    assert len(deltas) > 1 and "".join(d.text for d in deltas) == "Hello there, friend."
    assert [e.block for e in watch.of(stead.BlockEnd)] == [Text("Hello there, friend.")]
    (done,) = watch.of(stead.Done)
    assert done.reason == "stop" and done.usage == kit.usage(usage)
    assert history[-1].usage == kit.usage(usage)
    assert not agent.active


async def test_single_tool_call_is_executed_and_answered(kit: Kit, db_url: str) -> None:
    kit.push(Reply([ToolCall("lookup", {"city": "Paris"})], chunk=5), Reply([Text("Paris is sunny.")]))
    _, history, watch = await converse(kit, db_url, "weather in Paris?")
    assert shape(history) == [
        ("user", [("text", "weather in Paris?")]),
        ("assistant", [("call", "lookup", {"city": "Paris"})]),
        ("tool", [("result", "sunny in Paris", False)]),
        ("assistant", [("text", "Paris is sunny.")]),
    ]
    assert_calls_settled_once(history)
    (call,), _ = calls_and_results(history)
    assert executions == Counter({call.id: 1})
    assert [e.call.id for e in watch.of(stead.ToolStarted)] == [call.id]
    assert kit.request_count == 2
    assert "sunny in Paris" in kit.last_request_text()


async def test_parallel_tool_calls_are_executed_and_answered_in_order(kit: Kit, db_url: str) -> None:
    kit.push(
        Reply([ToolCall("lookup", {"city": "Paris"}), ToolCall("lookup", {"city": "Rome"})], chunk=4),
        Reply([Text("Both sunny.")]),
    )
    _, history, _ = await converse(kit, db_url, "weather in Paris and Rome?")
    assert shape(history) == [
        ("user", [("text", "weather in Paris and Rome?")]),
        ("assistant", [("call", "lookup", {"city": "Paris"}), ("call", "lookup", {"city": "Rome"})]),
        ("tool", [("result", "sunny in Paris", False), ("result", "sunny in Rome", False)]),
        ("assistant", [("text", "Both sunny.")]),
    ]
    assert_calls_settled_once(history)
    calls, results = calls_and_results(history)
    assert [r.call_id for r in results] == [c.id for c in calls]
    assert executions == Counter({c.id: 1 for c in calls})


async def test_reasoning_is_persisted_and_replayed(kit: Kit, db_url: str) -> None:
    kit.push(Reply([Reasoning("Let me think it over."), Text("42")], chunk=5), Reply([Text("Still 42.")]))
    async with await kit.open(db_url) as system:
        agent = await kit.create(system)
        watch = await ask(agent, "the answer?")
        assert "".join(d.text for d in watch.of(stead.ReasoningDelta)) == "Let me think it over."
        history = await agent.history()
        assert history[1].content == [kit.reasoning("Let me think it over."), Text("42")]
        await ask(agent, "sure?")
    if kit.name == "anthropic":
        assert kit.server is not None
        sent = kit.server.requests[-1].body["messages"]
        assistant = next(m for m in sent if m["role"] == "assistant")
        thinking = assistant["content"][0]
        assert thinking["type"] == "thinking"
        assert thinking["thinking"] == "Let me think it over."
        assert thinking["signature"] == fake_signature("Let me think it over.")  # verbatim
    elif kit.name == "scripted":
        assert kit.scripted is not None
        assert kit.scripted.requests[-1].messages[1].content[0] == Reasoning("Let me think it over.")


@pytest.mark.parametrize("fault", ["429", "500", "overloaded", "stream_error"])
async def test_transient_fault_is_retried_transparently(kit: Kit, fault: str, db_url: str) -> None:
    kit.push(kit.fault(fault), Reply([Text("Recovered answer.")], chunk=4))
    _, history, watch = await converse(kit, db_url, "hi")
    assert shape(history) == [("user", [("text", "hi")]), ("assistant", [("text", "Recovered answer.")])]
    assert kit.request_count == 2
    assert [d.reason for d in watch.of(stead.Done)] == ["stop"]
    assert [s.error for s in watch.of(stead.Settled)] == [None]


async def test_cut_stream_mid_block_is_retried_without_trace(kit: Kit, db_url: str) -> None:
    kit.push(kit.cut_mid_text("This text is cut off midway."), Reply([Text("Whole answer.")], chunk=4))
    _, history, watch = await converse(kit, db_url, "hi")
    assert shape(history) == [("user", [("text", "hi")]), ("assistant", [("text", "Whole answer.")])]
    assert kit.request_count == 2
    # S3: observers saw the half block's deltas, then were told to drop them
    kinds = [type(e).__name__ for e in watch.events]
    assert "BlockReset" in kinds
    assert kinds.index("BlockReset") < kinds.index("BlockEnd")
    assert [e.block for e in watch.of(stead.BlockEnd)] == [Text("Whole answer.")]


async def test_slow_first_byte_times_out_and_is_retried(fake_kit: Kit, db_url: str) -> None:
    fake = fake_kit
    assert fake.server is not None
    provider: stead.Provider
    if fake.name == "openai":
        provider = OpenAIProvider(base_url=fake.server.base_url, api_key="sk-test", timeout=1.0)
    else:
        provider = AnthropicProvider(base_url=fake.server.base_url, api_key="sk-ant-test", timeout=1.0)
    fake.push(Reply([Text("too late")], first_byte_delay=30.0), Reply([Text("On time.")]))
    try:
        async with await stead.open(db_url, providers={"slow": provider}, retry=FAST) as system:
            agent = await system.create(provider="slow", model="m")
            await ask(agent, "hi")
            history = await agent.history()
    finally:
        await provider.aclose()  # type: ignore[attr-defined]
    assert shape(history) == [("user", [("text", "hi")]), ("assistant", [("text", "On time.")])]


@pytest.mark.parametrize("status", ["401", "400"])
async def test_fatal_error_fails_the_turn_with_a_note_and_settles(kit: Kit, status: str, db_url: str) -> None:
    kit.push(kit.fault(status), Reply([Text("Back again.")]))
    async with await kit.open(db_url) as system:
        agent = await kit.create(system)
        watch = await ask(agent, "hi")
        history = await agent.history()
        assert kit.request_count == 1  # not retried
        assert not agent.active
        assert [m.role for m in history] == ["user", "system"]
        note = history[-1].text
        assert note.startswith("The last turn failed: ")
        if kit.name == "openai":
            assert "401" in note or "400" in note
        (done,) = watch.of(stead.Done)
        assert done.reason == "error" and done.error is not None
        (settled,) = watch.of(stead.Settled)
        assert settled.error == done.error
        # C6: the next inference sees the note, and the agent keeps working
        await ask(agent, "again")
        assert "The last turn failed" in kit.last_request_text()
        history = await agent.history()
        assert shape(history)[-1] == ("assistant", [("text", "Back again.")])


async def test_missing_retries_fail_the_turn_after_max_attempts(kit: Kit, db_url: str) -> None:
    kit.push(*(kit.fault("500") for _ in range(FAST.max_attempts)), Reply([Text("next")]))
    async with await kit.open(db_url) as system:
        agent = await kit.create(system)
        await ask(agent, "hi")
        history = await agent.history()
        assert kit.request_count == FAST.max_attempts
        assert [m.role for m in history] == ["user", "system"]
        assert history[-1].text.startswith("The last turn failed: ")
        assert not agent.active


# -------------------------------------------------------------------------------------------- no duplicates
async def test_cut_after_completed_block_and_mid_next_keeps_each_block_once(
    fake_kit: Kit, db_url: str
) -> None:
    """Reasoning completes, the answer is cut mid-block: the reasoning is kept once, the answer is retried
    (the retried request replays the persisted reasoning, and the cut text nowhere)."""
    assert fake_kit.server is not None
    cut = Reply([Reasoning("Weighing options."), Text("A cut answer text.")], chunk=3)
    cut.cut_after = frame_index(fake_kit.server, cut, '"ans') + 1  # "A c", "ut ", "ans": mid-block
    fake_kit.push(cut, Reply([Text("Final answer.")]))
    async with await fake_kit.open(db_url) as system:
        agent = await fake_kit.create(system)
        watch = await ask(agent, "hi")
        history = await agent.history()
    assert shape(history) == [
        ("user", [("text", "hi")]),
        ("assistant", [("reasoning", "Weighing options.")]),
        ("assistant", [("text", "Final answer.")]),
    ]
    retried = fake_kit.last_request_text()
    assert "A cut" not in retried
    if fake_kit.name == "anthropic":
        assert fake_signature("Weighing options.") in retried
    assert [e.block for e in watch.of(stead.BlockEnd)] == [
        fake_kit.reasoning("Weighing options."),
        Text("Final answer."),
    ]
    assert len(watch.of(stead.BlockReset)) == 1


def _cut_after_first_call(kit: Kit) -> Reply | ScriptedResponse:
    """Two parallel calls; the stream dies after the first call block completed (OpenAI completes calls
    only at the finish, so there both are complete and the usage / [DONE] never arrive)."""
    blocks = [ToolCall("lookup", {"city": "Paris"}), ToolCall("lookup", {"city": "Rome"})]
    if kit.server is None:
        return ScriptedResponse(blocks=list(blocks), end_after=1)
    reply = Reply(blocks, chunk=4)
    if kit.name == "anthropic":
        start = frame_index(kit.server, reply, '"content_block_stop"')
        reply.cut_after = start + 1
    else:
        reply.cut_after = frame_index(kit.server, reply, '"finish_reason":"tool_calls"') + 1
    return reply


def _cut_mid_call(kit: Kit) -> Reply | ScriptedResponse:
    blocks = [ToolCall("lookup", {"city": "Paris"}), ToolCall("lookup", {"city": "Rome"})]
    if kit.server is None:
        return ScriptedResponse(blocks=[], half_block="", end_after=0)
    reply = Reply(blocks, chunk=4)
    reply.cut_after = frame_index(kit.server, reply, "Pa") + 1  # inside the first call's arguments
    return reply


@pytest.mark.parametrize("where", ["after_completed_call", "mid_call"])
async def test_cut_tool_call_stream_never_duplicates_a_call(kit: Kit, where: str, db_url: str) -> None:
    cut = _cut_after_first_call(kit) if where == "after_completed_call" else _cut_mid_call(kit)
    kit.push(
        cut,
        Reply([ToolCall("lookup", {"city": "Paris"}), ToolCall("lookup", {"city": "Rome"})], chunk=4),
        Reply([Text("Both sunny.")]),
    )
    agent, history, _ = await converse(kit, db_url, "weather?")
    assert_calls_settled_once(history)
    calls, results = calls_and_results(history)
    by_id = {r.call_id: r for r in results}
    run = [c for c in calls if not by_id[c.id or ""].is_error]
    cut_calls = [c for c in calls if by_id[c.id or ""].is_error]
    # the retried response's two calls ran exactly once each; calls of the cut response never ran
    assert [c.arguments for c in run] == [{"city": "Paris"}, {"city": "Rome"}]
    assert executions == Counter({c.id: 1 for c in run})
    for c in cut_calls:
        assert "cut off" in by_id[c.id or ""].output and executions[c.id or ""] == 0
    if where == "mid_call":
        assert cut_calls == []
    else:
        expected_cut = 2 if kit.name == "openai" else 1
        assert len(cut_calls) == expected_cut
    assert [m.text for m in history if m.role == "assistant" and m.text] == ["Both sunny."]
    assert sum(1 for m in history if m.role == "user") == 1
    assert not agent.active


async def test_history_after_reopen_equals_live_history(fake_kit: Kit, db_url: str) -> None:
    """R4: the conversation a restarted process sends is the one the live process sent."""
    fake_kit.push(
        Reply([Reasoning("Hmm."), ToolCall("lookup", {"city": "Oslo"})], chunk=3),
        Reply([Text("Oslo is sunny.")]),
        Reply([Text("ok")]),
        Reply([Text("ok")]),
    )
    async with await fake_kit.open(db_url) as system:
        agent = await fake_kit.create(system)
        await ask(agent, "Oslo?")
        await ask(agent, "thanks")
        live = fake_kit.server.requests[-1].body["messages"] if fake_kit.server else None
        agent_id = agent.id
    async with await fake_kit.open(db_url) as system:
        agent = await system.get(agent_id)
        await ask(agent, "thanks", id=None)
        assert fake_kit.server is not None
        again = fake_kit.server.requests[-1].body["messages"]
    assert live is not None
    # the same conversation prefix (Anthropic moves its cache breakpoint to the newest block)
    assert _uncached(again[: len(live)]) == _uncached(live)


def _uncached(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _uncached(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_uncached(v) for v in value]
    return value


# -------------------------------------------------------------------------------------------- config errors
async def test_missing_key_names_the_variable(db_url: str) -> None:
    async with await stead.open(db_url) as system:
        with pytest.raises(stead.ConfigurationError, match="OPENAI_API_KEY"):
            await system.create(model="openai:gpt-4.1-mini")
        with pytest.raises(stead.ConfigurationError, match="ANTHROPIC_API_KEY"):
            await system.create(model="anthropic:claude-sonnet-4-6")
        with pytest.raises(stead.ConfigurationError, match="OPENAI_API_KEY"):
            await system.create(model="gpt-4.1-mini")  # a bare catalog name
        assert await system.agents() == []


async def test_missing_key_on_a_per_message_switch_refuses_the_message(db_url: str) -> None:
    async with await stead.open(
        db_url, providers={"scripted": ScriptedProvider(lambda r: [Text("x")])}
    ) as system:
        agent = await system.create(model="scripted:demo")
        with pytest.raises(stead.ConfigurationError, match="ANTHROPIC_API_KEY"):
            await agent.send("hi", model="anthropic:claude-haiku-4-5")
        assert not agent.active and await agent.history() == []
        assert agent.settings["provider"] == "scripted"


async def test_unknown_model_says_how_to_name_it(db_url: str) -> None:
    async with await stead.open(db_url) as system:
        with pytest.raises(stead.ConfigurationError, match="unknown model 'gpt-nope'") as info:
            await system.create(model="gpt-nope")
        assert "openai:gpt-nope" in str(info.value)
        with pytest.raises(stead.ConfigurationError, match="base URL"):
            await system.create(model="openai-compatible:llama3.2")
        with pytest.raises(stead.ConfigurationError, match="model="):
            await system.create()


async def test_no_vendor_can_serve_any_candidate(db_url: str) -> None:
    async with await stead.open(db_url) as system:
        with pytest.raises(stead.ConfigurationError) as info:
            await system.create(model=["anthropic:claude-sonnet-4-6", "openai:gpt-5.4", "mystery-model"])
    text = str(info.value)
    assert text.startswith("none of the models given can be used")
    assert "ANTHROPIC_API_KEY" in text and "OPENAI_API_KEY" in text and "mystery-model" in text


async def test_candidates_pick_the_first_usable(
    db_url: str, openai_kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert openai_kit.server is not None
    openai_kit.push(Reply([Text("from the local server")]))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model=["anthropic:claude-sonnet-4-6", openai_kit.model])
        await ask(agent, "hi")
        assert (await agent.history())[-1].text == "from the local server"
    assert openai_kit.server.requests[-1].body["model"] == "gpt-x"


async def test_anthropic_through_a_catalog_override_file(
    db_url: str, anthropic_kit: Kit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog file (STEAD_CATALOG) can point a vendor at another endpoint; bare names then use it."""
    assert anthropic_kit.server is not None
    catalog = tmp_path / "models.yaml"
    catalog.write_text(
        f"vendors:\n  anthropic:\n    base_url: {anthropic_kit.server.url}\n"
        "models:\n  claude-haiku-4-5:\n    prices: {input: 2.0, output: 10.0}\n"
    )
    monkeypatch.setenv("STEAD_CATALOG", str(catalog))
    anthropic_kit.push(Reply([Text("via the catalog")], usage=Usage(1000, 100)))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model="claude-haiku-4-5")
        watch = await ask(agent, "hi")
    (done,) = watch.of(stead.Done)
    assert done.usage == Usage(1000, 100, 0, (1000 * 2.0 + 100 * 10.0) / 1_000_000)
    assert anthropic_kit.server.requests[-1].body["model"] == "claude-haiku-4-5"
    headers = anthropic_kit.server.requests[-1].headers
    assert "sk-ant-test" in headers.get("x-api-key", headers.get("authorization", ""))


__all__ = [
    "FAST",
    "Kit",
    "Watch",
    "ask",
    "assert_calls_settled_once",
    "calls_and_results",
    "executions",
    "frame_index",
    "lookup",
    "scripted_kit",
    "shape",
]
