"""The text-duplex driver: a scripted, in-process realtime model for tests, demos and the terminal.

It is NOT a language model. It plays a script file (`model: text-duplex:SCRIPT.yaml`, in the style of the
scripted model files; it must start with `scripted: true`)::

    # SCRIPTED REALTIME MODEL — not a real model; replays the responses below.
    scripted: true
    chunk: 12                     # stream text in pieces of 12 characters (0: one piece)
    rules:                        # replies: the first rule whose `when` matches the latest user text
      - when: {user_contains: brief}
        responses:                # the N-th reply since that user text (the reply after a tool output
          - text: "On it: I'm asking the team."       #   counts as the next one)
            tool_call: {name: invoke_target_agent, arguments: {request: "{user}"}}
          - text: "The team has started; I'll tell you when it's ready."
      - responses:
          - text: "You said: {user}"
    result: "The team is done. {result}"       # speaking a delegation's result ({agent}, {request} too)
    update: "Still working: {update}"          # speaking a progress digest
    note: ""                                   # after a reconnect ("" = say nothing)

It keeps the one-active-response rule exactly as the OpenAI Realtime API does: a `create_response` while a
response is active gets a non-fatal `conversation_already_has_active_response` error naming the request's
event id, and no `ResponseDone`. `cancel_response` ends the active response as `cancelled`
(`client_cancelled`), or answers `response_cancel_not_active`. A step with `fatal: true` drops the
connection (to exercise reconnects). Text is streamed as interim transcripts; `delay` / `delay_between`
(seconds, on the runner's clock) make a response take time. Usage is reported per response (≈ 4 characters a
token), so usage accounting is exercised too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from stead.extend import (
    InvalidInput,
    ScriptedFileOf,
    ScriptedReply,
    ScriptedRuleOf,
    load_yaml_model,
    new_id,
)
from stead.realtime._protocol import (
    CANCEL_NOT_ACTIVE,
    COLLISION,
    ModelError,
    ModelEvent,
    RealtimeUsage,
    ResponseDone,
    ResponseHint,
    ResponseStarted,
    SessionConfig,
    ToolCallRequest,
    Transcript,
)

__all__ = ["DuplexScript", "TextDuplexDriver", "load_duplex_script"]


class DuplexStep(ScriptedReply):
    """One scripted response (the scripted model files' schema, `ScriptedReply`, and `fatal`)."""

    fatal: bool = False
    """Drop the connection instead of answering (a fatal error)."""

    ALONE: ClassVar[str] = "fatal"

    def stands_alone(self) -> bool:
        return self.fatal


class DuplexRule(ScriptedRuleOf[DuplexStep]):
    """A rule of a text-duplex script."""


class DuplexScript(ScriptedFileOf[DuplexRule]):
    """A scripted realtime model file (see the module docstring): a scripted model file's schema, and what
    is spoken of a delegation's result, a progress digest and after a reconnect."""

    result: str = "Here is the result: {result}"
    update: str = "An update: {update}"
    note: str = ""


def load_duplex_script(path: str | Path) -> DuplexScript:
    """Load a text-duplex script; raise `DefinitionError` (`file:line:`) when it is malformed."""
    script, _ = load_yaml_model(path, DuplexScript, what="text-duplex script")
    return script


def _fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


def _fill_value(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _fill(value, values)
    if isinstance(value, list):
        return [_fill_value(x, values) for x in value]
    if isinstance(value, dict):
        return {k: _fill_value(x, values) for k, x in value.items()}
    return value


_Item = tuple[str, str]  # (kind, text): user | system | tool | assistant


class TextDuplexDriver:
    """A scripted realtime model (one connection). `sleep` is the runner's clock (fake in tests)."""

    def __init__(
        self,
        script: DuplexScript,
        *,
        name: str = "text-duplex",
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.script = script
        self._name = name
        self._sleep = sleep or asyncio.sleep
        self._queue: asyncio.Queue[ModelEvent | None] = asyncio.Queue()
        self._items: list[_Item] = []
        self._active: tuple[str, asyncio.Task[None]] | None = None
        self._ids = itertools.count(1)
        self._replies_since_user = 0
        self.config: SessionConfig | None = None
        self.connected = False
        self.closed = False
        self.sent: list[tuple[str, Any]] = []
        """Every client action in order (tests read it)."""
        self.truncations: list[tuple[str, int]] = []
        self.collisions = 0
        """`create_response` calls that found a response active (a sequencer bug if the runner made them)."""

    @property
    def name(self) -> str:
        return self._name

    @property
    def vendor(self) -> str:
        return "text-duplex"

    def cost(self, usage: RealtimeUsage) -> float | None:
        return None

    # ------------------------------------------------------------------ client actions
    async def connect(self, config: SessionConfig) -> None:
        self.config = config
        self.connected = True
        self.sent.append(("connect", config))

    def events(self) -> AsyncIterator[ModelEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ModelEvent]:
        while True:
            ev = await self._queue.get()
            if ev is None:
                return
            yield ev

    def _check(self) -> None:
        if self.closed:
            raise ConnectionError("the text-duplex connection is closed")

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        self._check()
        self.sent.append((f"{role}_text", text))
        self._items.append((role, text))
        if role == "user":
            self._replies_since_user = 0

    async def send_audio(self, pcm16: bytes) -> None:
        raise InvalidInput("the text-duplex model takes text only (use a real realtime model for audio)")

    async def send_tool_output(self, call_id: str, output: str) -> None:
        self._check()
        self.sent.append(("tool_output", (call_id, output)))
        self._items.append(("tool", output))

    async def create_response(
        self, instructions: str | None = None, *, hint: ResponseHint | None = None
    ) -> str:
        self._check()
        event_id = f"evt_{new_id()}"
        hint = hint or ResponseHint()
        self.sent.append(("response.create", (hint.kind, instructions)))
        if self._active is not None:
            self.collisions += 1
            await self._queue.put(
                ModelError(
                    f"Conversation already has an active response in progress: {self._active[0]}",
                    code=COLLISION,
                    event_id=event_id,
                )
            )
            return event_id
        response_id = f"resp_{next(self._ids)}"
        task = asyncio.get_running_loop().create_task(self._respond(response_id, hint))
        self._active = (response_id, task)
        return event_id

    async def cancel_response(self) -> None:
        self._check()
        self.sent.append(("response.cancel", None))
        active = self._active
        if active is None:
            await self._queue.put(ModelError("There is no active response", code=CANCEL_NOT_ACTIVE))
            return
        response_id, task = active
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._active is not None and self._active[0] == response_id:
            self._active = None
            await self._queue.put(ResponseDone(response_id, "cancelled", "client_cancelled", self._usage("")))

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        self.sent.append(("truncate", (item_id, audio_end_ms)))
        self.truncations.append((item_id, audio_end_ms))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._active is not None:
            self._active[1].cancel()
            await asyncio.gather(self._active[1], return_exceptions=True)
            self._active = None
        await self._queue.put(None)

    # ------------------------------------------------------------------ the scripted model
    def _step(self, hint: ResponseHint) -> tuple[DuplexStep | None, str]:
        """The step to play and the text template values; None with an explanation when none fits."""
        values = dict(hint.values)
        user = next((text for kind, text in reversed(self._items) if kind == "user"), "")
        values.setdefault("user", user)
        if hint.kind != "reply":
            template = {"result": self.script.result, "update": self.script.update, "note": self.script.note}
            return DuplexStep(text=_fill(template[hint.kind], values)) if template[hint.kind] else None, ""
        n = self._replies_since_user
        self._replies_since_user += 1
        rule = next((r for r in self.script.rules if r.when is None or r.when.matches(user)), None)
        if rule is None:
            return None, f"no rule of the text-duplex script matches {user!r}"
        if n >= len(rule.responses):
            return None, ""  # the rule's replies are used up: an empty response
        return rule.responses[n], ""

    def _usage(self, text: str) -> RealtimeUsage:
        context = sum(len(t) for _, t in self._items)
        out = len(text) // 4 + (1 if text else 0)
        inp = context // 4 + 1
        return RealtimeUsage(
            input_tokens=inp, output_tokens=out, input_text_tokens=inp, output_text_tokens=out, responses=1
        )

    async def _respond(self, response_id: str, hint: ResponseHint) -> None:
        await self._queue.put(ResponseStarted(response_id))
        step, problem = self._step(hint)
        if problem:
            await self._queue.put(ModelError(problem, code="script"))
        text = ""
        status = "completed"
        if step is not None:
            values = {
                **dict(hint.values),
                "user": next((t for k, t in reversed(self._items) if k == "user"), ""),
            }
            delay = step.delay if step.delay is not None else self.script.delay
            if delay:
                await self._sleep(delay)
            if step.fatal:
                self._active = None
                self.closed = True
                await self._queue.put(
                    ModelError("the scripted connection dropped", code="dropped", fatal=True)
                )
                await self._queue.put(None)
                return
            if step.text is not None:
                text = _fill(step.text, values)
                item_id = f"item_{new_id()}"
                chunk = step.chunk if step.chunk is not None else self.script.chunk
                between = step.delay_between if step.delay_between is not None else self.script.delay_between
                pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
                for i, piece in enumerate(pieces):
                    if i and between:
                        await self._sleep(between)
                    await self._queue.put(Transcript("assistant", item_id, piece, False))
                    await asyncio.sleep(0)
                await self._queue.put(Transcript("assistant", item_id, text, True))
                self._items.append(("assistant", text))
            for call in step.calls():
                arguments = json.dumps(_fill_value(call.arguments, values))
                await self._queue.put(ToolCallRequest(f"call_{new_id()}", call.name, arguments, response_id))
        if self._active is not None and self._active[0] == response_id:
            self._active = None
        await self._queue.put(ResponseDone(response_id, status, None, self._usage(text)))
