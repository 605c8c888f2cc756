"""The provider protocol: a request in, an async stream of normalized events out (docs/providers.md).

A provider never touches the store. The kernel persists completed blocks (`BlockEnd`) and treats everything
else as live-only. A stream must end with exactly one `Done`; a stream that stops without it is treated as
cut off (S3). Errors are raised as `stead.ProviderError` (with `retryable`) or reported as `Done("error")`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from stead.messages import Block, Message, Usage

__all__ = [
    "TOOL_CHOICES",
    "BlockEnd",
    "Done",
    "DoneReason",
    "ModelOptions",
    "Provider",
    "ProviderRequest",
    "Purpose",
    "ReasoningDelta",
    "StreamEvent",
    "TextDelta",
    "ToolSpec",
    "UsageEvent",
]

DoneReason: TypeAlias = Literal["stop", "tool_call", "length", "cancelled", "error"]
Purpose: TypeAlias = Literal["turn", "compaction"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any]


TOOL_CHOICES = ("auto", "required", "none")
"""The `tool_choice` keywords; any other value names one tool the model must call."""


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """Vendor-neutral request options (a definition's `model_options:`); each driver maps them to its wire
    names and refuses the ones its vendor lacks (`stead.providers.options`). None: the vendor's default.

    `tool_choice`: `auto`, `required` (some tool must be called), `none`, or the name of one tool.
    `max_tokens`: the answer's token limit."""

    tool_choice: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def items(self) -> dict[str, Any]:
        """The options that are set (name → value)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def decode(raw: dict[str, Any] | None) -> ModelOptions:
        """From the stored mapping (`AgentConfig.model_options`, already checked)."""
        if not raw:
            return NO_OPTIONS
        data = dict(raw)
        if isinstance(data.get("stop"), list):
            data["stop"] = tuple(data["stop"])
        return ModelOptions(**data)


NO_OPTIONS = ModelOptions()


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """Everything one inference needs. `messages` is the provider context (history + consumed input).

    `purpose` says what the request is for: `"turn"` (the agent's own inference) or `"compaction"` (a
    summary of evicted history written for context compaction, K1: no tools, its text becomes the summary
    record). Providers, scripted models and run records can tell them apart.

    `max_output_tokens` is the output cap the kernel computed for this request (MR1, docs/context.md): the
    agent's cap or the model's output limit for a turn, the summary budget for a compaction, never more
    than the window minus the request. Drivers send it as their vendor expects (OpenAI
    `max_completion_tokens`, OpenAI-compatible servers `max_tokens`, Anthropic `max_tokens`); None (a
    request built by hand) leaves the vendor's or the driver's default."""

    model: str
    instructions: str
    messages: list[Message]
    tools: list[ToolSpec]
    agent_id: str = ""
    inference_id: str = ""
    effort: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    purpose: Purpose = "turn"
    max_output_tokens: int | None = None
    model_options: ModelOptions = NO_OPTIONS
    """Sampling and tool-choice options, mapped per vendor (`options` is the raw body, merged last)."""
    output_schema: dict[str, Any] | None = None
    """A JSON schema the answer must satisfy, sent as the vendor's native structured output (OpenAI
    `response_format` `json_schema`, Anthropic a forced tool whose input is the answer). The answer comes
    back as one `Text` block holding the JSON."""
    output_name: str = "result"
    """The schema's name on the wire (letters, digits, `_`, `-`; at most 64)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str
    type: Literal["reasoning_delta"] = "reasoning_delta"


@dataclass(frozen=True, slots=True)
class BlockEnd:
    """A block is complete. Only completed blocks are ever persisted."""

    block: Block
    type: Literal["block_end"] = "block_end"


@dataclass(frozen=True, slots=True)
class UsageEvent:
    usage: Usage
    type: Literal["usage"] = "usage"


@dataclass(frozen=True, slots=True)
class Done:
    """The response ended. `error` explains `reason == "error"`.

    Providers set `reason` (and `error`); the kernel re-emits one `Done` per response to observers with
    `inference_id` and the response's `usage` (tokens and cost) filled in.

    `model_call=False` says the provider answered without calling a model (a deterministic flow engine
    choosing its next step): run records then record no prompt step for it and guardrails count no model
    request."""

    reason: DoneReason
    error: str | None = None
    usage: Usage | None = None
    inference_id: str | None = None
    model_call: bool = True
    type: Literal["done"] = "done"


StreamEvent: TypeAlias = TextDelta | ReasoningDelta | BlockEnd | UsageEvent | Done


@runtime_checkable
class Provider(Protocol):
    """Turns a request into a stream of normalized events."""

    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]: ...
