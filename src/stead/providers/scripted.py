"""A deterministic provider for tests, demos and benchmarks.

`ScriptedProvider(respond)` calls `respond(request)` (sync or async) for every inference. Because the answer
is a function of the request, a restarted process continues a conversation exactly where it stopped. `respond`
returns a list of blocks, or a `ScriptedResponse` to also simulate deltas, usage, delays, errors and streams
that end early.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from stead._tokens import estimate_messages, estimate_text, estimate_tools
from stead.errors import ProviderError
from stead.messages import Block, Reasoning, Text, ToolCall, Usage
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

__all__ = ["ScriptedProvider", "ScriptedResponse"]


@dataclass
class ScriptedResponse:
    """One scripted response.

    - `blocks` are streamed in order; text and reasoning as deltas of `chunk` characters, then `BlockEnd`.
    - `usage` is reported before `Done` (default: input tokens estimated from the request — instructions,
      tools and messages, as `stead._tokens` estimates them — and output tokens from the blocks' text
      lengths).
    - `delay` seconds pass before the first event (`delay_between` between events).
    - `error` raises a `ProviderError` after `end_after` events (or immediately), `retryable` as given.
    - `end_after=N` stops the stream after N events without a terminal `Done` (a cut stream).
    - `done` overrides the terminal reason; `half_block` streams a partial text delta that never completes.
    - `report_usage=False` reports no usage at all (like a llama.cpp server streaming without it).
    """

    blocks: list[Block] = field(default_factory=list)
    usage: Usage | None = None
    delay: float = 0.0
    delay_between: float = 0.0
    error: str | None = None
    retryable: bool = False
    end_after: int | None = None
    done: DoneReason | None = None
    chunk: int = 0
    half_block: str | None = None
    report_usage: bool = True


Responder = Callable[
    [ProviderRequest], "list[Block] | ScriptedResponse | Awaitable[list[Block] | ScriptedResponse]"
]


class ScriptedProvider:
    """Replays scripted responses; records every request it received in `requests`.

    `ScriptedProvider.observers` (process-wide, a test seam) are called with every request any scripted
    provider of the process receives, before it answers: the chaos harness logs them there to check them
    (docs/chaos.md), also in `stead worker` processes whose models are scripted files."""

    observers: ClassVar[list[Callable[[ProviderRequest], None]]] = []

    def __init__(self, respond: Responder, *, name: str = "scripted") -> None:
        self._respond = respond
        self.name = name
        self.requests: list[ProviderRequest] = []

    async def _response(self, request: ProviderRequest) -> ScriptedResponse:
        out = self._respond(request)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, ScriptedResponse):
            return out
        return ScriptedResponse(blocks=list(out))

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        for observe in ScriptedProvider.observers:
            observe(request)
        response = await self._response(request)
        if response.delay:
            await asyncio.sleep(response.delay)
        events = _events(response, request)
        limit = response.end_after if response.end_after is not None else len(events)
        if response.error is not None and response.end_after is None:
            limit = 0
        for n, event in enumerate(events):
            if n >= limit:
                break
            if n and response.delay_between:
                await asyncio.sleep(response.delay_between)
            yield event
        if response.error is not None:
            raise ProviderError(response.error, retryable=response.retryable)


def request_tokens(request: ProviderRequest) -> int:
    """The request's input tokens as stead estimates them (`stead._tokens`): instructions, tool specs
    and messages — what a scripted response reports by default, so a growing conversation reports growing
    usage (and automatic compaction triggers in tests as it would against a server)."""
    return (
        estimate_text(request.instructions)
        + estimate_tools(request.tools)
        + estimate_messages(request.messages)
    )


def _events(response: ScriptedResponse, request: ProviderRequest) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    out_chars = 0
    for block in response.blocks:
        if isinstance(block, Text | Reasoning):
            delta_type = TextDelta if isinstance(block, Text) else ReasoningDelta
            text = block.text
            out_chars += len(text)
            size = response.chunk or max(len(text), 1)
            for i in range(0, len(text), size):
                events.append(delta_type(text[i : i + size]))
        elif isinstance(block, ToolCall):
            out_chars += len(block.name) + len(str(block.arguments))
        events.append(BlockEnd(block))
    if response.half_block is not None:
        events.append(TextDelta(response.half_block))
    if response.report_usage:
        usage = response.usage or Usage(
            input_tokens=request_tokens(request), output_tokens=max(1, out_chars // 4)
        )
        events.append(UsageEvent(usage))
    reason: DoneReason = response.done or (
        "tool_call" if any(isinstance(b, ToolCall) for b in response.blocks) else "stop"
    )
    events.append(Done(reason))
    return events
