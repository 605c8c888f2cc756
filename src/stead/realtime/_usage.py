"""Usage checkpoints: a session's token usage accumulates onto its one long-lived prompt step.

Usage arrives with each `ResponseDone` (cancelled responses too) and is summed in memory. The first usage
after a checkpoint schedules the next one `debounce` seconds later (5), so a burst of responses costs one
write; `flush(final=True)` writes what is left at stop and ignores any usage that arrives after it. A
checkpoint is one transaction: the prompt step's tokens and cost (the totals so far) and the session row's
modality detail. A failed checkpoint stays dirty and is retried by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from stead.extend import Store, update_step
from stead.realtime._clock import Clock
from stead.realtime._protocol import RealtimeModel, RealtimeUsage

__all__ = ["UsageMeter"]

log = logging.getLogger("stead.realtime")


class UsageMeter:
    def __init__(
        self,
        store: Store,
        *,
        session_id: str,
        run_id: str,
        step_id: str,
        clock: Clock,
        debounce: float = 5.0,
        total: RealtimeUsage | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.run_id = run_id
        self.step_id = step_id
        self.clock = clock
        self.debounce = debounce
        self.total = total or RealtimeUsage()
        self.model: RealtimeModel | None = None
        self.cost: float | None = None
        self.dirty = False
        self.stopped = False
        self.checkpoints = 0
        self.checkpointed = asyncio.Event()
        """Set after each checkpoint commits (tests clear and await it)."""
        self._generation = 0
        self._timer: asyncio.Task[None] | None = None

    def add(self, usage: RealtimeUsage, model: RealtimeModel) -> None:
        if self.stopped:
            return  # late usage after stop is ignored
        self.total.add(usage)
        cost = model.cost(usage)
        if cost is not None:
            self.cost = (self.cost or 0.0) + cost
        self.model = model
        self.dirty = True
        self._generation += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await self.clock.sleep(self.debounce)
        self._timer = None
        await self.flush()

    async def flush(self, *, final: bool = False) -> None:
        if final:
            self.stopped = True
            timer, self._timer = self._timer, None
            if timer is not None and timer is not asyncio.current_task():
                timer.cancel()
                with contextlib.suppress(BaseException):
                    await timer
        if not self.dirty:
            return
        generation = self._generation
        try:
            async with self.store.transaction() as tx:
                await update_step(
                    tx,
                    self.run_id,
                    self.step_id,
                    usage=self.total.to_usage(self.cost),
                    provider=self.model.vendor if self.model is not None else None,
                )
                await tx.execute(
                    "UPDATE realtime_sessions SET usage_json = ? WHERE id = ?",
                    (json.dumps({**self.total.to_json(), "cost": self.cost}), self.session_id),
                )
            self.dirty = self._generation != generation  # usage that arrived meanwhile waits for the next
            self.checkpoints += 1
            self.checkpointed.set()
        except Exception:
            log.exception(
                "a usage checkpoint failed (session %s); retried with the next one", self.session_id
            )
