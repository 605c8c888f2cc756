"""Ctrl-C and SIGTERM for commands that run agents.

The first Ctrl-C (or a SIGTERM from `docker stop` / systemd) drains: the agent stops at its next safe point
— the model response or tool call in progress finishes first — and everything accepted stays durable; the
command then exits 130 (143 for SIGTERM) naming the agent to continue. A second Ctrl-C exits at once: the
store is transactional, so stopping mid-step loses nothing that was committed (it is a `kill -9`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable
from typing import Protocol

__all__ = ["SIGINT_EXIT", "SIGTERM_EXIT", "Stopper"]

SIGINT_EXIT = 130
SIGTERM_EXIT = 143


class _Notes(Protocol):
    def note(self, text: str, style: str = "dim") -> None: ...


class Stopper:
    """Turns the first Ctrl-C or SIGTERM into a drain request (`stopping`, `until`), a second Ctrl-C into an
    immediate exit."""

    def __init__(self, notes: _Notes) -> None:
        self.notes = notes
        self.code = 0
        self.agent_id: str | None = None
        self._event = asyncio.Event()
        self._installed: list[int] = []

    @property
    def stopping(self) -> bool:
        return self._event.is_set()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig, code in ((signal.SIGINT, SIGINT_EXIT), (signal.SIGTERM, SIGTERM_EXIT)):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.signal, code)
                self._installed.append(sig)

    def remove(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in self._installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        self._installed.clear()

    def signal(self, code: int) -> None:
        """What a signal does (called by the loop)."""
        if self.stopping:
            if code == SIGINT_EXIT:
                self.force_exit()
            return
        self.code = code
        self._event.set()
        who = f"agent {self.agent_id}" if self.agent_id else "the agent"
        what = "Ctrl-C" if code == SIGINT_EXIT else "SIGTERM"
        self.notes.note(
            f"{what}: stopping {who} at its next safe point (the model response or tool call in progress "
            "finishes first; nothing accepted is lost). Press Ctrl-C again to exit at once.",
            "yellow",
        )

    def force_exit(self) -> None:
        agent = f" --agent {self.agent_id}" if self.agent_id else ""
        self.notes.note(
            f"exiting at once; accepted work is durable: continue it with{agent or ' --agent ID'}", "yellow"
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(SIGINT_EXIT)

    async def until(self, work: Awaitable[None]) -> None:
        """Wait for `work`, or until a stop was requested."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
