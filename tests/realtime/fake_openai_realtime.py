"""A loopback fake of the OpenAI Realtime API (GA protocol) over a real WebSocket.

It speaks the server events of reference §5.1 and checks both directions against openai-python's
`types/realtime` models: every client event must validate as a `RealtimeClientEvent` with no undocumented
field anywhere (`problems` collects what did not), and every server event it sends validates as a
`RealtimeServerEvent` (a fake that drifted from the protocol fails its own tests).

Behaviour, as the real server has it:
- one active response per conversation: a `response.create` while one is active gets the
  `conversation_already_has_active_response` error naming the client's `event_id`, and no `response.done`;
- `response.cancel` ends the active response `cancelled` (`client_cancelled`), or errors
  `response_cancel_not_active`;
- server VAD over appended PCM16 24 kHz audio (an energy threshold): `speech_started` (which, with
  `interrupt_response`, cancels the active response with reason `turn_detected`), `speech_stopped`,
  `committed`, the input transcription (`transcripts[i]` for the i-th utterance) and, with
  `create_response`, a response of its own;
- `auto_respond_to_tool_output`: the server starts a response by itself once a `function_call_output`
  arrives, racing the client's `response.create` (the collision is then the client's to survive);
- usage in every `response.done`, cancelled ones included; `drop_after_responses` closes the connection.

Replies come from `reply(conversation)`: a function of the conversation items so far returning a `Reply`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from openai.types.realtime.realtime_client_event import RealtimeClientEvent
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from websockets.asyncio.server import Server, ServerConnection, serve

__all__ = ["FakeRealtimeServer", "Reply", "undocumented"]

CLIENT = pydantic.TypeAdapter(RealtimeClientEvent)
SERVER = pydantic.TypeAdapter(RealtimeServerEvent)


def undocumented(model: Any, path: str = "$") -> list[str]:
    """Fields of a validated SDK model that the SDK does not declare (recursively)."""
    out: list[str] = []
    if isinstance(model, pydantic.BaseModel):
        out += [f"{path}.{k}" for k in (model.model_extra or {})]
        for name in type(model).model_fields:
            out += undocumented(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for i, v in enumerate(model):
            out += undocumented(v, f"{path}[{i}]")
    elif isinstance(model, dict):
        for k, v in model.items():
            out += undocumented(v, f"{path}.{k}")
    return out


@dataclass
class Reply:
    """What the fake model answers: text (or its audio transcript, with audio output), function calls, and
    `hold=True` to keep speaking until cancelled or barged in."""

    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    hold: bool = False


def rms(pcm: bytes) -> float:
    n = len(pcm) // 2
    if n == 0:
        return 0.0
    samples = struct.unpack(f"<{n}h", pcm[: n * 2])
    return math.sqrt(sum(s * s for s in samples) / n)


@dataclass
class _Conn:
    ws: ServerConnection
    session: dict[str, Any] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)
    active: tuple[str, asyncio.Task[None]] | None = None
    cancel_reason: str = "client_cancelled"
    speaking: bool = False
    audio_ms: float = 0.0
    speech_start_ms: float = 0.0
    silence_ms: float = 0.0
    utterances: int = 0
    responses: int = 0


class FakeRealtimeServer:
    def __init__(
        self,
        reply: Callable[[list[dict[str, Any]]], Reply] | None = None,
        *,
        key: str = "sk-test",
        transcripts: list[str] | None = None,
        auto_respond_to_tool_output: bool = False,
        drop_after_responses: int | None = None,
        threshold: float = 500.0,
        silence_ms: float = 500.0,
    ) -> None:
        self.reply = reply or (lambda items: Reply(text="ok"))
        self.key = key
        self.transcripts = list(transcripts or [])
        self.auto_respond_to_tool_output = auto_respond_to_tool_output
        self.drop_after_responses = drop_after_responses
        self.threshold = threshold
        self.silence_needed = silence_ms
        self.received: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.connections = 0
        self.collisions = 0
        self.max_active = 0
        self.speech: list[tuple[float, float]] = []
        """(start ms, end ms) of each utterance the VAD detected."""
        self.audio_chunks: list[int] = []
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self.port = 0
        self.released = asyncio.Event()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        self._server = await serve(self._handle, "127.0.0.1", 0, process_request=self._check_auth)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _check_auth(self, conn: ServerConnection, request: Any) -> Any:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return conn.respond(401, "missing or wrong bearer key\n")
        if not request.path.startswith("/v1/realtime?model="):
            return conn.respond(404, f"unknown path {request.path}\n")
        return None

    def types(self) -> list[str]:
        return [e.get("type", "?") for e in self.received]

    # ------------------------------------------------------------------ the connection
    def _id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"

    async def _send(self, c: _Conn, event: dict[str, Any]) -> None:
        event = {"event_id": self._id("event"), **event}
        try:
            SERVER.validate_python(event)
        except pydantic.ValidationError as e:  # the fake itself drifted from the protocol
            self.problems.append(f"server event {event['type']}: {e}")
        with contextlib.suppress(Exception):
            await c.ws.send(json.dumps(event))

    async def _handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        c = _Conn(ws)
        await self._send(
            c,
            {
                "type": "session.created",
                "session": {"type": "realtime", "id": self._id("sess"), "object": "realtime.session"},
            },
        )
        try:
            async for raw in ws:
                event = json.loads(raw)
                self.received.append(event)
                try:
                    model = CLIENT.validate_python(event)
                    self.problems += [f"{event.get('type')}: undocumented {p}" for p in undocumented(model)]
                except pydantic.ValidationError as e:
                    self.problems.append(f"invalid client event {event.get('type')}: {e}")
                    continue
                await self._on(c, event)
        except Exception:
            pass
        finally:
            if c.active is not None:
                c.active[1].cancel()

    async def _on(self, c: _Conn, e: dict[str, Any]) -> None:
        t = e["type"]
        if t == "session.update":
            c.session.update(e["session"])
            await self._send(c, {"type": "session.updated", "session": {"type": "realtime", **e["session"]}})
        elif t == "conversation.item.create":
            item = {"id": self._id("item"), **e["item"]}
            c.items.append(item)
            await self._send(c, {"type": "conversation.item.added", "item": _item(item)})
            if (
                item["type"] == "function_call_output"
                and self.auto_respond_to_tool_output
                and c.active is None
            ):
                await self._start_response(c)
        elif t == "response.create":
            if c.active is not None:
                self.collisions += 1
                await self._send(
                    c,
                    {
                        "type": "error",
                        "error": {
                            "type": "invalid_request_error",
                            "code": "conversation_already_has_active_response",
                            "message": "Conversation already has an active response in progress: "
                            + c.active[0],
                            "param": None,
                            "event_id": e.get("event_id"),
                        },
                    },
                )
                return
            await self._start_response(c)
        elif t == "response.cancel":
            if c.active is None:
                await self._send(
                    c,
                    {
                        "type": "error",
                        "error": {
                            "type": "invalid_request_error",
                            "code": "response_cancel_not_active",
                            "message": "Cancellation failed: no active response found",
                            "event_id": e.get("event_id"),
                        },
                    },
                )
                return
            c.cancel_reason = "client_cancelled"
            c.active[1].cancel()
        elif t == "conversation.item.truncate":
            await self._send(
                c,
                {
                    "type": "conversation.item.truncated",
                    "item_id": e["item_id"],
                    "content_index": e["content_index"],
                    "audio_end_ms": e["audio_end_ms"],
                },
            )
        elif t == "input_audio_buffer.append":
            await self._audio(c, base64.b64decode(e["audio"]))

    async def _audio(self, c: _Conn, pcm: bytes) -> None:
        self.audio_chunks.append(len(pcm))
        ms = len(pcm) / 48
        loud = rms(pcm) >= self.threshold
        start = c.audio_ms
        c.audio_ms += ms
        if loud and not c.speaking:
            c.speaking, c.speech_start_ms, c.silence_ms = True, start, 0.0
            item = self._id("item")
            c.session.setdefault("_item", item)
            await self._send(
                c,
                {"type": "input_audio_buffer.speech_started", "audio_start_ms": int(start), "item_id": item},
            )
            if c.active is not None and _turn(c).get("interrupt_response", True):
                c.cancel_reason = "turn_detected"
                c.active[1].cancel()
        elif c.speaking:
            c.silence_ms = 0.0 if loud else c.silence_ms + ms
            if c.silence_ms >= self.silence_needed:
                await self._end_utterance(c)

    async def _end_utterance(self, c: _Conn) -> None:
        c.speaking = False
        end = c.audio_ms - c.silence_ms
        self.speech.append((c.speech_start_ms, end))
        item = str(c.session.pop("_item", self._id("item")))
        await self._send(
            c, {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": int(end), "item_id": item}
        )
        await self._send(
            c, {"type": "input_audio_buffer.committed", "item_id": item, "previous_item_id": None}
        )
        text = self.transcripts[c.utterances] if c.utterances < len(self.transcripts) else ""
        c.utterances += 1
        user = {
            "id": item,
            "type": "message",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": text}],
        }
        c.items.append(user)
        await self._send(
            c,
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item,
                "content_index": 0,
                "transcript": text,
                "usage": {"type": "duration", "seconds": round(end - c.speech_start_ms) / 1000},
            },
        )
        if _turn(c).get("create_response", True) and c.active is None:
            await self._start_response(c)

    # ------------------------------------------------------------------ responses
    async def _start_response(self, c: _Conn) -> None:
        rid = self._id("resp")
        task = asyncio.get_running_loop().create_task(self._respond(c, rid))
        c.active = (rid, task)
        self.max_active = max(self.max_active, 1)

    async def _respond(self, c: _Conn, rid: str) -> None:
        audio = (c.session.get("output_modalities") or ["audio"]) == ["audio"]
        output: list[dict[str, Any]] = []
        out_tokens = 0
        await self._send(
            c,
            {
                "type": "response.created",
                "response": {"id": rid, "object": "realtime.response", "status": "in_progress", "output": []},
            },
        )
        status, reason = "completed", None
        try:
            r = self.reply(list(c.items))
            index = 0
            if r.text:
                item = {
                    "id": self._id("item"),
                    "type": "message",
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [],
                }
                await self._send(
                    c,
                    {
                        "type": "response.output_item.added",
                        "response_id": rid,
                        "output_index": index,
                        "item": item,
                    },
                )
                part_type = "audio" if audio else "text"
                await self._send(
                    c,
                    {
                        "type": "response.content_part.added",
                        "response_id": rid,
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "part": {"type": part_type},
                    },
                )
                words = r.text.split(" ")
                for i, word in enumerate(words):
                    delta = word if i == 0 else " " + word
                    base = {
                        "response_id": rid,
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                    }
                    if audio:
                        pcm = struct.pack("<240h", *([1000] * 240))  # 10 ms of sound per word (24 kHz)
                        await self._send(
                            c,
                            {
                                "type": "response.output_audio.delta",
                                **base,
                                "delta": base64.b64encode(pcm).decode(),
                            },
                        )
                        await self._send(
                            c, {"type": "response.output_audio_transcript.delta", **base, "delta": delta}
                        )
                    else:
                        await self._send(c, {"type": "response.output_text.delta", **base, "delta": delta})
                    out_tokens += 1
                    await asyncio.sleep(0)
                if r.hold:
                    await self.released.wait()
                base = {"response_id": rid, "item_id": item["id"], "output_index": index, "content_index": 0}
                if audio:
                    await self._send(c, {"type": "response.output_audio.done", **base})
                    await self._send(
                        c, {"type": "response.output_audio_transcript.done", **base, "transcript": r.text}
                    )
                else:
                    await self._send(c, {"type": "response.output_text.done", **base, "text": r.text})
                item = {**item, "status": "completed"}
                await self._send(
                    c,
                    {
                        "type": "response.output_item.done",
                        "response_id": rid,
                        "output_index": index,
                        "item": item,
                    },
                )
                c.items.append({**item, "content": [{"type": "output_text", "text": r.text}]})
                output.append(item)
                index += 1
            for name, args in r.calls:
                call_id = self._id("call")
                item = {
                    "id": self._id("item"),
                    "type": "function_call",
                    "call_id": call_id,
                    "name": name,
                    "arguments": "",
                    "status": "in_progress",
                }
                text = json.dumps(args)
                await self._send(
                    c,
                    {
                        "type": "response.output_item.added",
                        "response_id": rid,
                        "output_index": index,
                        "item": item,
                    },
                )
                await self._send(
                    c,
                    {
                        "type": "response.function_call_arguments.delta",
                        "response_id": rid,
                        "item_id": item["id"],
                        "output_index": index,
                        "call_id": call_id,
                        "delta": text,
                    },
                )
                await self._send(
                    c,
                    {
                        "type": "response.function_call_arguments.done",
                        "response_id": rid,
                        "item_id": item["id"],
                        "output_index": index,
                        "call_id": call_id,
                        "name": name,
                        "arguments": text,
                    },
                )
                item = {**item, "arguments": text, "status": "completed"}
                await self._send(
                    c,
                    {
                        "type": "response.output_item.done",
                        "response_id": rid,
                        "output_index": index,
                        "item": item,
                    },
                )
                c.items.append(item)
                output.append(item)
                index += 1
                out_tokens += 5
        except asyncio.CancelledError:
            status, reason = "cancelled", c.cancel_reason
        c.active = None
        c.responses += 1
        details: dict[str, Any] = {"type": status}
        if reason is not None:
            details["reason"] = reason
        inp = 10 * len(c.items) + 1
        usage = {
            "total_tokens": inp + out_tokens,
            "input_tokens": inp,
            "output_tokens": out_tokens,
            "input_token_details": {
                "text_tokens": inp,
                "audio_tokens": 0,
                "cached_tokens": 0,
                "image_tokens": 0,
            },
            "output_token_details": {
                "text_tokens": 0 if audio else out_tokens,
                "audio_tokens": out_tokens if audio else 0,
            },
        }
        await self._send(
            c,
            {
                "type": "response.done",
                "response": {
                    "id": rid,
                    "object": "realtime.response",
                    "status": status,
                    "status_details": details,
                    "output": output,
                    "usage": usage,
                },
            },
        )
        if self.drop_after_responses is not None and c.responses >= self.drop_after_responses:
            self.drop_after_responses = None
            await c.ws.close()


def _turn(c: _Conn) -> dict[str, Any]:
    return dict(((c.session.get("audio") or {}).get("input") or {}).get("turn_detection") or {})


def _item(item: dict[str, Any]) -> dict[str, Any]:
    """A conversation item as the server echoes it (with a status)."""
    out = dict(item)
    if out["type"] == "message":
        out.setdefault("status", "completed")
    return out
