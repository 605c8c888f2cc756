"""Time for the session runner, injectable: narration pacing and usage debouncing are tested with a fake
clock instead of sleeps."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds (monotonic)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
