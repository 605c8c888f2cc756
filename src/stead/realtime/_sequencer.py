"""The response sequencer: the one place that asks the model for a response, so responses never overlap.

A realtime conversation has at most one active response. Everything the session wants said — a reply after
the user's turn or a tool output, a delegation's result, a progress digest — is a `Speech` in a FIFO. The
sequencer sends `response.create` only when idle: no response active (between `ResponseStarted` and
`ResponseDone`, whoever started it — the server starts responses by itself after speech or a tool output),
none requested and not yet started, and the user not speaking. A request that collides anyway (the server
started a response at the same moment) comes back with a `conversation_already_has_active_response` error:
the speech goes back to the head of the queue and is retried after the next `ResponseDone` — never fatal.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stead.realtime._protocol import COLLISION, ModelError, RealtimeModel, ResponseDone, ResponseHint

__all__ = ["ResponseSequencer", "Speech"]

log = logging.getLogger("stead.realtime")


@dataclass(eq=False)
class Speech:
    """Something to say: `prepare` adds its conversation items right before its `response.create`; `done`
    is told how its response ended (None: it was dropped unspoken)."""

    hint: ResponseHint = field(default_factory=ResponseHint)
    instructions: str | None = None
    prepare: Callable[[], Awaitable[None]] | None = None
    done: Callable[[ResponseDone | None], Awaitable[None]] | None = None
    prepared: bool = False

    @property
    def kind(self) -> str:
        return self.hint.kind


class ResponseSequencer:
    def __init__(self, model: RealtimeModel) -> None:
        self.model = model
        self.queue: deque[Speech] = deque()
        self.active: str | None = None
        """The id of the active response (whoever started it)."""
        self.requested: Speech | None = None
        """A speech whose `response.create` was sent and whose response has not started yet."""
        self.requested_event: str | None = None
        self.collided = False
        """A request collided: wait for the next `ResponseDone` before asking again."""
        self.user_speaking = False
        self.owners: dict[str, Speech] = {}
        self.creates = 0
        self.collisions = 0

    @property
    def idle(self) -> bool:
        return self.active is None and self.requested is None and not self.collided and not self.user_speaking

    async def say(self, speech: Speech) -> None:
        self.queue.append(speech)
        await self.pump()

    def has(self, kind: str) -> bool:
        return any(s.kind == kind for s in self.queue) or (
            self.requested is not None and self.requested.kind == kind
        )

    async def pump(self) -> None:
        """Send the next speech when idle."""
        while self.idle and self.queue:
            speech = self.queue.popleft()
            if speech.prepare is not None and not speech.prepared:
                speech.prepared = True  # its items enter the conversation once, even if the create collides
                await speech.prepare()
            self.requested = speech
            self.creates += 1
            self.requested_event = await self.model.create_response(speech.instructions, hint=speech.hint)

    def started(self, response_id: str) -> None:
        self.active = response_id
        if self.requested is not None:
            self.owners[response_id] = self.requested
            self.requested = None
            self.requested_event = None

    async def finished(self, ev: ResponseDone) -> None:
        if self.active == ev.response_id:
            self.active = None
        self.collided = False
        speech = self.owners.pop(ev.response_id, None)
        if speech is not None and speech.done is not None:
            await speech.done(ev)
        await self.pump()

    async def error(self, ev: ModelError) -> bool:
        """A non-fatal model error; True when it was a collision of our request (handled: retried later)."""
        if (
            ev.code == COLLISION
            and self.requested is not None
            and ev.event_id in (None, self.requested_event)
        ):
            self.collisions += 1
            self.queue.appendleft(self.requested)
            self.requested = None
            self.requested_event = None
            self.collided = True
            return True
        return False

    async def set_user_speaking(self, speaking: bool) -> None:
        self.user_speaking = speaking
        if not speaking:
            await self.pump()

    async def drop(self, kind: str) -> None:
        """Forget queued speeches of one kind (narration on barge-in); their `done` hears None."""
        keep: deque[Speech] = deque()
        for s in self.queue:
            if s.kind == kind:
                if s.done is not None:
                    await s.done(None)
            else:
                keep.append(s)
        self.queue = keep

    async def reset(self, model: RealtimeModel) -> list[Speech]:
        """A new connection: nothing is active; return (and forget) every queued or in-flight speech."""
        pending = [
            *self.owners.values(),
            *([self.requested] if self.requested is not None else []),
            *self.queue,
        ]
        self.model = model
        self.queue.clear()
        self.owners.clear()
        self.active = self.requested = self.requested_event = None
        self.collided = False
        self.user_speaking = False
        return pending
