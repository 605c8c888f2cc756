"""Fixtures for the provider tests: fake vendor servers on 127.0.0.1 and a backend per provider kind."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from stead.messages import Message, Reasoning, Text
from stead.providers.anthropic import AnthropicProvider
from stead.providers.base import Provider, ProviderRequest, StreamEvent, ToolSpec
from stead.providers.openai import OpenAIProvider
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.fakes import DEFAULT_USAGE, FakeServer, Reply
from tests.fakes.anthropic_server import AnthropicFakeServer, fake_signature
from tests.fakes.openai_server import OpenAIFakeServer


@pytest.fixture
async def openai_server() -> AsyncIterator[OpenAIFakeServer]:
    server = OpenAIFakeServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def anthropic_server() -> AsyncIterator[AnthropicFakeServer]:
    server = AnthropicFakeServer()
    await server.start()
    yield server
    await server.close()


def openai_provider(server: FakeServer, **kwargs: object) -> OpenAIProvider:
    options: dict[str, Any] = {"key_env": "OPENAI_API_KEY", **kwargs}
    return OpenAIProvider(base_url=server.base_url, api_key="sk-test", timeout=10.0, **options)


def anthropic_provider(server: FakeServer, **kwargs: object) -> AnthropicProvider:
    options: dict[str, Any] = dict(kwargs)
    return AnthropicProvider(base_url=server.base_url, api_key="sk-ant-test", timeout=10.0, **options)


@dataclass
class Backend:
    """One provider under test and the way to script its next answers."""

    name: str
    provider: Provider
    push: Callable[..., None]
    server: FakeServer | None = None

    def reasoning(self, block: Reasoning) -> Reasoning:
        """The block this backend reports for scripted reasoning (what survives its wire format)."""
        if self.name == "openai":
            return Reasoning(block.text)  # Chat Completions carries no signature
        if self.name == "anthropic":
            return Reasoning(block.text, block.signature or fake_signature(block.text), block.redacted)
        return block


def _scripted_backend() -> Backend:
    queue: deque[Reply] = deque()

    def respond(request: ProviderRequest) -> ScriptedResponse:
        reply = queue.popleft()
        done = {"stop": "stop", "tool_call": "tool_call", "length": "length"}.get(reply.stop or "")
        return ScriptedResponse(
            blocks=list(reply.blocks),
            usage=reply.usage or DEFAULT_USAGE,
            chunk=reply.chunk,
            done=done,  # type: ignore[arg-type]
        )

    def push(*replies: Reply) -> None:
        queue.extend(replies)

    return Backend("scripted", ScriptedProvider(respond), push)


@pytest.fixture(params=["scripted", "openai", "anthropic"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The same behaviour suite runs against every provider kind."""
    if request.param == "scripted":
        yield _scripted_backend()
        return
    server: FakeServer = OpenAIFakeServer() if request.param == "openai" else AnthropicFakeServer()
    await server.start()
    provider: OpenAIProvider | AnthropicProvider = (
        openai_provider(server) if request.param == "openai" else anthropic_provider(server)
    )
    try:
        yield Backend(request.param, provider, server.push, server)
    finally:
        await provider.aclose()
        await server.close()


@pytest.fixture(params=["openai", "anthropic"])
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """A real driver against its fake server (for faults and wire-level checks)."""
    server: FakeServer = OpenAIFakeServer() if request.param == "openai" else AnthropicFakeServer()
    await server.start()
    provider: OpenAIProvider | AnthropicProvider = (
        openai_provider(server) if request.param == "openai" else anthropic_provider(server)
    )
    try:
        yield Backend(request.param, provider, server.push, server)
    finally:
        await provider.aclose()
        await server.close()


def make_request(
    messages: list[Message] | None = None,
    *,
    tools: list[ToolSpec] | None = None,
    instructions: str = "Be brief.",
    model: str = "test-model",
    effort: str | None = None,
    options: dict[str, object] | None = None,
) -> ProviderRequest:
    return ProviderRequest(
        model=model,
        instructions=instructions,
        messages=messages if messages is not None else [Message("user", [Text("hi")])],
        tools=tools or [],
        effort=effort,
        options=dict(options or {}),
    )


async def collect(provider: Provider, request: ProviderRequest | None = None) -> list[StreamEvent]:
    return [event async for event in provider.stream(request or make_request())]


async def collect_until_error(
    provider: Provider, request: ProviderRequest | None = None
) -> tuple[list[StreamEvent], Exception]:
    events: list[StreamEvent] = []
    try:
        async for event in provider.stream(request or make_request()):
            events.append(event)
    except Exception as exc:
        return events, exc
    raise AssertionError(f"the stream did not fail; events: {events}")
