"""Live fan-out of an agent's events to its stream subscribers, in this process.

Durable events reach the hub from after-commit callbacks of the transactions that wrote them, so a
subscriber never sees an event that was rolled back, and sees durable events in `seq` order (SQLite: one
writer, callbacks run in commit order). Token deltas and `block_reset` come live from `Hooks.on_event` and
are never stored.

Each subscriber has a bounded queue. A subscriber that falls behind by more than its bound is not allowed
to grow memory: its queue is dropped and its stream closes; the client resumes with its last event id and
gets what it missed from the store. Publishing never blocks and never awaits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

__all__ = ["CLOSE", "OVERFLOW", "Hub", "Live", "StoredEvent", "Subscriber"]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A durable event: `data` is its JSON payload, already encoded (the same bytes for every subscriber)."""

    agent_id: str
    seq: int
    run_id: str | None
    type: str
    data: str

    def frame(self) -> str:
        return f"id: {self.seq}\nevent: {self.type}\ndata: {self.data}\n\n"


@dataclass(frozen=True, slots=True)
class Live:
    """A live-only event (a token delta or `block_reset`); its id is given per subscriber."""

    agent_id: str
    run_id: str | None
    type: str
    data: str
    delta: bool


class _Signal:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


CLOSE = _Signal("close")
"""The stream ends (the service is shutting down or the agent was deleted)."""
OVERFLOW = _Signal("overflow")
"""The subscriber fell too far behind; its stream ends and the client resumes by id."""

Item = StoredEvent | Live | _Signal


class Subscriber:
    __slots__ = ("agent_id", "deltas", "queue")

    def __init__(self, agent_id: str, deltas: bool, maxsize: int) -> None:
        self.agent_id = agent_id
        self.deltas = deltas
        # one slot more than the bound, kept free for the closing signal
        self.queue: asyncio.Queue[Item] = asyncio.Queue(maxsize + 1)

    def _put(self, item: Item, bound: int) -> None:
        q = self.queue
        if q.qsize() >= bound:
            while not q.empty():
                q.get_nowait()
            q.put_nowait(OVERFLOW)
            return
        q.put_nowait(item)

    def _signal(self, signal: _Signal) -> None:
        q = self.queue
        while q.full():
            q.get_nowait()
        q.put_nowait(signal)


class Hub:
    """Per-agent sets of subscribers with bounded queues (`max_queue` events each)."""

    def __init__(self, max_queue: int = 1000) -> None:
        self.max_queue = max_queue
        self._subs: dict[str, set[Subscriber]] = {}
        self.closed = False

    def subscribe(self, agent_id: str, *, deltas: bool = False) -> Subscriber:
        sub = Subscriber(agent_id, deltas, self.max_queue)
        if self.closed:
            sub._signal(CLOSE)
            return sub
        self._subs.setdefault(agent_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        subs = self._subs.get(sub.agent_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.agent_id]

    def subscribers(self, agent_id: str | None = None) -> int:
        if agent_id is not None:
            return len(self._subs.get(agent_id, ()))
        return sum(len(s) for s in self._subs.values())

    def publish(self, event: StoredEvent | Live) -> None:
        subs = self._subs.get(event.agent_id)
        if not subs:
            return
        live_delta = isinstance(event, Live) and event.delta
        for sub in list(subs):
            if live_delta and not sub.deltas:
                continue
            sub._put(event, self.max_queue)

    def close_agent(self, agent_id: str) -> None:
        """End every stream of one agent (it was deleted)."""
        for sub in self._subs.pop(agent_id, set()):
            sub._signal(CLOSE)

    def close(self) -> None:
        """End every stream (the service is shutting down); later subscriptions end at once."""
        self.closed = True
        subs, self._subs = self._subs, {}
        for group in subs.values():
            for sub in group:
                sub._signal(CLOSE)
