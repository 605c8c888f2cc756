"""One behaviour suite for every provider kind: the same script must give the same normalized events.

`backend` runs each test against the scripted provider, the OpenAI driver talking to the fake OpenAI server,
and the Anthropic driver talking to the fake Anthropic server.
"""

from __future__ import annotations

from stead.messages import Reasoning, Text, ToolCall, Usage
from stead.providers.base import BlockEnd, Done, ReasoningDelta, StreamEvent, TextDelta, UsageEvent
from tests.fakes import DEFAULT_USAGE, Reply
from tests.providers.conftest import Backend, collect


def _deltas(kind: type[TextDelta] | type[ReasoningDelta], text: str, size: int) -> list[StreamEvent]:
    size = size or len(text)
    return [kind(text[i : i + size]) for i in range(0, len(text), size)]


async def test_plain_answer(backend: Backend) -> None:
    backend.push(Reply([Text("Hello there")]))
    assert await collect(backend.provider) == [
        TextDelta("Hello there"),
        BlockEnd(Text("Hello there")),
        UsageEvent(DEFAULT_USAGE),
        Done("stop"),
    ]


async def test_streaming_deltas(backend: Backend) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    backend.push(Reply([Text(text)], chunk=4))
    events = await collect(backend.provider)
    assert events == [
        *_deltas(TextDelta, text, 4),
        BlockEnd(Text(text)),
        UsageEvent(DEFAULT_USAGE),
        Done("stop"),
    ]
    assert len([e for e in events if isinstance(e, TextDelta)]) == 11


async def test_unicode_text_survives_fragmenting(backend: Backend) -> None:
    text = "naïve café — 東京 🚀 done"
    backend.push(Reply([Text(text)], chunk=3))
    events = await collect(backend.provider)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text
    assert BlockEnd(Text(text)) in events


async def test_single_tool_call(backend: Backend) -> None:
    call = ToolCall("add", {"a": 1, "b": 2})
    backend.push(Reply([Text("Adding."), call], chunk=3))
    assert await collect(backend.provider) == [
        *_deltas(TextDelta, "Adding.", 3),
        BlockEnd(Text("Adding.")),
        BlockEnd(ToolCall("add", {"a": 1, "b": 2})),
        UsageEvent(DEFAULT_USAGE),
        Done("tool_call"),
    ]


async def test_tool_call_ids_are_left_to_stead(backend: Backend) -> None:
    backend.push(Reply([ToolCall("add", {"a": 1})]))
    calls = [e.block for e in await collect(backend.provider) if isinstance(e, BlockEnd)]
    assert calls == [ToolCall("add", {"a": 1})]
    assert all(isinstance(c, ToolCall) and c.id is None for c in calls)


async def test_parallel_tool_calls(backend: Backend) -> None:
    calls = [
        ToolCall("get_weather", {"city": "Paris", "unit": "celsius"}),
        ToolCall("get_weather", {"city": "Tokyo", "unit": "celsius"}),
        ToolCall("get_time", {"tz": "Asia/Tokyo"}),
    ]
    backend.push(Reply(list(calls), chunk=5))
    assert await collect(backend.provider) == [
        *[BlockEnd(c) for c in calls],
        UsageEvent(DEFAULT_USAGE),
        Done("tool_call"),
    ]


async def test_tool_call_without_arguments(backend: Backend) -> None:
    backend.push(Reply([ToolCall("now", {})]))
    events = await collect(backend.provider)
    assert events[0] == BlockEnd(ToolCall("now", {}))
    assert events[-1] == Done("tool_call")


async def test_malformed_tool_arguments_are_kept_raw(backend: Backend) -> None:
    backend.push(Reply([ToolCall("add", '{"a": 1, "b": ')], chunk=4))
    events = await collect(backend.provider)
    assert events[0] == BlockEnd(ToolCall("add", '{"a": 1, "b": '))
    assert events[-1] == Done("tool_call")


async def test_reasoning_then_answer(backend: Backend) -> None:
    thought = Reasoning("The user greets me; I should greet back.", signature="sig-abc")
    backend.push(Reply([thought, Text("Hi!")], chunk=8))
    assert await collect(backend.provider) == [
        *_deltas(ReasoningDelta, thought.text, 8),
        BlockEnd(backend.reasoning(thought)),
        TextDelta("Hi!"),
        BlockEnd(Text("Hi!")),
        UsageEvent(DEFAULT_USAGE),
        Done("stop"),
    ]


async def test_reasoning_then_tool_call(backend: Backend) -> None:
    thought = Reasoning("I need the weather.")
    call = ToolCall("get_weather", {"city": "Oslo"})
    backend.push(Reply([thought, call], chunk=6))
    assert await collect(backend.provider) == [
        *_deltas(ReasoningDelta, thought.text, 6),
        BlockEnd(backend.reasoning(thought)),
        BlockEnd(call),
        UsageEvent(DEFAULT_USAGE),
        Done("tool_call"),
    ]


async def test_usage_with_cached_tokens(backend: Backend) -> None:
    usage = Usage(input_tokens=12_000, output_tokens=345, cached_tokens=11_000)
    backend.push(Reply([Text("ok")], usage=usage))
    events = await collect(backend.provider)
    assert events[-2:] == [UsageEvent(usage), Done("stop")]


async def test_length_limit(backend: Backend) -> None:
    backend.push(Reply([Text("This answer was cut")], stop="length"))
    events = await collect(backend.provider)
    assert events[-1] == Done("length")
    assert BlockEnd(Text("This answer was cut")) in events


async def test_consecutive_responses(backend: Backend) -> None:
    backend.push(Reply([Text("one")]), Reply([ToolCall("t", {"x": 1})]), Reply([Text("three")]))
    first = await collect(backend.provider)
    second = await collect(backend.provider)
    third = await collect(backend.provider)
    assert first[-1] == Done("stop") and second[-1] == Done("tool_call") and third[-1] == Done("stop")
    assert BlockEnd(Text("three")) in third


async def test_exactly_one_done_and_it_is_last(backend: Backend) -> None:
    backend.push(Reply([Reasoning("hmm"), Text("a"), ToolCall("t", {}), ToolCall("u", {"k": "v"})], chunk=1))
    events = await collect(backend.provider)
    dones = [e for e in events if isinstance(e, Done)]
    assert dones == [Done("tool_call")] and events[-1] is dones[0]
    assert isinstance(events[-2], UsageEvent)
