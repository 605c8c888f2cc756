"""The OpenAI driver: Chat Completions streaming on the official `openai` SDK.

It also talks to any OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio) through `base_url`;
those need no key. The SDK's own retries are off (`max_retries=0`): the kernel retries
`ProviderError(retryable=True)` with backoff while the stage stays durable.

Normalization: a `TextDelta` per content delta and a `ReasoningDelta` per `reasoning_content` /
`reasoning` delta (sent by servers that expose reasoning); reasoning ends when content or a tool call
starts, text ends when a tool call starts or at the finish; tool calls are assembled from index-keyed
fragments and end at the finish, their arguments JSON-parsed (the raw text is kept when that fails).
Provider tool-call ids are dropped: stead assigns its own and replays them as the wire ids. The stream ends
with `UsageEvent` (when the server reports usage) and `Done`; a stream that stops before a `finish_reason`
raises a retryable ProviderError.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import openai

from stead.errors import ConfigurationError, ProviderError
from stead.messages import Reasoning, Text, ToolCall, Usage
from stead.providers import _errors
from stead.providers._client import LoopBoundClient
from stead.providers._context import parse_arguments, to_openai_messages, to_openai_tools
from stead.providers._naming import wire_model
from stead.providers._options import openai_options, openai_response_format
from stead.providers._pricing import Prices
from stead.providers.base import (
    BlockEnd,
    Done,
    DoneReason,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    UsageEvent,
)

__all__ = ["OpenAIProvider"]

_NO_KEY = "sk-no-key-required"
_FINISH: dict[str, DoneReason] = {
    "stop": "stop",
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "length": "length",
}


class OpenAIProvider:
    """A `Provider` for OpenAI Chat Completions and OpenAI-compatible servers.

    - `api_key`: defaults to `OPENAI_API_KEY` when talking to OpenAI itself (no `base_url`); a server at a
      `base_url` gets a placeholder key unless one is given (your OpenAI key is never sent elsewhere).
    - `model`: when set, sent instead of `ProviderRequest.model` (a provider built for a route);
      otherwise `ProviderRequest.model` is sent without a vendor prefix (`openai:gpt-4.1` -> `gpt-4.1`).
    - `prices`: when set, `Usage.cost` is filled in.
    - `client`: an `openai.AsyncOpenAI` to use as is (its retry settings are then yours).
    - `ProviderRequest.effort` becomes `reasoning_effort`; `ProviderRequest.model_options` are mapped to
      Chat Completions fields (`stead.providers._options`); `ProviderRequest.output_schema` is sent as
      `response_format` `json_schema`; `ProviderRequest.options` are merged into the request body last
      (e.g. `{"logit_bias": {...}}`).
    - `ProviderRequest.max_output_tokens` (the kernel's output cap, MR1; a definition's
      `model_options.max_tokens` is that cap) is sent as `max_tokens_field`:
      `max_completion_tokens` for OpenAI itself (its reasoning models refuse `max_tokens`), `max_tokens`
      for a server at a `base_url` (llama.cpp, Ollama, vLLM and LM Studio all read it). The default follows
      `base_url`; the catalog's `openai` vendor always uses `max_completion_tokens`.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        name: str = "openai",
        client: openai.AsyncOpenAI | None = None,
        timeout: float | None = 600.0,
        model: str | None = None,
        prices: Prices | None = None,
        key_env: str | None = None,
        max_tokens_field: Literal["max_completion_tokens", "max_tokens"] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.prices = prices
        self.base_url = base_url
        self.max_tokens_field = max_tokens_field or (
            "max_completion_tokens" if base_url is None else "max_tokens"
        )
        self._key_env = key_env if key_env is not None else ("OPENAI_API_KEY" if base_url is None else None)
        if client is None:
            if api_key is None:
                api_key = os.environ.get("OPENAI_API_KEY") if base_url is None else None
                if api_key is None and base_url is None:
                    raise ConfigurationError(
                        f"{name}: no API key: set OPENAI_API_KEY or pass api_key= "
                        "(an OpenAI-compatible server at base_url= needs none)"
                    )
            self._api_key = api_key or _NO_KEY
        else:
            self._api_key = ""
        self._timeout = timeout
        self._clients: LoopBoundClient[openai.AsyncOpenAI] = LoopBoundClient(
            lambda: openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self._timeout
            ),
            client,
        )

    async def aclose(self) -> None:
        """Close the HTTP client this provider created (a given `client` is left open)."""
        await self._clients.aclose()

    def _error(self, exc: BaseException) -> ProviderError | None:
        return _errors.from_exception(self.name, exc, openai, key_env=self._key_env, base_url=self.base_url)

    def _body(self, request: ProviderRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """The SDK arguments, and the fields sent through `extra_body` (newer API fields and options)."""
        extra: dict[str, Any] = {}
        body: dict[str, Any] = {
            "model": self.model or wire_model(request.model),
            "messages": to_openai_messages(request.instructions, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = to_openai_tools(request.tools)
        if request.effort is not None:
            extra["reasoning_effort"] = request.effort
        if request.max_output_tokens is not None:
            body[self.max_tokens_field] = request.max_output_tokens
        try:
            extra.update(openai_options(request, compatible=self.base_url is not None))
        except ValueError as e:
            raise ProviderError(f"{self.name}: {e}", retryable=False) from None
        response_format = openai_response_format(request)
        if response_format is not None:
            extra["response_format"] = response_format
        extra.update(request.options)
        return body, extra

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        client = self._clients.get()
        body, extra = self._body(request)
        response: Any = await _errors.open_stream(
            client.chat.completions.create(**body, extra_body=extra or None), self._error
        )
        state = _StreamState(self.prices)
        async with contextlib.aclosing(_errors.read_stream(response, self._error)) as chunks:
            async for chunk in chunks:
                for event in state.feed(chunk):
                    yield event
        if state.finish is None:
            raise _errors.stream_ended(self.name)
        for event in state.end():
            yield event


@dataclass
class _Call:
    id: str | None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _StreamState:
    """Assembles one streamed completion into normalized events."""

    def __init__(self, prices: Prices | None) -> None:
        self.prices = prices
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.had_calls = False
        self._next_key = 1 << 30

    def _end_reasoning(self) -> list[StreamEvent]:
        if not self.reasoning:
            return []
        block = Reasoning("".join(self.reasoning))
        self.reasoning = []
        return [BlockEnd(block)]

    def _end_text(self) -> list[StreamEvent]:
        if not self.text:
            return []
        block = Text("".join(self.text))
        self.text = []
        return [BlockEnd(block)]

    def feed(self, chunk: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = _usage(usage)
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            delta = choice.delta
            if delta is not None:
                reasoning = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
                if isinstance(reasoning, str) and reasoning:
                    self.reasoning.append(reasoning)
                    events.append(ReasoningDelta(reasoning))
                content = delta.content or getattr(delta, "refusal", None)
                if isinstance(content, str) and content:
                    events += self._end_reasoning()
                    self.text.append(content)
                    events.append(TextDelta(content))
                if delta.tool_calls:
                    events += self._end_reasoning()
                    events += self._end_text()
                    for fragment in delta.tool_calls:
                        self._add_fragment(fragment)
            if choice.finish_reason is not None:
                self.finish = str(choice.finish_reason)
                events += self._end_reasoning()
                events += self._end_text()
                self.had_calls = self.had_calls or bool(self.calls)
                for call in self.calls.values():
                    events.append(BlockEnd(ToolCall(call.name, parse_arguments("".join(call.arguments)))))
                self.calls = {}
        return events

    def _add_fragment(self, fragment: Any) -> None:
        index = int(getattr(fragment, "index", None) or 0)
        fragment_id = getattr(fragment, "id", None)
        call = self.calls.get(index)
        if call is not None and fragment_id and call.id and fragment_id != call.id:
            # Some servers number every call 0; a new id at a used index starts a new call.
            index, self._next_key = self._next_key, self._next_key + 1
            call = None
        if call is None:
            call = self.calls[index] = _Call(id=fragment_id)
        elif fragment_id and not call.id:
            call.id = fragment_id
        function = getattr(fragment, "function", None)
        if function is not None:
            if function.name:
                call.name += function.name
            if function.arguments:
                call.arguments.append(function.arguments)

    def end(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self.usage is not None:
            usage = self.usage
            if self.prices is not None:
                usage = Usage(
                    usage.input_tokens, usage.output_tokens, usage.cached_tokens, self.prices.cost(usage)
                )
            events.append(UsageEvent(usage))
        finish = self.finish or "stop"
        reason = _FINISH.get(finish)
        if reason == "stop" and self.had_calls:
            reason = "tool_call"  # some compatible servers report "stop" after tool calls
        if reason is None:
            events.append(Done("error", error=f"the response stopped with finish_reason={finish!r}"))
        else:
            events.append(Done(reason))
        return events


def _usage(usage: Any) -> Usage:
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return Usage(
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cached_tokens=int(cached or 0),
    )
