"""The Anthropic driver: Messages streaming on the official `anthropic` SDK.

Raw stream events are normalized one content block at a time: `text` blocks stream `TextDelta`s,
`thinking` blocks stream `ReasoningDelta`s and end as `Reasoning(text, signature)`, `redacted_thinking`
ends as `Reasoning(data, redacted=True)`, and `tool_use` blocks assemble their `input_json_delta` fragments
into a `ToolCall` (without Anthropic's id: stead assigns its own). Every block ends at its
`content_block_stop`. Usage from `message_start` and `message_delta` is reported before `Done`, which
follows `message_stop`; a stream that stops before `message_stop` raises a retryable ProviderError.

Thinking blocks are replayed verbatim with their signatures, so a history reloaded after a restart is
accepted and the prompt cache still matches. The SDK's own retries are off (`max_retries=0`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic

from stead.errors import ConfigurationError, ProviderError
from stead.messages import Block, Reasoning, Text, ToolCall, Usage
from stead.providers import _errors
from stead.providers._client import LoopBoundClient
from stead.providers._context import parse_arguments, to_anthropic_messages, to_anthropic_tools
from stead.providers._naming import wire_model
from stead.providers._options import anthropic_options, anthropic_output_tool, output_text
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

__all__ = ["ADAPTIVE_EFFORTS", "BUDGET_THINKING_MODELS", "THINKING_BUDGETS", "AnthropicProvider"]

THINKING_BUDGETS: dict[str, int] = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576}
"""Extended-thinking token budgets for `ProviderRequest.effort` on models with budgeted thinking."""

ADAPTIVE_EFFORTS: dict[str, str] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
}
"""`ProviderRequest.effort` to `output_config.effort` on models with adaptive thinking."""

BUDGET_THINKING_MODELS: tuple[str, ...] = (
    "claude-3",
    "claude-sonnet-4-0",
    "claude-sonnet-4-2025",
    "claude-opus-4-0",
    "claude-opus-4-2025",
    "claude-opus-4-1",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "claude-opus-4-5",
)
"""Model name prefixes that take `thinking: {type: enabled, budget_tokens}`; newer models get
`thinking: {type: adaptive}` with `output_config.effort`."""

_STOP: dict[str, DoneReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "tool_use": "tool_call",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}


class AnthropicProvider:
    """A `Provider` for the Anthropic Messages API.

    - `api_key`: defaults to `ANTHROPIC_API_KEY`.
    - `max_tokens`: the most output tokens of one response. The request's cap
      (`ProviderRequest.max_output_tokens`, MR1) is sent, never more than this when it is given; a request
      without a cap gets this (default 4096). With a thinking budget the cap covers thinking and answer
      (the budget is lowered to leave at least 1024 tokens of answer); without a cap the budget is added
      on top, as before.
    - `cache`: mark prompt-cache breakpoints on the system prompt (or last tool) and the newest block.
    - `model`, `prices`, `client`, `timeout`: as for `OpenAIProvider`.
    - `ProviderRequest.effort` turns on extended thinking: on current models adaptive thinking with
      `output_config.effort` (`low`, `medium`, `high`, `xhigh`, `max`; `minimal` counts as `low`), on
      older ones (`BUDGET_THINKING_MODELS`) a token budget (`THINKING_BUDGETS`; the budget is added to
      `max_tokens`); a number is always a budget; `none`/`off` leave thinking off.
    - `ProviderRequest.model_options` are mapped to Messages fields (`stead.providers._options`;
      `seed` and the penalties are refused); `ProviderRequest.output_schema` becomes a synthetic tool the
      model is made to call, whose input is the answer (a `Text` block of its JSON).
    - `ProviderRequest.options` are merged into the request body last (e.g. `{"metadata": {...}}`, or
      your own `"thinking"` setting).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        max_tokens: int | None = None,
        name: str = "anthropic",
        timeout: float | None = 600.0,
        model: str | None = None,
        prices: Prices | None = None,
        key_env: str | None = "ANTHROPIC_API_KEY",
        cache: bool = True,
    ) -> None:
        self.name = name
        self.model = model
        self.prices = prices
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.cache = cache
        self._key_env = key_env
        if client is None and api_key is None:
            api_key = os.environ.get(key_env or "ANTHROPIC_API_KEY")
            if not api_key:
                raise ConfigurationError(
                    f"{name}: no API key: set {key_env or 'ANTHROPIC_API_KEY'} or pass api_key="
                )
        self._api_key = api_key or ""
        self._timeout = timeout
        self._clients: LoopBoundClient[anthropic.AsyncAnthropic] = LoopBoundClient(
            lambda: anthropic.AsyncAnthropic(
                api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self._timeout
            ),
            client,
        )

    async def aclose(self) -> None:
        """Close the HTTP client this provider created (a given `client` is left open)."""
        await self._clients.aclose()

    def _error(self, exc: BaseException) -> ProviderError | None:
        return _errors.from_exception(
            self.name, exc, anthropic, key_env=self._key_env, base_url=self.base_url
        )

    def _body(self, request: ProviderRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """The SDK arguments, and the fields sent through `extra_body` (newer API fields and options)."""
        model = self.model or wire_model(request.model)
        capped = request.max_output_tokens is not None
        max_tokens = _cap(request.max_output_tokens, self.max_tokens)
        body: dict[str, Any] = {
            "model": model,
            "messages": to_anthropic_messages(request.messages, cache=self.cache),
            "stream": True,
        }
        extra: dict[str, Any] = {}
        if request.instructions:
            if self.cache:
                body["system"] = [
                    {"type": "text", "text": request.instructions, "cache_control": {"type": "ephemeral"}}
                ]
            else:
                body["system"] = request.instructions
        if request.tools:
            body["tools"] = to_anthropic_tools(request.tools, cache=self.cache and not request.instructions)
        forced: str | None = None
        if request.output_schema is not None:
            # structured output: a synthetic tool whose input is the answer (`_options`)
            spec, _ = anthropic_output_tool(request, [t.name for t in request.tools])
            body["tools"] = [*body.get("tools", []), spec]
            forced = spec["name"]
        try:
            options = anthropic_options(request, forced=forced)
        except ValueError as e:
            raise ProviderError(f"{self.name}: {e}", retryable=False) from None
        thinking = _thinking(request.effort, model)
        if isinstance(thinking, int):
            if capped:
                # the cap bounds thinking and answer together: the budget leaves room for an answer
                thinking = max(min(thinking, max_tokens - _MIN_ANSWER), _MIN_BUDGET)
                max_tokens = max(max_tokens, thinking + _MIN_ANSWER)
            else:
                max_tokens += thinking
            extra["thinking"] = {"type": "enabled", "budget_tokens": thinking}
        elif thinking is not None:
            extra["thinking"] = {"type": "adaptive"}
            extra["output_config"] = {"effort": thinking}
        body["max_tokens"] = max_tokens
        if thinking is not None and forced is not None:
            options["tool_choice"] = {"type": "auto"}  # extended thinking takes no forced tool choice
        extra.update(options)
        extra.update(request.options)
        return body, extra

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        client = self._clients.get()
        body, extra = self._body(request)
        response: Any = await _errors.open_stream(
            client.messages.create(**body, extra_body=extra or None), self._error
        )
        output: tuple[str, bool] | None = None
        if request.output_schema is not None:
            spec, wrapped = anthropic_output_tool(request, [t.name for t in request.tools])
            output = (spec["name"], wrapped)
        state = _StreamState(self.prices, output)
        async with contextlib.aclosing(_errors.read_stream(response, self._error)) as raw_events:
            async for raw in raw_events:
                for event in state.feed(raw):
                    yield event
        if not state.stopped:
            raise _errors.stream_ended(self.name)
        for event in state.end():
            yield event


_DEFAULT_MAX_TOKENS = 4096
_MIN_BUDGET = 1024
"""Anthropic's least thinking budget."""
_MIN_ANSWER = 1024
"""Tokens left for the answer when a capped request thinks with a budget."""


def _cap(requested: int | None, ceiling: int | None) -> int:
    """`max_tokens`: the request's cap, at most the provider's `max_tokens`; either alone; else 4096."""
    if requested is None:
        return ceiling if ceiling is not None else _DEFAULT_MAX_TOKENS
    return min(requested, ceiling) if ceiling is not None else requested


def _thinking(effort: str | None, model: str) -> int | str | None:
    """Extended thinking for an effort: a token budget (older models, or a number given), an adaptive
    effort level (current models), or None (off)."""
    if effort is None or effort in ("none", "off", ""):
        return None
    if effort.isdigit():
        return int(effort)
    if effort not in THINKING_BUDGETS and effort not in ADAPTIVE_EFFORTS:
        raise ConfigurationError(
            f"unknown effort {effort!r} for Anthropic: use one of "
            f"{', '.join(dict.fromkeys([*THINKING_BUDGETS, *ADAPTIVE_EFFORTS]))}, none, or a number of tokens"
        )
    if model.startswith(BUDGET_THINKING_MODELS):
        return THINKING_BUDGETS.get(effort, THINKING_BUDGETS["high"])
    return ADAPTIVE_EFFORTS[effort]


@dataclass
class _Block:
    kind: str
    parts: list[str] = field(default_factory=list)
    signature: str | None = None
    name: str = ""


class _StreamState:
    """Assembles one streamed message into normalized events."""

    def __init__(self, prices: Prices | None, output: tuple[str, bool] | None = None) -> None:
        self.prices = prices
        self.output = output
        """(name, wrapped) of the synthetic output tool, whose call is the answer (structured output)."""
        self.blocks: dict[int, _Block] = {}
        self.input_tokens = 0
        self.cache_read = 0
        self.cache_write = 0
        self.output_tokens = 0
        self.stop_reason: str | None = None
        self.stopped = False
        self.had_calls = False

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        for attr, field_name in (
            ("input_tokens", "input_tokens"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
            ("output_tokens", "output_tokens"),
        ):
            value = getattr(usage, attr, None)
            if value is not None:
                setattr(self, field_name, int(value))

    def feed(self, event: Any) -> list[StreamEvent]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._usage(getattr(event.message, "usage", None))
        elif kind == "content_block_start":
            return self._start(int(event.index), event.content_block)
        elif kind == "content_block_delta":
            return self._delta(int(event.index), event.delta)
        elif kind == "content_block_stop":
            block = self.blocks.pop(int(event.index), None)
            done = _finish(block) if block is not None else None
            if isinstance(done, ToolCall) and self.output is not None and done.name == self.output[0]:
                # the output tool's input is the answer: a text block of its JSON
                text = output_text(done.arguments, self.output[1])
                return [TextDelta(text), BlockEnd(Text(text))]
            if isinstance(done, ToolCall):
                self.had_calls = True
            return [BlockEnd(done)] if done is not None else []
        elif kind == "message_delta":
            reason = getattr(event.delta, "stop_reason", None)
            if reason is not None:
                self.stop_reason = str(reason)
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _start(self, index: int, content: Any) -> list[StreamEvent]:
        ctype = getattr(content, "type", None)
        if ctype == "text":
            block = self.blocks[index] = _Block("text")
            text = getattr(content, "text", "") or ""
            if text:
                block.parts.append(text)
                return [TextDelta(text)]
        elif ctype == "thinking":
            block = self.blocks[index] = _Block(
                "thinking", signature=getattr(content, "signature", None) or None
            )
            text = getattr(content, "thinking", "") or ""
            if text:
                block.parts.append(text)
                return [ReasoningDelta(text)]
        elif ctype == "redacted_thinking":
            self.blocks[index] = _Block("redacted", parts=[str(getattr(content, "data", ""))])
        elif ctype == "tool_use":
            self.blocks[index] = _Block("tool_use", name=str(getattr(content, "name", "")))
        else:
            self.blocks[index] = _Block("other")
        return []

    def _delta(self, index: int, delta: Any) -> list[StreamEvent]:
        block = self.blocks.get(index)
        if block is None:
            return []
        dtype = getattr(delta, "type", None)
        if dtype == "text_delta" and block.kind == "text":
            text = str(delta.text)
            block.parts.append(text)
            return [TextDelta(text)] if text else []
        if dtype == "thinking_delta" and block.kind == "thinking":
            text = str(delta.thinking)
            block.parts.append(text)
            return [ReasoningDelta(text)] if text else []
        if dtype == "signature_delta" and block.kind == "thinking":
            block.signature = (block.signature or "") + str(delta.signature)
        elif dtype == "input_json_delta" and block.kind == "tool_use":
            block.parts.append(str(delta.partial_json))
        return []

    def end(self) -> list[StreamEvent]:
        usage = Usage(
            input_tokens=self.input_tokens + self.cache_read + self.cache_write,
            output_tokens=self.output_tokens,
            cached_tokens=self.cache_read,
        )
        if self.prices is not None:
            usage = Usage(
                usage.input_tokens, usage.output_tokens, usage.cached_tokens, self.prices.cost(usage)
            )
        reason = _STOP.get(self.stop_reason or "end_turn")
        if reason == "stop" and self.had_calls:
            reason = "tool_call"
        elif reason == "tool_call" and not self.had_calls:
            reason = "stop"  # only the output tool was called: that is the answer
        done = (
            Done(reason)
            if reason is not None
            else Done("error", error=f"the response stopped with stop_reason={self.stop_reason!r}")
        )
        return [UsageEvent(usage), done]


def _finish(block: _Block) -> Block | None:
    if block.kind == "text":
        text = "".join(block.parts)
        return Text(text) if text else None
    if block.kind == "thinking":
        return Reasoning("".join(block.parts), block.signature)
    if block.kind == "redacted":
        return Reasoning("".join(block.parts), None, redacted=True)
    if block.kind == "tool_use":
        return ToolCall(block.name, parse_arguments("".join(block.parts)))
    return None
