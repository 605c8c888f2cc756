"""Every fault of a real vendor maps to one ProviderError with the right `retryable` and `retry_after`.

`fake` runs each test against the OpenAI driver + fake OpenAI server and the Anthropic driver + fake
Anthropic server, over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio

import pytest

from stead.errors import ProviderError
from stead.messages import Text
from stead.providers.anthropic import AnthropicProvider
from stead.providers.base import BlockEnd, Done, ProviderRequest, TextDelta
from stead.providers.openai import OpenAIProvider
from tests.fakes import Reply
from tests.fakes.openai_server import OpenAIFakeServer
from tests.providers.conftest import (
    Backend,
    collect,
    collect_until_error,
    make_request,
    openai_provider,
)

LONG = "All happy families are alike; each unhappy family is unhappy in its own way."


async def _error(fake: Backend, reply: Reply) -> tuple[list[object], ProviderError]:
    fake.push(reply)
    events, exc = await collect_until_error(fake.provider)
    assert isinstance(exc, ProviderError), repr(exc)
    return list(events), exc


async def test_rate_limited_with_retry_after(fake: Backend) -> None:
    events, err = await _error(fake, Reply(status=429, headers={"retry-after": "7"}))
    assert events == []
    assert err.retryable is True
    assert err.retry_after == 7.0
    assert "rate limited" in str(err) and "429" in str(err)


async def test_rate_limited_with_retry_after_ms(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=429, headers={"retry-after-ms": "1500"}))
    assert err.retryable is True and err.retry_after == 1.5


async def test_rate_limited_without_retry_after(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=429))
    assert err.retryable is True and err.retry_after is None


async def test_server_error_is_retryable(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=500))
    assert err.retryable is True and err.retry_after is None
    assert "500" in str(err)


@pytest.mark.parametrize("status", [502, 503, 504, 408])
async def test_other_transient_statuses_are_retryable(fake: Backend, status: int) -> None:
    _, err = await _error(fake, Reply(status=status))
    assert err.retryable is True


async def test_overloaded_529(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=529, error_type="overloaded_error", error_message="Overloaded"))
    assert err.retryable is True
    assert "overloaded" in str(err).lower()


async def test_authentication_is_fatal_and_names_the_key(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=401))
    assert err.retryable is False and err.retry_after is None
    assert "authentication failed" in str(err)
    key_env = "OPENAI_API_KEY" if fake.name == "openai" else "ANTHROPIC_API_KEY"
    assert key_env in str(err)


async def test_permission_denied_is_fatal(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=403))
    assert err.retryable is False


async def test_invalid_request_is_fatal(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=400, error_message="messages: field required"))
    assert err.retryable is False
    assert "messages: field required" in str(err)


async def test_unknown_model_is_fatal(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=404))
    assert err.retryable is False and "not found" in str(err)


async def test_context_too_long_says_so(fake: Backend) -> None:
    if fake.name == "openai":
        reply = Reply(
            status=400,
            error_code="context_length_exceeded",
            error_message="This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130512 tokens. Please reduce the length of the messages.",
        )
    else:
        reply = Reply(status=400, error_message="prompt is too long: 208310 tokens > 200000 maximum")
    _, err = await _error(fake, reply)
    assert err.retryable is False
    assert "context too long" in str(err)


async def test_server_may_forbid_a_retry(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=500, headers={"x-should-retry": "false"}))
    assert err.retryable is False


async def test_server_may_ask_for_a_retry(fake: Backend) -> None:
    _, err = await _error(fake, Reply(status=400, headers={"x-should-retry": "true"}))
    assert err.retryable is True


async def test_quota_exhausted_is_fatal(openai_server: OpenAIFakeServer) -> None:
    openai_server.push(
        Reply(
            status=429,
            error_type="insufficient_quota",
            error_code="insufficient_quota",
            error_message="You exceeded your current quota, please check your plan and billing details.",
        )
    )
    provider = openai_provider(openai_server)
    _, err = await collect_until_error(provider)
    assert isinstance(err, ProviderError) and err.retryable is False
    assert "quota" in str(err)
    await provider.aclose()


async def test_stream_cut_mid_block(fake: Backend) -> None:
    # message_start/role chunk first, then a few text fragments, then the connection is aborted.
    events, err = await _error(fake, Reply([Text(LONG)], chunk=5, cut_after=5))
    assert err.retryable is True
    assert any(isinstance(e, TextDelta) for e in events)
    assert not any(isinstance(e, BlockEnd | Done) for e in events)


async def test_stream_ended_cleanly_without_terminal_event(fake: Backend) -> None:
    # The body ends properly but the terminal event ([DONE]/finish or message_stop) never came.
    events, err = await _error(fake, Reply([Text(LONG)], chunk=5, truncate_after=6))
    assert err.retryable is True
    assert "stream ended before completion" in str(err)
    assert not any(isinstance(e, Done) for e in events)


async def test_stream_ended_after_block_but_before_terminal_event(fake: Backend) -> None:
    # The text block completed, but the response did not: OpenAI's terminal event is the chunk with
    # `finish_reason` (then usage and [DONE]); Anthropic's is `message_stop`.
    fake.push(Reply([Text("short")]))
    complete = await collect(fake.provider)
    assert complete[-1] == Done("stop")
    missing = 3 if fake.name == "openai" else 1
    fake.push(Reply([Text("short")], truncate_after=len(_frames_of(fake)) - missing))
    events, err = await collect_until_error(fake.provider)
    assert isinstance(err, ProviderError) and err.retryable is True
    assert TextDelta("short") in events
    assert not any(isinstance(e, Done) for e in events)


async def test_openai_missing_done_marker_after_finish_is_tolerated(openai_server: OpenAIFakeServer) -> None:
    # The SDK swallows `data: [DONE]`, so a body that ends right after the finish and usage chunks is
    # indistinguishable from a complete one; everything the response had to say has arrived.
    provider = openai_provider(openai_server)
    openai_server.push(Reply([Text("short")]))
    await collect(provider)
    frames = openai_server.render(Reply([Text("short")]), openai_server.requests[-1].body, 1)
    openai_server.push(Reply([Text("short")], truncate_after=len(frames) - 1))
    events = await collect(provider)
    assert events[-1] == Done("stop")
    await provider.aclose()


def _frames_of(fake: Backend) -> list[bytes]:
    assert fake.server is not None
    body = fake.server.requests[-1].body
    return fake.server.render(Reply([Text("short")]), body, 1)


async def test_error_event_inside_stream_is_retryable(fake: Backend) -> None:
    events, err = await _error(fake, Reply([Text(LONG)], chunk=5, stream_error_after=4))
    assert err.retryable is True
    assert not any(isinstance(e, Done) for e in events)


async def test_invalid_request_error_inside_stream_is_fatal(fake: Backend) -> None:
    _, err = await _error(
        fake,
        Reply(
            [Text(LONG)],
            chunk=5,
            stream_error_after=3,
            error_type="invalid_request_error",
            error_message="bad",
        ),
    )
    assert err.retryable is False


async def test_slow_first_byte_times_out(fake: Backend) -> None:
    assert fake.server is not None
    if fake.name == "openai":
        provider: OpenAIProvider | AnthropicProvider = OpenAIProvider(
            base_url=fake.server.base_url, api_key="sk-test", timeout=0.3
        )
    else:
        provider = AnthropicProvider(base_url=fake.server.base_url, api_key="sk-ant-test", timeout=0.3)
    fake.push(Reply([Text("too late")], first_byte_delay=30.0))
    events, err = await collect_until_error(provider)
    assert isinstance(err, ProviderError) and err.retryable is True
    assert "timed out" in str(err)
    assert events == []
    await provider.aclose()


async def test_slow_first_byte_within_timeout_succeeds(fake: Backend) -> None:
    fake.push(Reply([Text("worth the wait")], first_byte_delay=0.05))
    events = await collect(fake.provider)
    assert events[-1] == Done("stop")


async def test_connection_refused_is_retryable(fake: Backend) -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    if fake.name == "openai":
        provider: OpenAIProvider | AnthropicProvider = OpenAIProvider(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", timeout=5.0
        )
    else:
        provider = AnthropicProvider(base_url=f"http://127.0.0.1:{port}", api_key="sk-ant-test", timeout=5.0)
    _, err = await collect_until_error(provider)
    assert isinstance(err, ProviderError) and err.retryable is True
    assert "connection failed" in str(err)
    await provider.aclose()


async def test_provider_recovers_after_each_fault(fake: Backend) -> None:
    fake.push(
        Reply(status=529),
        Reply([Text(LONG)], chunk=5, cut_after=4),
        Reply([Text(LONG)], chunk=5, truncate_after=4),
        Reply([Text("fine")]),
    )
    for _ in range(3):
        _, err = await collect_until_error(fake.provider)
        assert isinstance(err, ProviderError) and err.retryable
    events = await collect(fake.provider)
    assert events[-1] == Done("stop") and BlockEnd(Text("fine")) in events


async def test_consumer_stopping_early_releases_the_stream(fake: Backend) -> None:
    fake.push(Reply([Text(LONG)], chunk=2), Reply([Text("next")]))
    stream = fake.provider.stream(_request())
    first = await stream.__anext__()
    assert isinstance(first, TextDelta)
    await stream.aclose()  # type: ignore[attr-defined]
    events = await collect(fake.provider)
    assert BlockEnd(Text("next")) in events


def _request() -> ProviderRequest:
    return make_request()
