"""Helpers of the realtime tests: a fake clock, a small team whose worker waits on a gate the test opens,
and waiting for a session event (synchronization on events, never on sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import stead
from stead.realtime import RealtimeEvent, RealtimePlugin, RealtimeSession

TIMEOUT = 20.0
HERE = "tests.realtime.support"

GATES: dict[str, asyncio.Event] = {}
"""Task text -> the gate the worker's `work` tool waits on (no entry: it does not wait)."""
BLOCK_ALL = False
"""The kill test's child process: every `work` call blocks forever after printing a marker."""


def gate(task: str) -> asyncio.Event:
    event = GATES[task] = asyncio.Event()
    return event


@stead.tool(durable=True)
async def work(task: str) -> str:
    """Work on a task.

    Args:
        task: The task.
    """
    if BLOCK_ALL:
        print(f"WORKING {task}", flush=True)
        await asyncio.Event().wait()
    g = GATES.get(task)
    if g is not None:
        await g.wait()
    return f"worked on {task}"


@stead.tool
def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper()


class FakeClock:
    """`now()` moves only when the test says; `sleep()` wakes when the clock passes its deadline."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._n = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + seconds, next(self._n), fut))
        await fut

    def advance(self, seconds: float) -> None:
        self.t += seconds
        while self._sleepers and self._sleepers[0][0] <= self.t:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def sleepers(self) -> int:
        return sum(1 for *_, f in self._sleepers if not f.done())


VOICE_SCRIPT = """\
scripted: true
description: the voice of the test team
rules:
  - when: {user_contains: "task"}
    responses:
      - text: "Handing it over."
        tool_call: {name: invoke_target_agent, arguments: {request: "{user}"}}
      - text: "It has started."
  - when: {user_contains: "long"}
    responses:
      - text: "This is a long answer that keeps going."
        chunk: 8
        delay_between: 1000
  - responses:
      - text: "You said {user}."
result: "Result: {result}"
update: "Update: {update}"
note: "Back again."
"""

WORKER_SCRIPT = """\
scripted: true
rules:
  - responses:
      - tool_call: {name: work, arguments: {task: "{user}"}}
      - text: "finished: {last_tool_result}"
"""


def write_team(directory: Path, *, voice: dict[str, Any] | None = None, script: str = VOICE_SCRIPT) -> Path:
    """A registry: `worker` (a loop agent calling `work`) and `voice` (realtime, text-duplex)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "worker-model.yaml").write_text(WORKER_SCRIPT)
    (directory / "voice-model.yaml").write_text(script)
    docs: dict[str, dict[str, Any]] = {
        "worker": {
            "name": "worker",
            "description": "Does the work.",
            "model": "scripted:worker-model.yaml",
            "tools": [f"{HERE}:work"],
        },
        "voice": {
            "name": "voice",
            "type": "realtime",
            "description": "The voice.",
            "instructions": "You are {{ agent.name }}.",
            "model": "text-duplex:voice-model.yaml",
            "target_agents": ["worker"],
            **(voice or {}),
        },
    }
    for name, doc in docs.items():
        (directory / f"{name}.yaml").write_text(json.dumps(doc))
    return directory


@contextlib.asynccontextmanager
async def open_team(
    db: str, team: Path, clock: FakeClock | None = None, **plugin: Any
) -> AsyncIterator[stead.AgentSystem]:
    """The team's system with the realtime plugin; on the way out every gate opens (a failed test never
    leaves a worker waiting forever) before the system closes."""
    system = await stead.open(
        db, definitions=team, plugins=[RealtimePlugin(clock=clock or FakeClock(), **plugin)]
    )
    try:
        yield system
    finally:
        for g in GATES.values():
            g.set()
        await system.close()
        GATES.clear()


class Events:
    """A session's event stream, read until a wanted event arrives (with a timeout, not a sleep)."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.seen: list[RealtimeEvent] = []
        self._it: AsyncIterator[RealtimeEvent] = session.events()

    async def until(self, wanted: Callable[[RealtimeEvent], bool], timeout: float = TIMEOUT) -> RealtimeEvent:
        async def scan() -> RealtimeEvent:
            async for ev in self._it:
                self.seen.append(ev)
                if wanted(ev):
                    return ev
            raise AssertionError(f"the session ended first; events: {[e.type for e in self.seen]}")

        return await asyncio.wait_for(scan(), timeout)

    async def type(self, kind: str, **fields: Any) -> RealtimeEvent:
        return await self.until(
            lambda e: e.type == kind and all(getattr(e, k) == v for k, v in fields.items())
        )

    async def any(self, kind: str, **fields: Any) -> RealtimeEvent:
        """An event of this kind already seen, or the next one."""
        for e in self.seen:
            if e.type == kind and all(getattr(e, k) == v for k, v in fields.items()):
                return e
        return await self.type(kind, **fields)

    def of(self, kind: str) -> list[RealtimeEvent]:
        return [e for e in self.seen if e.type == kind]


async def rows(system: stead.AgentSystem, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with system.store.transaction() as tx:
        return await tx.fetch(sql, params)
