"""Narration: spoken progress of running delegations, paced and deduplicated.

Progress items come from the run records of each delegation's child run tree (`system.run(child_run_id)`:
the tool and sub-agent steps of the child and its own children), one item per step start and per sub-agent
finish. The `Narrator` buffers new items (deduplicated; at most `max_items`, the oldest dropped) and releases
one digest when it is due: no earlier than `first_after` seconds (5) after the first item of a burst, and at
least `every` seconds (8) after the previous spoken update. A digest equal to the previous one is not
spoken again. Barge-in clears the buffer. Time comes from the session's clock, so pacing is tested with a
fake one.
"""

from __future__ import annotations

from collections.abc import Iterable

from stead.definitions import NarrationSettings
from stead.extend import Run

__all__ = ["Narrator", "progress_items"]


class Narrator:
    def __init__(self, settings: NarrationSettings) -> None:
        self.settings = settings
        self.buffer: list[str] = []
        self.seen: set[str] = set()
        self.burst_started: float | None = None
        self.last_spoken: float | None = None
        self.last_digest: str | None = None
        self.spoken = 0

    def add(self, item: str, now: float) -> None:
        if not self.settings.enabled or item in self.seen:
            return
        self.seen.add(item)
        self.buffer.append(item)
        if len(self.buffer) > self.settings.max_items:
            del self.buffer[0]
        if self.burst_started is None:
            self.burst_started = now

    def due(self, now: float) -> str | None:
        """The digest to speak now, or None (nothing new, or too early)."""
        if not self.buffer or self.burst_started is None:
            return None
        if now - self.burst_started < self.settings.first_after:
            return None
        if self.last_spoken is not None and now - self.last_spoken < self.settings.every:
            return None
        digest = "; ".join(self.buffer)
        self.buffer.clear()
        self.burst_started = None
        if digest == self.last_digest:
            return None
        self.last_digest = digest
        self.last_spoken = now
        self.spoken += 1
        return digest

    def clear(self) -> None:
        self.buffer.clear()
        self.burst_started = None


def _walk(run: Run) -> Iterable[tuple[Run, int]]:
    stack = [(run, 0)]
    while stack:
        r, depth = stack.pop(0)
        yield r, depth
        stack.extend((c, depth + 1) for c in r.children)


def progress_items(run: Run) -> list[tuple[str, str]]:
    """(key, text) progress items of a child run tree: each tool or sub-agent step that started, and each
    sub-agent step that finished. Keys identify an item across polls."""
    out: list[tuple[str, str]] = []
    for r, _ in _walk(run):
        who = r.agent_name or "the agent"
        for step in r.steps:
            if step.type == "tool":
                out.append((f"{step.id}:start", f"{who} is using {step.target}"))
            elif step.type == "sub_agent":
                out.append((f"{step.id}:start", f"{who} asked {step.target} for help"))
                if step.status == "completed":
                    out.append((f"{step.id}:done", f"{step.target} reported back to {who}"))
    return out
