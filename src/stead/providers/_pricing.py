"""What a model costs: `Prices` (USD per million tokens) and the cost of one inference.

Shared by the model catalog (which lists prices) and the drivers (which fill `Usage.cost` with them), so
neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from stead.messages import Usage

__all__ = ["Prices"]


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens. Cached input (prompt-cache reads) costs `input` when `cached_input` is None."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, usage: Usage) -> float:
        """The cost of one inference: cached input at the cached rate, the rest of the input at `input`."""
        cached = max(0, min(usage.cached_tokens, usage.input_tokens))
        fresh = usage.input_tokens - cached
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (fresh * self.input + cached * cached_rate + usage.output_tokens * self.output) / 1_000_000
