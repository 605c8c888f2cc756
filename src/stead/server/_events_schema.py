"""The event payloads of the streams, as models: the `data:` of each SSE frame, keyed by its `event:`.

They document the stream in OpenAPI (`AgentEvent`, a union discriminated by `type`) and let tests check
every frame a stream sends against its schema."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from stead.server._models import BlockOut, MessageOut, UsageOut

__all__ = ["EVENT_ADAPTER", "EVENT_MODELS", "event_schema"]


class _Durable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(description="Per agent: 1, 2, 3, … (also the SSE `id`).")
    agent_id: str
    run_id: str | None
    at: float = Field(description="When the change was written (seconds since the epoch).")


class Activated(_Durable):
    """Work became owed (a run started), or a restarted process resumed it (`restored`)."""

    type: Literal["activated"]
    restored: bool
    message_id: str | None = None


class _Consumed(MessageOut):
    index: int | None = None  # type: ignore[assignment]


class MessageConsumed(_Durable):
    """A queued message entered the conversation."""

    type: Literal["message_consumed"]
    message: _Consumed


class BlockEnd(_Durable):
    """A completed assistant block (text, reasoning or a tool call), as stored."""

    type: Literal["block_end"]
    inference_id: str | None
    block: BlockOut


class _Call(BaseModel):
    id: str | None
    name: str
    arguments: dict[str, Any] | str | None = None


class ToolStarted(_Durable):
    """A tool call was made durable (dispatched), before it runs."""

    type: Literal["tool_started"]
    call: _Call


class _Result(BaseModel):
    call_id: str
    output: str
    is_error: bool


class ToolFinished(_Durable):
    type: Literal["tool_finished"]
    call: _Call
    result: _Result


class Usage(_Durable):
    """One inference ended (any reason), with its usage when the model reported it."""

    type: Literal["usage"]
    inference_id: str
    provider: str
    model: str
    reason: str
    error: str | None
    usage: UsageOut | None
    latency_ms: float
    ttft_ms: float | None


class ApprovalRequested(_Durable):
    """A call of the dispatched batch is held for a human decision (written in the dispatch transaction):
    decide it with `POST /v1/approvals/{approval_id}/decision`. The call has not started."""

    type: Literal["approval_requested"]
    approval_id: str | None = Field(description="The approval's id (null only for a non-policy gate).")
    call: _Call
    reason: str = Field(description="Why the policy asked.")


class ApprovalDecided(_Durable):
    """A held call was decided (written in the deciding transaction): `approved` (it runs next), or
    `rejected`, `expired`, `cancelled` (its error result follows in `tool_finished`)."""

    type: Literal["approval_decided"]
    approval_id: str | None
    call: _Call
    decision: Literal["approved", "rejected", "expired", "cancelled"]
    note: str | None


class Settled(_Durable):
    """The run ended: nothing is owed any more."""

    type: Literal["settled"]
    status: Literal["completed", "failed", "cancelled"]
    error: str | None


class _LiveEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str


class TextDelta(_LiveEvent):
    """Live only, with `?deltas=true`; id `SEQ.K`."""

    type: Literal["text_delta"]
    text: str


class ReasoningDelta(_LiveEvent):
    type: Literal["reasoning_delta"]
    text: str


class BlockReset(_LiveEvent):
    """The partly streamed block was dropped; it arrives whole in its `block_end` (or not at all)."""

    type: Literal["block_reset"]


class Reset(BaseModel):
    """The cursor is older than what is retained (or past the last event): reload with REST, then follow
    the live events that come next."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["reset"]
    agent_id: str
    after: int
    head: int
    oldest: int


class Done(BaseModel):
    """A run stream ends: the run settled."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["done"]
    run_id: str


EVENT_MODELS: dict[str, type[BaseModel]] = {
    "activated": Activated,
    "message_consumed": MessageConsumed,
    "block_end": BlockEnd,
    "tool_started": ToolStarted,
    "tool_finished": ToolFinished,
    "usage": Usage,
    "approval_requested": ApprovalRequested,
    "approval_decided": ApprovalDecided,
    "settled": Settled,
    "text_delta": TextDelta,
    "reasoning_delta": ReasoningDelta,
    "block_reset": BlockReset,
    "reset": Reset,
    "done": Done,
}

AgentEvent = Annotated[
    Activated
    | MessageConsumed
    | BlockEnd
    | ToolStarted
    | ToolFinished
    | Usage
    | ApprovalRequested
    | ApprovalDecided
    | Settled
    | TextDelta
    | ReasoningDelta
    | BlockReset
    | Reset
    | Done,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(AgentEvent)


def event_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the `AgentEvent` schema, the component schemas it refers to), for OpenAPI components."""
    schema = EVENT_ADAPTER.json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return schema, defs
