"""Events an agent emits to observers (`agent.events()`, `Hooks.on_event`).

Provider stream events (`TextDelta`, `ReasoningDelta`, `UsageEvent`) pass through live; `BlockEnd` is
emitted only after the block is durable; the kernel adds lifecycle events below. Every event reaches every
observer even if one of them throws (S2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from stead.core.outcome import Outcome
from stead.messages import Message, ToolCall, ToolResult
from stead.providers.base import BlockEnd, Done, ReasoningDelta, TextDelta, UsageEvent

__all__ = [
    "Activated",
    "ApprovalDecided",
    "ApprovalRequested",
    "BlockReset",
    "Event",
    "MessageConsumed",
    "Settled",
    "ToolFinished",
    "ToolStarted",
]


@dataclass(frozen=True, slots=True)
class BlockReset:
    """The partially streamed block observers saw was dropped (the stream was cut or restarted)."""

    type: Literal["block_reset"] = "block_reset"


@dataclass(frozen=True, slots=True)
class MessageConsumed:
    message: Message
    type: Literal["message_consumed"] = "message_consumed"


@dataclass(frozen=True, slots=True)
class ToolStarted:
    call: ToolCall
    type: Literal["tool_started"] = "tool_started"


@dataclass(frozen=True, slots=True)
class ToolFinished:
    result: ToolResult
    type: Literal["tool_finished"] = "tool_finished"


@dataclass(frozen=True, slots=True)
class Activated:
    run_id: str
    restored: bool
    type: Literal["activated"] = "activated"


@dataclass(frozen=True, slots=True)
class Settled:
    """The run ended (X2). `outcome` says how; `error` is the failure (or "aborted") when it did not
    complete."""

    run_id: str
    error: str | None = None
    outcome: Outcome = Outcome.COMPLETED
    type: Literal["settled"] = "settled"


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """A call of the dispatched batch is held for a decision (after the batch committed). `approval_id` is
    the deciding layer's id for it (`system.approve(approval_id)`); `reason` says why it asks."""

    call: ToolCall
    approval_id: str | None
    reason: str
    run_id: str
    type: Literal["approval_requested"] = "approval_requested"


@dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """A held call was decided (after the decision committed): `decision` is `approved`, `rejected`,
    `expired` or `cancelled`."""

    call_id: str
    approval_id: str | None
    decision: str
    note: str | None
    run_id: str
    type: Literal["approval_decided"] = "approval_decided"


Event: TypeAlias = (
    TextDelta
    | ReasoningDelta
    | BlockEnd
    | UsageEvent
    | Done
    | BlockReset
    | MessageConsumed
    | ToolStarted
    | ToolFinished
    | Activated
    | Settled
    | ApprovalRequested
    | ApprovalDecided
)
