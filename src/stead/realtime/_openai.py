"""The OpenAI Realtime driver (GA protocol) over a WebSocket (`pip install 'stead[realtime]'`).

Client events sent — exactly these, each with a client `event_id`, shaped as the GA API documents them
(openai-python's `types/realtime`):

| action | event |
|---|---|
| `connect` | `session.update` (`type: realtime`, model, instructions, output modalities, audio formats |
| | (PCM16 24 kHz in and out), transcription, turn detection, voice, function tools, `tool_choice: auto`) |
| `send_text` | `conversation.item.create` with a `message` item (`user` or `system`, one `input_text` part) |
| `send_audio` | `input_audio_buffer.append` (base64 PCM16) |
| `send_tool_output` | `conversation.item.create` with a `function_call_output` item |
| `create_response` | `response.create` (with `response.instructions` when given) |
| `cancel_response` | `response.cancel` |
| `truncate` | `conversation.item.truncate` (`content_index: 0`, `audio_end_ms`) |

Server events read: `response.created`, `response.done` (status, `status_details.reason`, usage with
modality detail), `response.output_text.delta`/`.done`, `response.output_audio_transcript.delta`/`.done`,
`response.output_audio.delta`, `response.function_call_arguments.done`,
`conversation.item.input_audio_transcription.delta`/`.completed`, `input_audio_buffer.speech_started`/
`.speech_stopped` and `error`; others are ignored. `error` events are non-fatal (a collision, a cancel with
nothing active); a closed connection is a fatal `ModelError`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from stead.extend import ConfigurationError, Prices, new_id
from stead.realtime._protocol import (
    AudioDelta,
    ModelError,
    ModelEvent,
    RealtimeUsage,
    ResponseDone,
    ResponseHint,
    ResponseStarted,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequest,
    Transcript,
)

__all__ = ["DEFAULT_URL", "OpenAIRealtimeDriver", "session_update"]

log = logging.getLogger("stead.realtime")

DEFAULT_URL = "wss://api.openai.com/v1"
PCM = {"type": "audio/pcm", "rate": 24000}


def session_update(model: str, config: SessionConfig) -> dict[str, Any]:
    """The `session` object of the `session.update` that opens a session."""
    audio_in: dict[str, Any] = {"format": dict(PCM)}
    if config.transcription:
        audio_in["transcription"] = {"model": config.transcription}
    if config.turn_detection is not None:
        audio_in["turn_detection"] = dict(config.turn_detection)
    audio_out: dict[str, Any] = {"format": dict(PCM)}
    if config.voice:
        audio_out["voice"] = config.voice
    session: dict[str, Any] = {
        "type": "realtime",
        "model": model,
        "instructions": config.instructions,
        "output_modalities": [config.output],
        "audio": {"input": audio_in, "output": audio_out},
        "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
            for t in config.tools
        ],
        "tool_choice": "auto",
    }
    session.update(config.extra)
    return session


def _usage(raw: Any) -> RealtimeUsage | None:
    if not isinstance(raw, dict):
        return None
    inp = raw.get("input_token_details") or {}
    out = raw.get("output_token_details") or {}
    return RealtimeUsage(
        input_tokens=int(raw.get("input_tokens") or 0),
        output_tokens=int(raw.get("output_tokens") or 0),
        cached_tokens=int(inp.get("cached_tokens") or 0),
        input_text_tokens=int(inp.get("text_tokens") or 0),
        input_audio_tokens=int(inp.get("audio_tokens") or 0),
        output_text_tokens=int(out.get("text_tokens") or 0),
        output_audio_tokens=int(out.get("audio_tokens") or 0),
        responses=1,
    )


class OpenAIRealtimeDriver:
    """One WebSocket connection to an OpenAI Realtime model (or anything speaking its GA protocol at
    `base_url`, e.g. a test server: `ws://127.0.0.1:PORT/v1`)."""

    def __init__(
        self,
        model: str = "gpt-realtime",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        vendor: str = "openai",
        prices: Prices | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self._api_key = api_key
        self._base = (base_url or DEFAULT_URL).rstrip("/")
        self._vendor = vendor
        self._prices = prices
        self._headers = dict(headers or {})
        self._ws: Any = None
        self._queue: asyncio.Queue[ModelEvent | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self.sent: list[dict[str, Any]] = []
        """Every client event sent, in order."""

    @property
    def name(self) -> str:
        return f"{self._vendor}:{self.model}"

    @property
    def vendor(self) -> str:
        return self._vendor

    def cost(self, usage: RealtimeUsage) -> float | None:
        return None if self._prices is None else self._prices.cost(usage.to_usage())

    @property
    def url(self) -> str:
        base = self._base
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return f"{base}/realtime?model={self.model}"

    async def connect(self, config: SessionConfig) -> None:
        try:
            from websockets.asyncio.client import connect
        except ImportError as e:  # pragma: no cover - the extra is installed in dev
            raise ConfigurationError(
                f"the OpenAI Realtime driver needs websockets: pip install 'stead[realtime]' ({e})"
            ) from None
        headers = dict(self._headers)
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._ws = await connect(self.url, additional_headers=headers, max_size=None)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await self._send({"type": "session.update", "session": session_update(self.model, config)})

    async def _send(self, event: dict[str, Any]) -> str:
        if self._ws is None:
            raise ConnectionError("the realtime connection is not open")
        event_id = f"evt_{new_id()}"
        event = {"event_id": event_id, **event}
        self.sent.append(event)
        await self._ws.send(json.dumps(event))
        return event_id

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        await self._send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]},
            }
        )

    async def send_audio(self, pcm16: bytes) -> None:
        await self._send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()})

    async def send_tool_output(self, call_id: str, output: str) -> None:
        await self._send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": output},
            }
        )

    async def create_response(
        self, instructions: str | None = None, *, hint: ResponseHint | None = None
    ) -> str:
        event: dict[str, Any] = {"type": "response.create"}
        if instructions:
            event["response"] = {"instructions": instructions}
        return await self._send(event)

    async def cancel_response(self) -> None:
        await self._send({"type": "response.cancel"})

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        await self._send(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": max(0, int(audio_end_ms)),
            }
        )

    def events(self) -> AsyncIterator[ModelEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ModelEvent]:
        while True:
            ev = await self._queue.get()
            if ev is None:
                return
            yield ev

    async def close(self) -> None:
        self._closing = True
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        await self._queue.put(None)

    # ------------------------------------------------------------------ server events
    async def _read(self) -> None:
        ws = self._ws
        try:
            async for raw in ws:
                try:
                    event = json.loads(raw)
                except ValueError:
                    log.warning("realtime: a server message that is not JSON was ignored")
                    continue
                mapped = self._map(event)
                if mapped is not None:
                    await self._queue.put(mapped)
        except Exception as e:
            if not self._closing:
                await self._queue.put(ModelError(f"the realtime connection failed: {e}", "connection", True))
        else:
            if not self._closing:
                await self._queue.put(ModelError("the realtime connection closed", "connection_closed", True))
        finally:
            if not self._closing:
                await self._queue.put(None)

    @staticmethod
    def _map(e: dict[str, Any]) -> ModelEvent | None:
        t = e.get("type")
        if t == "response.created":
            return ResponseStarted(str((e.get("response") or {}).get("id", "")))
        if t == "response.done":
            r = e.get("response") or {}
            details = r.get("status_details") or {}
            return ResponseDone(
                str(r.get("id", "")),
                str(r.get("status", "completed")),
                details.get("reason"),
                _usage(r.get("usage")),
            )
        if t in ("response.output_text.delta", "response.output_audio_transcript.delta"):
            return Transcript("assistant", str(e.get("item_id", "")), str(e.get("delta", "")), False)
        if t == "response.output_text.done":
            return Transcript("assistant", str(e.get("item_id", "")), str(e.get("text", "")), True)
        if t == "response.output_audio_transcript.done":
            return Transcript("assistant", str(e.get("item_id", "")), str(e.get("transcript", "")), True)
        if t == "response.output_audio.delta":
            return AudioDelta(
                str(e.get("item_id", "")), base64.b64decode(e.get("delta") or ""), e.get("response_id")
            )
        if t == "response.function_call_arguments.done":
            return ToolCallRequest(
                str(e.get("call_id", "")),
                str(e.get("name", "")),
                str(e.get("arguments", "")),
                e.get("response_id"),
            )
        if t == "conversation.item.input_audio_transcription.delta":
            return Transcript("user", str(e.get("item_id", "")), str(e.get("delta", "")), False)
        if t == "conversation.item.input_audio_transcription.completed":
            return Transcript("user", str(e.get("item_id", "")), str(e.get("transcript", "")), True)
        if t == "input_audio_buffer.speech_started":
            return SpeechStarted(e.get("item_id"), e.get("audio_start_ms"))
        if t == "input_audio_buffer.speech_stopped":
            return SpeechStopped(e.get("item_id"), e.get("audio_end_ms"))
        if t == "error":
            err = e.get("error") or {}
            return ModelError(str(err.get("message", "error")), err.get("code"), False, err.get("event_id"))
        return None
