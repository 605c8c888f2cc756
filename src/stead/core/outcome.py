"""How a run ended: one typed value that every layer reads instead of decoding strings.

The kernel decides the outcome at settlement and carries it on the `Settled` event, on the settle hooks
(`HookContext.outcome`), and in the history's end-of-run record; records, tracing and delegation read it
from there. `AWAITING_INPUT` is not an end: it is what `agent.run` returns (and run records show) for a run
that has nothing left to do but wait for decisions on held tool calls (human approvals); the run goes on
once they are decided. Code that maps an outcome must not assume that these values are all.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Outcome"]


class Outcome(StrEnum):
    """The end of a run. A `str` enum: `Outcome.COMPLETED == "completed"`."""

    COMPLETED = "completed"
    """The model gave its final answer and nothing was left to do."""
    FAILED = "failed"
    """The last turn failed (a provider error, a guardrail refusing the inference, ...)."""
    CANCELLED = "cancelled"
    """The run was aborted (`agent.abort()`)."""
    AWAITING_INPUT = "awaiting_input"
    """The run waits for decisions on held tool calls (approvals); it has not ended."""
