"""The real-process kill driver: a child script runs part of a test and is killed with SIGKILL at a chosen
point, synchronized on the marker lines it prints (one a line, flushed); the test then reopens the database
in its own process and checks what the next owner finds.

    markers = await run_and_kill(Path(W.__file__), db, "durable", until="TOOL")
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["ROOT", "TIMEOUT", "run_and_kill"]

ROOT = Path(__file__).resolve().parents[2]
"""The project root: the child's working directory (it imports `stead` and `tests` from there)."""
TIMEOUT = 30
"""Seconds to wait for each marker line."""


async def run_and_kill(
    worker: Path,
    *args: str | Path,
    until: str | Callable[[list[str]], bool],
    kill: bool = True,
    timeout: float = TIMEOUT,
) -> list[str]:
    """Start `python WORKER ARGS...` in the project root, read its markers until one starts with `until`
    (or, given a function, until `until(markers)` holds), SIGKILL it, and check that it died of SIGKILL.
    With `kill=False` the child kills itself after that marker and this only waits for it (it is killed
    here only if it never got there). Returns the markers read."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(worker),
        *map(str, args),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    markers: list[str] = []
    reached = False
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            assert line, f"the child exited early (markers so far: {markers})"
            markers.append(line.decode().strip())
            if until(markers) if callable(until) else markers[-1].startswith(until):
                reached = True
                break
    finally:
        if proc.returncode is None and (kill or not reached):
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return markers
