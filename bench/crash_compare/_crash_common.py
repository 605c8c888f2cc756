"""Shared helpers for the crash-comparison children (stdlib only).

Protocol between ``bench/crash_compare/run.py`` (the parent) and a child:

- the child is started as ``python CHILD --phase run|resume --dir DIR [--variant V]``;
- every tool-body start appends ``"<phase> tool <call_id>"`` to ``DIR/effects.log`` and fsyncs it,
  *before* the side effect would happen; in phase ``run`` the body of the 3rd call (round 2) then
  sleeps, waiting to be killed;
- every model call appends ``"<phase> model <rounds_seen>"`` to ``DIR/model.log`` and fsyncs it
  (``rounds_seen`` = tool results the model was shown for the current user message);
- the parent SIGKILLs the ``run`` child once ``effects.log`` shows the 3rd call started, then runs the
  ``resume`` child, which resumes the conversation the way the framework recommends and prints one
  JSON line describing how (``{"resume": ..., "final_output": ..., ...}``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

# The scripted models and texts of the benchmark workloads live in bench/peers; children import
# this module first (it sorts first), which makes those modules importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))

from _common import call_id, final_text, user_text

__all__ = ["CONV", "KILL_ROUND", "K", "Recorder", "call_id", "final_text", "parse_args", "user_text"]

K = 5
KILL_ROUND = 2  # 0-based: the 3rd of the K tool calls
CONV = "conv-crash"
HANG_SECONDS = 60.0


def parse_args(variants: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["run", "resume"], required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--variant", choices=variants, default=variants[0])
    return parser.parse_args()


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Recorder:
    def __init__(self, directory: Path, phase: str) -> None:
        self.dir = directory
        self.phase = phase

    def model_called(self, rounds_seen: int) -> None:
        _append(self.dir / "model.log", f"{self.phase} model {rounds_seen}")

    def tool_started(self, call_id: str, round_no: int) -> None:
        """Log the call (fsynced); in the first life, hang inside the 3rd call until killed."""
        _append(self.dir / "effects.log", f"{self.phase} tool {call_id}")
        if self._hang(round_no):
            time.sleep(HANG_SECONDS)
            raise SystemExit("was not killed")

    async def atool_started(self, call_id: str, round_no: int) -> None:
        """Like :meth:`tool_started`, hanging without blocking the event loop."""
        _append(self.dir / "effects.log", f"{self.phase} tool {call_id}")
        if self._hang(round_no):
            await asyncio.sleep(HANG_SECONDS)
            raise SystemExit("was not killed")

    def _hang(self, round_no: int) -> bool:
        return self.phase == "run" and round_no == KILL_ROUND
