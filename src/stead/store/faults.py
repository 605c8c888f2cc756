"""Fault injection for stores: crash at the N-th operation, or fail transiently at random.

Tests and the chaos harness use this to make a real store die between any two operations. After a crash
the store is dead for good (every later operation raises `StoreCrashed`), the open transaction is rolled
back, and the database file and its lock are released, exactly as if the process had been killed.
"""

from __future__ import annotations

import random

from stead.errors import StoreCrashed, StoreError

__all__ = ["Faults"]


class Faults:
    """A fault plan. `crash_at=N` kills the store at its N-th operation (0-based); `flaky=p` makes each
    operation fail transiently with probability p (seeded by `seed`)."""

    def __init__(self, *, crash_at: int | None = None, flaky: float = 0.0, seed: int = 0) -> None:
        self.crash_at = crash_at
        self.flaky = flaky
        self.ops = 0
        self.crashed = False
        self.transient_failures = 0
        self._rng = random.Random(seed)

    def check(self, op: str) -> None:
        """Called by the store before every operation; raises to inject a fault."""
        if self.crashed:
            raise StoreCrashed(f"store crashed (injected) before {op}")
        n = self.ops
        self.ops += 1
        if self.crash_at is not None and n >= self.crash_at:
            self.crashed = True
            raise StoreCrashed(f"store crashed (injected) at operation {n}: {op}")
        if self.flaky and self._rng.random() < self.flaky:
            self.transient_failures += 1
            raise StoreError(f"transient store failure (injected) at operation {n}: {op}")
