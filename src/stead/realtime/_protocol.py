"""The `RealtimeModel` protocol: what the session runner needs from a duplex (voice or text) model session.

A realtime model is not a `stead.Provider`: instead of one request and one streamed answer it keeps a
conversation open in which both sides speak at any time. A driver turns the model's wire protocol into the
few events below and exposes the few client actions the runner takes. Two drivers ship: the OpenAI Realtime
driver over WebSocket (`OpenAIRealtimeDriver`) and a scripted in-process text model (`TextDuplexDriver`).

Every driver keeps the rule the OpenAI Realtime API enforces: **one active response per conversation**. A
`create_response` while a response is active is answered with a non-fatal `ModelError` whose code is
`conversation_already_has_active_response` and whose `event_id` is the id `create_response` returned; no
`ResponseDone` follows it. The runner's response sequencer retries after the next `ResponseDone`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from stead.extend import ToolSpec, Usage

__all__ = [
    "CANCEL_NOT_ACTIVE",
    "COLLISION",
    "AudioDelta",
    "ModelError",
    "ModelEvent",
    "RealtimeModel",
    "RealtimeUsage",
    "ResponseDone",
    "ResponseHint",
    "ResponseStarted",
    "SessionConfig",
    "SpeechStarted",
    "SpeechStopped",
    "ToolCallRequest",
    "Transcript",
]

COLLISION = "conversation_already_has_active_response"
"""The error code of a `response.create` sent while a response is active (non-fatal)."""
CANCEL_NOT_ACTIVE = "response_cancel_not_active"
"""The error code of a `response.cancel` sent when no response is active (non-fatal)."""


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What a session is opened with (and reopened with, after a dropped connection)."""

    instructions: str
    tools: list[ToolSpec]
    output: Literal["text", "audio"] = "text"
    voice: str | None = None
    transcription: str | None = None
    turn_detection: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Further session fields, passed to the model as they are."""


@dataclass(frozen=True, slots=True)
class ResponseHint:
    """Why the runner asks for a response: `reply` (to the user or after a tool output), `result` (a
    delegation's result to tell), `update` (a progress digest), `note` (after a reconnect). Real models
    ignore it (the instructions and conversation items carry the meaning); a scripted model plays the part of
    its script for it, with `values` filling its placeholders."""

    kind: Literal["reply", "result", "update", "note"] = "reply"
    values: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RealtimeUsage:
    """Token usage of realtime responses, with modality detail (summed over responses)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0
    responses: int = 0

    def add(self, other: RealtimeUsage) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_usage(self, cost: float | None = None) -> Usage:
        return Usage(self.input_tokens, self.output_tokens, self.cached_tokens, cost)

    def to_json(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    response_id: str


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """A response ended. `status`: completed, cancelled, failed or incomplete; `reason` e.g. `turn_detected`
    or `client_cancelled` for a cancelled one. Usage arrives only here (cancelled responses too)."""

    response_id: str
    status: str
    reason: str | None = None
    usage: RealtimeUsage | None = None


@dataclass(frozen=True, slots=True)
class Transcript:
    """Text of one turn. Interim (`final=False`): `text` is the next piece; final: `text` is the whole
    turn."""

    role: Literal["user", "assistant"]
    item_id: str
    text: str
    final: bool
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """The model calls a tool; `arguments` is the JSON text it produced."""

    call_id: str
    name: str
    arguments: str
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class AudioDelta:
    """A chunk of the model's spoken answer: PCM16 mono 24 kHz."""

    item_id: str
    audio: bytes
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The server heard the user start speaking (barge-in when the model is answering)."""

    item_id: str | None = None
    audio_start_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    item_id: str | None = None
    audio_end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ModelError:
    """An error from the model. A fatal one (the connection is gone) ends the event stream; the runner
    reconnects once."""

    message: str
    code: str | None = None
    fatal: bool = False
    event_id: str | None = None


ModelEvent: TypeAlias = (
    ResponseStarted
    | ResponseDone
    | Transcript
    | ToolCallRequest
    | AudioDelta
    | SpeechStarted
    | SpeechStopped
    | ModelError
)


@runtime_checkable
class RealtimeModel(Protocol):
    """One connection to a realtime model. Build a new one to reconnect."""

    @property
    def name(self) -> str:
        """The model as a model string (`openai:gpt-realtime`, `text-duplex:voice.yaml`)."""
        ...

    @property
    def vendor(self) -> str:
        """Who serves it (for run records: `openai`, `text-duplex`)."""
        ...

    async def connect(self, config: SessionConfig) -> None:
        """Open the connection and configure the session (instructions, tools, audio)."""
        ...

    def events(self) -> AsyncIterator[ModelEvent]:
        """The model's events until the connection ends (a lost connection ends with a fatal ModelError)."""
        ...

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        """Add a message to the conversation (`system`: a note from stead, not from the user)."""
        ...

    async def send_audio(self, pcm16: bytes) -> None:
        """Append PCM16 mono 24 kHz audio to the input buffer."""
        ...

    async def send_tool_output(self, call_id: str, output: str) -> None:
        """Answer a tool call (a `function_call_output` item)."""
        ...

    async def create_response(
        self, instructions: str | None = None, *, hint: ResponseHint | None = None
    ) -> str:
        """Ask for a response; return the client event id a collision error will name."""
        ...

    async def cancel_response(self) -> None: ...

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Cut the model's audio item at what the user actually heard."""
        ...

    async def close(self) -> None: ...

    def cost(self, usage: RealtimeUsage) -> float | None:
        """USD for `usage` at the model's prices, when known."""
        ...
