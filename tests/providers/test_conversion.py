"""What each driver sends: history, tools and settings in the vendor's wire format (asserted on the fakes)."""

from __future__ import annotations

from typing import Any

import pytest

from stead.errors import ConfigurationError
from stead.messages import Message, Reasoning, Text, ToolCall, ToolResult
from stead.providers.anthropic import AnthropicProvider
from stead.providers.base import BlockEnd, ToolSpec
from stead.providers.openai import OpenAIProvider
from tests.fakes import Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.openai_server import OpenAIFakeServer
from tests.providers.conftest import anthropic_provider, collect, make_request, openai_provider

ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
NOW = ToolSpec("now", "The current time.", {"type": "object", "properties": {}})

HISTORY = [
    Message("user", [Text("What is 1+2 and 3*4?")], id="m1"),
    Message(
        "assistant",
        [
            Reasoning("Two tools, in parallel.", signature="sig-1"),
            Text("Let me compute."),
            ToolCall("add", {"a": 1, "b": 2}, id="call-a"),
            ToolCall("mul", '{"a": 3, "b":', id="call-b"),
        ],
    ),
    Message("tool", [ToolResult("call-a", "3")]),
    Message("tool", [ToolResult("call-b", "arguments are not valid JSON", is_error=True)]),
    Message("assistant", [Text("1+2=3; let me retry the product.")]),
    Message("user", [Text("Thanks!")], id="m2"),
]


# -- OpenAI -------------------------------------------------------------------------------------------------


async def test_openai_history_tools_and_settings(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(HISTORY, tools=[ADD, NOW], model="gpt-4.1-mini"))
    sent = openai_server.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "gpt-4.1-mini"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1+2 and 3*4?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "id": "call-a",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":1,"b":2}'},
                },
                {
                    "id": "call-b",
                    "type": "function",
                    "function": {"name": "mul", "arguments": '{"a": 3, "b":'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call-a", "content": "3"},
        {"role": "tool", "tool_call_id": "call-b", "content": "arguments are not valid JSON"},
        {"role": "assistant", "content": "1+2=3; let me retry the product."},
        {"role": "user", "content": "Thanks!"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": ADD.description, "parameters": ADD.parameters},
        },
        {
            "type": "function",
            "function": {"name": "now", "description": NOW.description, "parameters": NOW.parameters},
        },
    ]
    assert "reasoning_effort" not in body
    await provider.aclose()


async def test_openai_omits_empty_tools_and_instructions(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(instructions=""))
    body = openai_server.requests[-1].body
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    await provider.aclose()


async def test_openai_effort_and_options(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("ok")]))
    await collect(
        provider, make_request(effort="low", options={"temperature": 0.2, "max_completion_tokens": 99})
    )
    body = openai_server.requests[-1].body
    assert body["reasoning_effort"] == "low"
    assert body["temperature"] == 0.2 and body["max_completion_tokens"] == 99
    await provider.aclose()


async def test_openai_bound_model_wins(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server, model="llama3.2")
    openai_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(model="ollama:llama3.2"))
    assert openai_server.requests[-1].body["model"] == "llama3.2"
    await provider.aclose()


@pytest.mark.parametrize(
    ("model", "wire"),
    [
        ("openai:gpt-4.1-mini", "gpt-4.1-mini"),
        ("ollama:llama3.2:3b@http://h/v1", "llama3.2:3b"),
        ("qwen2.5:7b", "qwen2.5:7b"),
    ],
)
async def test_vendor_prefix_is_not_sent(openai_server: OpenAIFakeServer, model: str, wire: str) -> None:
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(model=model))
    assert openai_server.requests[-1].body["model"] == wire
    await provider.aclose()


async def test_openai_round_trip_uses_stead_ids(openai_server: OpenAIFakeServer) -> None:
    """Ids the server gave its tool calls are never replayed; the ids stead assigned are."""
    provider = openai_provider(openai_server)
    openai_server.push(Reply([ToolCall("add", {"a": 1, "b": 2})], chunk=3), Reply([Text("3")]))
    events = await collect(provider, make_request(tools=[ADD]))
    (call,) = [e.block for e in events if isinstance(e, BlockEnd) and isinstance(e.block, ToolCall)]
    assert call.id is None
    stored = ToolCall(call.name, call.arguments, id="stead-call-1")
    history = [
        Message("user", [Text("hi")]),
        Message("assistant", [stored]),
        Message("tool", [ToolResult("stead-call-1", "3")]),
    ]
    await collect(provider, make_request(history, tools=[ADD]))
    sent = openai_server.requests[-1].body["messages"]
    assert sent[2]["tool_calls"][0]["id"] == "stead-call-1"
    assert sent[3] == {"role": "tool", "tool_call_id": "stead-call-1", "content": "3"}
    assert "call_fake" not in str(sent)
    await provider.aclose()


async def test_openai_compatible_server_needs_no_key_and_never_gets_yours(
    openai_server: OpenAIFakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    provider = OpenAIProvider(base_url=openai_server.base_url, name="ollama")
    openai_server.push(Reply([Text("local")]))
    events = await collect(provider, make_request(model="llama3.2"))
    assert BlockEnd(Text("local")) in events
    assert "sk-real-secret" not in openai_server.requests[-1].headers.get("authorization", "")
    await provider.aclose()


def test_openai_needs_a_key_for_openai_itself() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        OpenAIProvider()


async def test_openai_reasoning_field_variant() -> None:
    """vLLM and Ollama stream `reasoning` rather than `reasoning_content`."""
    server = OpenAIFakeServer(reasoning_field="reasoning")
    await server.start()
    provider = openai_provider(server)
    server.push(Reply([Reasoning("pondering"), Text("done")], chunk=4))
    events = await collect(provider)
    assert BlockEnd(Reasoning("pondering")) in events
    await provider.aclose()
    await server.close()


async def test_openai_interleaved_parallel_fragments(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server)
    calls = [ToolCall("a", {"x": "first value"}), ToolCall("b", {"y": "second value"})]
    openai_server.push(Reply(list(calls), chunk=3, interleave=True))
    events = await collect(provider)
    assert [e.block for e in events if isinstance(e, BlockEnd)] == calls
    await provider.aclose()


async def test_openai_tool_calls_with_finish_reason_stop(openai_server: OpenAIFakeServer) -> None:
    """Some compatible servers say `stop` after tool calls; the response still asks for tools."""
    provider = openai_provider(openai_server)
    openai_server.push(Reply([ToolCall("now", {})], stop="stop"))
    events = await collect(provider)
    assert events[-1].type == "done" and events[-1].reason == "tool_call"
    await provider.aclose()


async def test_openai_content_filter_is_an_error_done(openai_server: OpenAIFakeServer) -> None:
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("partial")], stop="content_filter"))
    events = await collect(provider)
    last = events[-1]
    assert last.type == "done" and last.reason == "error" and "content_filter" in (last.error or "")
    await provider.aclose()


# -- Anthropic ----------------------------------------------------------------------------------------------


async def test_anthropic_history_tools_and_settings(anthropic_server: AnthropicFakeServer) -> None:
    provider = anthropic_provider(anthropic_server)
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(HISTORY, tools=[ADD, NOW], model="claude-sonnet-4-6"))
    sent = anthropic_server.requests[-1]
    assert sent.path == "/v1/messages"
    # The key goes in x-api-key (SDK 0.x) or as a bearer token (SDK 2.x).
    assert "sk-ant-test" in (sent.headers.get("x-api-key", "") + sent.headers.get("authorization", ""))
    assert "anthropic-version" in sent.headers
    body = sent.body
    assert body["model"] == "claude-sonnet-4-6"
    assert body["stream"] is True
    assert body["max_tokens"] == 4096
    assert "thinking" not in body
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["tools"] == [
        {"name": "add", "description": ADD.description, "input_schema": ADD.parameters},
        {"name": "now", "description": NOW.description, "input_schema": NOW.parameters},
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is 1+2 and 3*4?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Two tools, in parallel.", "signature": "sig-1"},
                {"type": "text", "text": "Let me compute."},
                {"type": "tool_use", "id": "call-a", "name": "add", "input": {"a": 1, "b": 2}},
                {
                    "type": "tool_use",
                    "id": "call-b",
                    "name": "mul",
                    "input": {"_invalid_arguments": '{"a": 3, "b":'},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call-a", "content": "3"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call-b",
                    "content": "arguments are not valid JSON",
                    "is_error": True,
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "1+2=3; let me retry the product."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks!", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    await provider.aclose()


async def test_anthropic_tool_results_come_first_when_merged_with_text(
    anthropic_server: AnthropicFakeServer,
) -> None:
    provider = anthropic_provider(anthropic_server, cache=False)
    history = [
        Message("user", [Text("go")]),
        Message("assistant", [ToolCall("now", {}, id="c1")]),
        Message("user", [Text("also, hurry")]),  # steering that arrived with the result
        Message("tool", [ToolResult("c1", "12:00")]),
    ]
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(history))
    body = anthropic_server.requests[-1].body
    assert body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "12:00"},
            {"type": "text", "text": "also, hurry"},
        ],
    }
    assert body["system"] == "Be brief."
    assert "cache_control" not in str(body)
    await provider.aclose()


async def test_anthropic_thinking_replayed_verbatim_after_restart(
    anthropic_server: AnthropicFakeServer,
) -> None:
    """Thinking comes back with its signature; a new provider (a restarted process) replays it exactly."""
    provider = anthropic_provider(anthropic_server)
    thought = Reasoning("Let me think about the weather tool.", signature="EqQBCkYIARgCIkD-opaque==")
    anthropic_server.push(Reply([thought, ToolCall("get_weather", {"city": "Oslo"})], chunk=7))
    events = await collect(provider, make_request(tools=[ADD], effort="low"))
    blocks = [e.block for e in events if isinstance(e, BlockEnd)]
    assert blocks == [thought, ToolCall("get_weather", {"city": "Oslo"})]
    await provider.aclose()

    stored = [blocks[0], ToolCall("get_weather", {"city": "Oslo"}, id="stead-c1")]
    history = [
        Message("user", [Text("hi")]),
        Message("assistant", stored),
        Message("tool", [ToolResult("stead-c1", "sunny")]),
    ]
    restarted = anthropic_provider(anthropic_server)
    anthropic_server.push(Reply([Text("It is sunny.")]))
    await collect(restarted, make_request(history, tools=[ADD], effort="low"))
    first, second = anthropic_server.requests[-2].body, anthropic_server.requests[-1].body
    assert second["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "Let me think about the weather tool.",
        "signature": "EqQBCkYIARgCIkD-opaque==",
    }
    assert second["messages"][1]["content"][1]["id"] == "stead-c1"
    assert second["messages"][2]["content"][0]["tool_use_id"] == "stead-c1"
    assert "toolu_fake" not in str(second)
    # The cached prefix (tools + system) is identical across the restart.
    assert first["system"] == second["system"] and first["tools"] == second["tools"]
    await restarted.aclose()


async def test_anthropic_redacted_thinking_round_trip(anthropic_server: AnthropicFakeServer) -> None:
    provider = anthropic_provider(anthropic_server)
    redacted = Reasoning("EmwKAhgBEgy3va3pzix/LafPsn4a", redacted=True)
    anthropic_server.push(Reply([redacted, Text("ok")]))
    events = await collect(provider)
    assert BlockEnd(Reasoning("EmwKAhgBEgy3va3pzix/LafPsn4a", None, redacted=True)) in events
    anthropic_server.push(Reply([Text("again")]))
    history = [
        Message("user", [Text("hi")]),
        Message("assistant", [redacted, Text("ok")]),
        Message("user", [Text("more")]),
    ]
    await collect(provider, make_request(history))
    assert anthropic_server.requests[-1].body["messages"][1]["content"][0] == {
        "type": "redacted_thinking",
        "data": "EmwKAhgBEgy3va3pzix/LafPsn4a",
    }
    await provider.aclose()


async def test_anthropic_drops_unsigned_reasoning(anthropic_server: AnthropicFakeServer) -> None:
    """Reasoning from another vendor has no signature; Anthropic would reject it, so it is not sent."""
    provider = anthropic_provider(anthropic_server)
    history = [Message("user", [Text("hi")]), Message("assistant", [Reasoning("mine"), Text("hello")])]
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request([*history, Message("user", [Text("and?")])]))
    assert anthropic_server.requests[-1].body["messages"][1]["content"] == [{"type": "text", "text": "hello"}]
    await provider.aclose()


@pytest.mark.parametrize(("effort", "budget"), [("low", 2048), ("high", 24576), ("3000", 3000)])
async def test_anthropic_effort_on_budgeted_thinking_models(
    anthropic_server: AnthropicFakeServer, effort: str, budget: int
) -> None:
    provider = anthropic_provider(anthropic_server, max_tokens=1000, model="claude-haiku-4-5")
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(effort=effort, options={"temperature": 1}))
    body = anthropic_server.requests[-1].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == 1000 + budget
    assert body["temperature"] == 1
    assert "output_config" not in body
    await provider.aclose()


@pytest.mark.parametrize(("effort", "level"), [("minimal", "low"), ("medium", "medium"), ("max", "max")])
async def test_anthropic_effort_on_adaptive_thinking_models(
    anthropic_server: AnthropicFakeServer, effort: str, level: str
) -> None:
    provider = anthropic_provider(anthropic_server, max_tokens=1000)
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(model="claude-opus-4-7", effort=effort))
    body = anthropic_server.requests[-1].body
    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"] == {"effort": level}
    assert body["max_tokens"] == 1000
    await provider.aclose()


async def test_anthropic_options_override_thinking(anthropic_server: AnthropicFakeServer) -> None:
    provider = anthropic_provider(anthropic_server)
    anthropic_server.push(Reply([Text("ok")]))
    mine = {"type": "enabled", "budget_tokens": 5000}
    await collect(provider, make_request(effort="high", options={"thinking": mine}))
    assert anthropic_server.requests[-1].body["thinking"] == mine
    await provider.aclose()


async def test_anthropic_no_effort_no_thinking(anthropic_server: AnthropicFakeServer) -> None:
    provider = anthropic_provider(anthropic_server)
    anthropic_server.push(Reply([Text("ok")]))
    await collect(provider, make_request(effort="none"))
    body = anthropic_server.requests[-1].body
    assert "thinking" not in body and "output_config" not in body
    await provider.aclose()


async def test_anthropic_unknown_effort(anthropic_server: AnthropicFakeServer) -> None:
    provider = anthropic_provider(anthropic_server)
    with pytest.raises(ConfigurationError, match="unknown effort"):
        await collect(provider, make_request(effort="extreme"))
    await provider.aclose()


def test_anthropic_needs_a_key() -> None:
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider()


async def test_anthropic_usage_counts_cache_reads_and_writes() -> None:
    """input_tokens excludes cached tokens on the wire; stead's Usage.input_tokens includes them."""
    from stead.providers.anthropic import _StreamState

    class U:
        input_tokens = 50
        cache_read_input_tokens = 1000
        cache_creation_input_tokens = 200
        output_tokens = 1

    class Start:
        type = "message_start"

        class message:
            usage = U

    state = _StreamState(None)
    state.feed(Start)
    stop: Any = type("Stop", (), {"type": "message_stop"})
    state.feed(stop)
    usage_event = state.end()[0]
    assert usage_event.type == "usage"
    assert (usage_event.usage.input_tokens, usage_event.usage.cached_tokens) == (1250, 1000)
