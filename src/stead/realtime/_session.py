"""The realtime session runner: one live conversation between a user and a realtime model, handing work
to durable agents (docs/realtime.md).

Duties, each in one place:
- tools: `invoke_target_agent(request)` (the broker: a durable child run per call, answered at once with
  "started") plus the definition's extra tools (run here, recorded as steps);
- the response sequencer: nothing speaks over anything else (`ResponseSequencer`);
- results: each settled delegation is spoken through the sequencer and marked delivered once its response
  ended; undelivered ones go first after a reconnect or when a new session of the same realtime agent opens;
- narration: progress read from the children's run records, paced 5 s / 8 s (`Narrator`);
- barge-in: the user speaking (or typing) while the model speaks stops narration and the response, truncates
  the unplayed audio and aborts running delegations (unless `delegation.cancel_on_interruption: false`);
- transcripts: one row per turn (`TranscriptWriter`); usage: one long-lived prompt step (`UsageMeter`);
- one automatic reconnect after a fatal error; `close()` is idempotent and flushes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stead.definitions import AgentDefinition, RealtimeSettings
from stead.extend import (
    CallKV,
    Tool,
    ToolContext,
    ToolSpec,
    end_run,
    new_id,
    record_step,
    render_output,
    update_step,
)
from stead.realtime._broker import STARTED_NOTE, Broker, Delegation
from stead.realtime._clock import Clock
from stead.realtime._models import RealtimeChoice
from stead.realtime._narration import Narrator, progress_items
from stead.realtime._protocol import (
    AudioDelta,
    ModelError,
    ModelEvent,
    RealtimeModel,
    ResponseDone,
    ResponseHint,
    ResponseStarted,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequest,
    Transcript,
)
from stead.realtime._sequencer import ResponseSequencer, Speech
from stead.realtime._transcripts import TranscriptWriter
from stead.realtime._usage import UsageMeter

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = ["INVOKE", "RealtimeEvent", "RealtimeSession"]

log = logging.getLogger("stead.realtime")

INVOKE = "invoke_target_agent"
RECONNECT_NOTE = (
    "[stead] The connection dropped and was restored. Work handed off earlier keeps running; its results "
    "follow as they arrive."
)
BYTES_PER_MS = 48  # PCM16 mono 24 kHz


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """One event of a session (`async for event in session.events()`), told apart by `type`:

    - `transcript`: `role` (user/assistant), `text` (a piece when `final` is False, the turn when True),
      `item_id`;
    - `tool_call`: `call_id`, `name`, `arguments` (JSON text);
    - `delegation_started`: `delegation_id`, `agent` (the target), `text` (the request);
    - `delegation_progress`: `delegation_id`, `text` (one progress item from the run records);
    - `delegation_result`: `delegation_id`, `agent`, `status` (completed/failed), `text` (the result), as it
      is handed to the model to speak;
    - `response_done`: `response_id`, `status`, `reason`, `usage`;
    - `audio`: `audio` (PCM16 24 kHz of the model's speech), `item_id`;
    - `error`: `code`, `text`, `fatal` (a fatal one is followed by a reconnect, or the session ends).
    """

    type: str
    text: str | None = None
    role: str | None = None
    final: bool | None = None
    item_id: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    delegation_id: str | None = None
    agent: str | None = None
    status: str | None = None
    response_id: str | None = None
    reason: str | None = None
    usage: dict[str, int] | None = None
    code: str | None = None
    fatal: bool | None = None
    audio: bytes | None = None


@dataclass
class _Identity:
    session_id: str
    agent_id: str
    agent_name: str
    run_id: str
    prompt_step_id: str
    next_seq: int


class RealtimeSession:
    """A live session. Open one with `await system.realtime(definition=...)`."""

    def __init__(
        self,
        system: AgentSystem,
        *,
        identity: _Identity,
        definition: AgentDefinition,
        settings: RealtimeSettings,
        choice: RealtimeChoice,
        config: SessionConfig,
        targets: list[str],
        tools: dict[str, Tool],
        broker: Broker,
        clock: Clock,
        poll: float,
        debounce: float,
        on_close: Callable[[RealtimeSession], None],
    ) -> None:
        self.system = system
        self._id = identity.session_id
        self.agent_id = identity.agent_id
        self.agent_name = identity.agent_name
        self.run_id = identity.run_id
        self.prompt_step_id = identity.prompt_step_id
        self.definition = definition
        self.settings = settings
        self.choice = choice
        self.config = config
        self.targets = targets
        self.tools = tools
        self.broker = broker
        self.clock = clock
        self.poll = poll
        self._on_close = on_close
        self.model: RealtimeModel = choice.make()
        self.sequencer = ResponseSequencer(self.model)
        self.narrator = Narrator(settings.narration)
        self.transcripts = TranscriptWriter(system.store, self._id, identity.next_seq)
        self.usage = UsageMeter(
            system.store,
            session_id=self._id,
            run_id=self.run_id,
            step_id=self.prompt_step_id,
            clock=clock,
            debounce=debounce,
        )
        self.running: dict[str, Delegation] = {}
        self.reconnects = 0
        self.status = "open"
        self._events: asyncio.Queue[RealtimeEvent | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._queued_results: set[str] = set()
        self._seen_progress: set[str] = set()
        self._reader: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._audio_item: str | None = None
        self._audio_bytes = 0
        self._last_text: str | None = None

    @property
    def id(self) -> str:
        return self._id

    def __repr__(self) -> str:
        return (
            f"<stead.realtime.RealtimeSession {self._id} agent={self.agent_name!r} model={self.model.name!r}>"
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self, adopted: list[Delegation]) -> None:
        await self.model.connect(self.config)
        self.transcripts.start()
        self._reader = self._spawn(self._read())
        self._ticker = self._spawn(self._tick_forever())
        for d in adopted:
            if d.status == "running":
                self._watch(d)
        await self._enqueue_undelivered()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _emit(self, event: RealtimeEvent) -> None:
        if not self._closed.is_set():
            self._events.put_nowait(event)

    def events(self) -> AsyncIterator[RealtimeEvent]:
        """The session's events from its start (buffered until read) until it closes. One consumer."""
        return self._iter_events()

    async def _iter_events(self) -> AsyncIterator[RealtimeEvent]:
        while True:
            ev = await self._events.get()
            if ev is None:
                self._events.put_nowait(None)  # a later iteration ends too
                return
            yield ev

    def _check_open(self) -> None:
        if self._closing:
            from stead.extend import Closed

            raise Closed(f"realtime session {self._id} is closed")

    async def close(self) -> None:
        """Stop the session (idempotent): flush usage, stop narration, close the connection, write the queued
        transcripts, end the run record. Running delegations keep running: their results go to the next
        session of this realtime agent."""
        await self._stop("closed", None)

    async def _stop(self, status: str, error: str | None) -> None:
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            current = asyncio.current_task()
            for task in list(self._tasks):
                if task is not current and task is not self._reader:
                    task.cancel()
            for task in list(self._tasks):
                if task is not current and task is not self._reader:
                    with contextlib.suppress(BaseException):
                        await task
            self.narrator.clear()
            await self.usage.flush(final=True)
            with contextlib.suppress(Exception):
                await self.model.close()
            if self._reader is not None and self._reader is not current:
                self._reader.cancel()
                with contextlib.suppress(BaseException):
                    await self._reader
            await self.transcripts.drain()
            now = time.time()
            async with self.system.store.transaction() as tx:
                await tx.execute(
                    "UPDATE realtime_sessions SET status = ?, ended_at = ?, error = ? WHERE id = ?",
                    (status, now, error, self._id),
                )
                await update_step(
                    tx, self.run_id, self.prompt_step_id, status="completed" if error is None else "failed"
                )
                await end_run(
                    tx,
                    self.run_id,
                    status="completed" if error is None else "failed",
                    error=error,
                    final_message=self._last_text,
                )
            self.status = status
        finally:
            self._on_close(self)
            self._closed.set()
            self._events.put_nowait(None)

    # ------------------------------------------------------------------ input
    async def send_text(self, text: str) -> None:
        """The user types: their turn is recorded and answered. Typing while the model speaks is a
        barge-in."""
        self._check_open()
        if not text.strip():
            from stead.extend import InvalidInput

            raise InvalidInput("text is empty")
        if self.sequencer.active is not None:
            await self._barge_in("text")
        item = f"user_{new_id()}"
        self.transcripts.put(Transcript("user", item, text, True))
        self._emit(RealtimeEvent("transcript", text=text, role="user", final=True, item_id=item))
        await self.model.send_text(text)
        if not self.sequencer.has("reply"):
            await self.sequencer.say(Speech(ResponseHint("reply")))

    async def send_audio(self, pcm16: bytes) -> None:
        """The user speaks: PCM16 mono 24 kHz (the model's turn detection decides when they stopped)."""
        self._check_open()
        await self.model.send_audio(pcm16)

    async def interrupt(self) -> None:
        """Barge-in by hand: stop what the model is saying and the narration; abort running delegations unless
        the settings keep them."""
        self._check_open()
        await self._barge_in("interrupt")

    async def _barge_in(self, source: str) -> None:
        self.narrator.clear()
        await self.sequencer.drop("update")
        if self.sequencer.active is not None:
            if source != "speech":  # server turn detection cancels the response itself on speech
                await self.model.cancel_response()
            if self._audio_item is not None:
                await self.model.truncate(self._audio_item, self._audio_bytes // BYTES_PER_MS)
        if self.settings.delegation.cancel_on_interruption:
            for d in list(self.running.values()):
                if await self.broker.cancel(d):
                    self.running.pop(d.id, None)
                    watcher = self._watchers.pop(d.id, None)
                    if watcher is not None:
                        watcher.cancel()
                    self._emit(
                        RealtimeEvent(
                            "delegation_result",
                            delegation_id=d.id,
                            agent=d.target,
                            status="cancelled",
                            text=d.text,
                        )
                    )
                    with contextlib.suppress(Exception):
                        await self.model.send_text(
                            f"[stead] The task handed to {d.target} ({d.request!r}) was cancelled "
                            "because the "
                            "user interrupted. Do not announce a result for it.",
                            role="system",
                        )

    # ------------------------------------------------------------------ the model's events
    async def _read(self) -> None:
        while True:
            fatal: ModelError | None = None
            async for ev in self.model.events():
                if isinstance(ev, ModelError) and ev.fatal:
                    fatal = ev
                    break
                try:
                    await self._handle(ev)
                except Exception as e:
                    log.exception("realtime session %s: handling %s failed", self._id, type(ev).__name__)
                    self._emit(
                        RealtimeEvent("error", text=f"{type(e).__name__}: {e}", code="internal", fatal=False)
                    )
            if self._closing:
                return
            why = fatal.message if fatal is not None else "the connection ended"
            self._emit(RealtimeEvent("error", text=why, code=fatal.code if fatal else "closed", fatal=True))
            if self.reconnects >= 1:
                self._spawn(self._stop("failed", f"the realtime connection failed twice: {why}"))
                return
            self.reconnects += 1
            try:
                await self._reconnect()
            except Exception as e:
                log.exception("realtime session %s: reconnecting failed", self._id)
                self._spawn(self._stop("failed", f"reconnecting failed: {e}"))
                return

    async def _reconnect(self) -> None:
        with contextlib.suppress(Exception):
            await self.model.close()
        model = self.choice.make()
        await model.connect(self.config)
        self.model = model
        dropped = await self.sequencer.reset(model)
        for speech in dropped:
            if speech.done is not None:
                await speech.done(None)
        self._queued_results.clear()
        self.narrator.clear()
        self._audio_item, self._audio_bytes = None, 0
        await model.send_text(RECONNECT_NOTE, role="system")
        await self._enqueue_undelivered()

    async def _handle(self, ev: ModelEvent) -> None:
        if isinstance(ev, ResponseStarted):
            self.sequencer.started(ev.response_id)
            self._audio_item, self._audio_bytes = None, 0
        elif isinstance(ev, Transcript):
            self.transcripts.put(ev)
            if ev.final and ev.role == "assistant" and ev.text:
                self._last_text = ev.text
            self._emit(
                RealtimeEvent("transcript", text=ev.text, role=ev.role, final=ev.final, item_id=ev.item_id)
            )
        elif isinstance(ev, AudioDelta):
            if ev.item_id != self._audio_item:
                self._audio_item, self._audio_bytes = ev.item_id, 0
            self._audio_bytes += len(ev.audio)
            self._emit(RealtimeEvent("audio", audio=ev.audio, item_id=ev.item_id))
        elif isinstance(ev, ToolCallRequest):
            self._emit(RealtimeEvent("tool_call", call_id=ev.call_id, name=ev.name, arguments=ev.arguments))
            if ev.name == INVOKE:
                await self._invoke(ev)
            else:
                self._spawn(self._run_tool(ev))
        elif isinstance(ev, ResponseDone):
            if ev.status != "completed":
                self.transcripts.complete_open("assistant")  # what was said before the cut
            if ev.usage is not None:
                self.usage.add(ev.usage, self.model)
            await self.sequencer.finished(ev)
            self._emit(
                RealtimeEvent(
                    "response_done",
                    response_id=ev.response_id,
                    status=ev.status,
                    reason=ev.reason,
                    usage=ev.usage.to_json() if ev.usage is not None else None,
                )
            )
        elif isinstance(ev, SpeechStarted):
            speaking = self.sequencer.active is not None
            await self.sequencer.set_user_speaking(True)
            if speaking:
                await self._barge_in("speech")
            else:
                self.narrator.clear()
                await self.sequencer.drop("update")
        elif isinstance(ev, SpeechStopped):
            await self.sequencer.set_user_speaking(False)
        elif isinstance(ev, ModelError):
            handled = await self.sequencer.error(ev)
            if not handled:
                log.info("realtime session %s: model error %s: %s", self._id, ev.code, ev.message)
            self._emit(RealtimeEvent("error", text=ev.message, code=ev.code, fatal=False))

    # ------------------------------------------------------------------ tools
    def _invoke_args(self, raw: str) -> tuple[str, str | None, str | None]:
        """(request, target, problem) from the call's arguments."""
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            args = raw
        if not isinstance(args, dict):
            return str(args), self.targets[0] if len(self.targets) == 1 else None, None
        request = str(args.get("request") or "").strip()
        target = args.get("agent") if len(self.targets) > 1 else self.targets[0]
        if not request:
            return "", None, "the request is empty: say what the agent should do"
        if target not in self.targets:
            return request, None, f"unknown agent {target!r}; choose one of {', '.join(self.targets)}"
        return request, str(target), None

    async def _invoke(self, call: ToolCallRequest) -> None:
        request, target, problem = self._invoke_args(call.arguments)
        if problem is not None or target is None:
            output = json.dumps({"status": "error", "error": problem or "no target agent"})
        else:
            d, created = await self.broker.start(
                session_id=self._id,
                run_id=self.run_id,
                session_data=None,
                call_id=call.call_id,
                target=target,
                request=request,
            )
            if created:
                self._emit(
                    RealtimeEvent("delegation_started", delegation_id=d.id, agent=target, text=request)
                )
                self._watch(d)
            output = json.dumps({"status": "started", "delegation_id": d.id, "note": STARTED_NOTE})
        await self.model.send_tool_output(call.call_id, output)
        if not self.sequencer.has("reply"):
            await self.sequencer.say(Speech(ResponseHint("reply")))

    async def _run_tool(self, call: ToolCallRequest) -> None:
        t = self.tools.get(call.name)
        store = self.system.store
        async with store.transaction() as tx:
            step = await record_step(
                tx, self.run_id, "tool", call.name, status="running", target=call.name, input=call.arguments
            )
        error = False
        if t is None:
            output, error = f"unknown tool {call.name!r}", True
        else:
            kv = CallKV(store, self.agent_id, call.call_id)
            ctx = ToolContext(call.call_id, call.name, self.agent_id, self.run_id, "auto", kv, store)
            try:
                output = render_output(await t.call(ctx, t.validate(call.arguments)))
            except Exception as e:
                output, error = f"{type(e).__name__}: {e}", True
            async with store.transaction() as tx:
                await tx.delete_prefix(self.agent_id, f"kv.c.{call.call_id}.")
        async with store.transaction() as tx:
            await update_step(
                tx,
                self.run_id,
                step,
                status="failed" if error else "completed",
                output=output,
                error=output if error else None,
            )
        if self._closing:
            return
        await self.model.send_tool_output(call.call_id, json.dumps({"error": output}) if error else output)
        if not self.sequencer.has("reply"):
            await self.sequencer.say(Speech(ResponseHint("reply")))

    # ------------------------------------------------------------------ delegations
    def _watch(self, d: Delegation) -> None:
        self.running[d.id] = d
        self._watchers[d.id] = self._spawn(self._watch_one(d))

    async def _watch_one(self, d: Delegation) -> None:
        try:
            settled = await self.broker.watch(d)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("realtime session %s: watching delegation %s failed", self._id, d.id)
            return
        finally:
            self._watchers.pop(d.id, None)
        self.running.pop(d.id, None)
        if settled is not None and settled.delivered_at is None and not self._closing:
            await self._enqueue_result(settled)

    async def _enqueue_undelivered(self) -> None:
        for d in await self.broker.undelivered():
            if d.status != "running" and d.session_id == self._id:
                await self._enqueue_result(d)

    async def _enqueue_result(self, d: Delegation) -> None:
        if d.id in self._queued_results or d.status == "running":
            return
        self._queued_results.add(d.id)
        status = d.status
        if status == "completed":
            note = (
                f"[stead] The task you handed to {d.target} ({d.request!r}) has finished. "
                f"Its result:\n{d.text}\n"
                "Tell the user the result naturally and briefly; do not repeat what you already said."
            )
        else:
            note = (
                f"[stead] The task you handed to {d.target} ({d.request!r}) ended without a result "
                f"({status}): "
                f"{d.text}\nTell the user briefly; do not invent a result."
            )

        async def prepare() -> None:
            await self.model.send_text(note, role="system")
            self._emit(
                RealtimeEvent(
                    "delegation_result", delegation_id=d.id, agent=d.target, status=status, text=d.text
                )
            )

        async def done(ev: ResponseDone | None) -> None:
            if ev is None:
                self._queued_results.discard(d.id)  # unspoken: it stays undelivered
                return
            await self.broker.mark_delivered(d)

        await self.sequencer.say(
            Speech(
                ResponseHint("result", {"result": d.text, "agent": d.target, "request": d.request}),
                prepare=prepare,
                done=done,
            )
        )

    # ------------------------------------------------------------------ narration
    async def _tick_forever(self) -> None:
        while True:
            await self.clock.sleep(self.poll)
            try:
                await self.tick()
            except Exception:
                log.exception("realtime session %s: narration tick failed", self._id)

    async def tick(self) -> None:
        """Read the progress of running delegations and speak a digest when one is due (the session calls
        this every `poll` seconds; tests call it after moving a fake clock)."""
        if self._closing:
            return
        if not self.running:
            self.narrator.clear()
            return
        now = self.clock.now()
        for d in list(self.running.values()):
            run_id = await self.broker.child_run_id(d)
            if run_id is None:
                continue
            try:
                run = await self.system.run(run_id)
            except Exception:
                continue
            for key, text in progress_items(run):
                if key in self._seen_progress:
                    continue
                self._seen_progress.add(key)
                self.narrator.add(text, now)
                self._emit(
                    RealtimeEvent("delegation_progress", delegation_id=d.id, agent=d.target, text=text)
                )
        if not self.sequencer.idle or self.sequencer.queue:
            return
        digest = self.narrator.due(now)
        if digest is None:
            return
        instructions = (
            "Give the user a one-sentence spoken progress update on the work you handed off, from these "
            f"notes: {digest}. The task is still running: do not make up results or details that are not "
            "in the notes."
        )
        await self.sequencer.say(
            Speech(ResponseHint("update", {"update": digest}), instructions=instructions)
        )


def tool_specs(targets: list[str], descriptions: dict[str, str], extra: list[Tool]) -> list[ToolSpec]:
    """`invoke_target_agent` (with an `agent` choice when there are several targets) and the extra tools."""
    props: dict[str, Any] = {
        "request": {
            "type": "string",
            "description": "What the agent should do, self-contained (it does not hear this conversation).",
        }
    }
    required = ["request"]
    if len(targets) > 1:
        props["agent"] = {
            "type": "string",
            "enum": list(targets),
            "description": "Which agent does the work.",
        }
        required.append("agent")
    who = "; ".join(f"{t}: {descriptions.get(t) or 'an agent'}" for t in targets)
    invoke = ToolSpec(
        INVOKE,
        f"Hand a task to a durable agent ({who}). It returns at once with status 'started'; the result "
        "arrives later as a [stead] system message. Never invent the result.",
        {"type": "object", "properties": props, "required": required},
    )
    return [invoke, *(ToolSpec(t.name, t.description, t.parameters) for t in extra)]
