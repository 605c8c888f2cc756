"""Transcripts: one row per turn, written in order by one writer task per session.

The first interim piece of a turn creates its row (`in_progress`, the text so far); later interims change
nothing in the store (they would cost a write each); the final text completes the row (`complete`,
`ended_at`) — or creates it complete when no interim came; a cancelled response completes its open rows with
the text said so far. Rows get `seq` in creation order, and one writer
task serializes the writes, so the rows of each role keep their order. `drain()` waits (bounded) for the
queued writes: a stop loses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from stead.extend import Store
from stead.realtime._protocol import Transcript

__all__ = ["TranscriptWriter"]

log = logging.getLogger("stead.realtime")


@dataclass
class _Open:
    seq: int
    text: str


class TranscriptWriter:
    def __init__(self, store: Store, session_id: str, next_seq: int = 1) -> None:
        self.store = store
        self.session_id = session_id
        self._seq = next_seq
        self._open: dict[tuple[str, str], _Open] = {}
        self._queue: asyncio.Queue[Transcript | str | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.writes = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(self, t: Transcript) -> None:
        if t.text or t.final:
            self._queue.put_nowait(t)

    def complete_open(self, role: str) -> None:
        """Complete every open turn of `role` with its text so far (a response that was cancelled)."""
        self._queue.put_nowait(role)

    async def drain(self, timeout: float = 5.0) -> None:
        """Write everything queued so far, then stop (at most `timeout` seconds)."""
        if self._task is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        if not self._task.done():
            self._task.cancel()
        self._task = None

    async def _run(self) -> None:
        while True:
            t = await self._queue.get()
            if t is None:
                return
            try:
                if isinstance(t, str):
                    for (role, item), row in list(self._open.items()):
                        if role == t:
                            await self._write(Transcript(role, item, row.text, True))  # type: ignore[arg-type]
                    continue
                await self._write(t)
            except Exception:
                log.exception("writing a transcript turn failed (session %s)", self.session_id)

    async def _write(self, t: Transcript) -> None:
        key = (t.role, t.item_id)
        now = time.time()
        row = self._open.get(key)
        if not t.final:
            if row is not None:
                row.text += t.text
                return
            seq = self._seq
            async with self.store.transaction() as tx:
                await tx.execute(
                    "INSERT INTO realtime_transcripts(session_id, seq, role, text, status, item_id, "
                    "audio_start_ms, started_at) VALUES (?, ?, ?, ?, 'in_progress', ?, ?, ?)",
                    (self.session_id, seq, t.role, t.text, t.item_id, t.audio_start_ms, now),
                )
            self._seq += 1
            self.writes += 1
            self._open[key] = _Open(seq, t.text)
            return
        if row is not None:
            async with self.store.transaction() as tx:
                await tx.execute(
                    "UPDATE realtime_transcripts SET text = ?, status = 'complete', ended_at = ?, "
                    "audio_end_ms = ? WHERE session_id = ? AND seq = ?",
                    (t.text or row.text, now, t.audio_end_ms, self.session_id, row.seq),
                )
            del self._open[key]
            self.writes += 1
            return
        if not t.text:
            return
        seq = self._seq
        async with self.store.transaction() as tx:
            await tx.execute(
                "INSERT INTO realtime_transcripts(session_id, seq, role, text, status, item_id, "
                "audio_start_ms, audio_end_ms, started_at, ended_at) "
                "VALUES (?, ?, ?, ?, 'complete', ?, ?, ?, ?, ?)",
                (self.session_id, seq, t.role, t.text, t.item_id, t.audio_start_ms, t.audio_end_ms, now, now),
            )
        self._seq += 1
        self.writes += 1
