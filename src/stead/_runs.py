"""`stead.Run` and `stead.Step`: the public view of run records, and the seam that reads them.

The records themselves are written by a plugin (`stead.observability`, on by default); the kernel tier only
knows their shape, so `system.runs()` / `system.run(id)` can be offered without the system importing the
layer that writes them: the system asks the first plugin that is a `RunReader`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Run", "RunReader", "Step"]


@dataclass(frozen=True, slots=True)
class Step:
    """One observable unit of a run: a prompt (inference), a tool call, a sub-agent delegation, a guardrail…

    `number` counts 1, 2, 3… within the run; `name` carries the agent hierarchy breadcrumb
    (`orchestrator → researcher: search`); `target` is the tool name or the model; `target_run_id` is the
    child run of a `sub_agent` step; `target_log_id` the prompt run of a `prompt` step (its own id, the
    inference id). `input`/`output` are the decoded JSON (tool arguments, tool output, a prompt's finish
    reason and usage).
    """

    id: str
    run_id: str
    number: int
    type: str
    name: str | None
    status: str
    started_at: float
    completed_at: float | None
    target: str | None
    target_run_id: str | None
    target_log_id: str | None
    parent_step_id: str | None
    error: str | None
    input: Any
    output: Any

    @property
    def duration(self) -> float | None:
        """Seconds from start to completion (None while running)."""
        return None if self.completed_at is None else self.completed_at - self.started_at


@dataclass(frozen=True, slots=True)
class Run:
    """One active period of an agent, from activation to settlement.

    `input_tokens`, `output_tokens`, `cached_tokens` and `cost` include the run's descendants (rolled up when
    each child run settles); the `own_*` fields are this run's inferences alone. `steps` and `children` are
    filled by `system.run(id)` (recursively); `system.runs()` returns runs without them."""

    id: str
    agent_id: str
    agent_name: str | None
    parent_run_id: str | None
    parent_step_id: str | None
    session_id: str | None
    conversation_id: str | None
    status: str
    started_at: float
    completed_at: float | None
    error: str | None
    final_message: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float
    own_input_tokens: int
    own_output_tokens: int
    own_cached_tokens: int
    own_cost: float
    iterations: int
    restarts: int
    breadcrumb: str | None
    usage_estimated: bool = False
    """Some of the run's own usage is stead's estimate (the server reported none): shown as `~1,234`."""
    usage_unknown: bool = False
    """The run made requests but none reported or estimated usage (e.g. all failed): shown as `?`."""
    steps: list[Step] = field(default_factory=list)
    children: list[Run] = field(default_factory=list)

    @property
    def duration(self) -> float | None:
        return None if self.completed_at is None else self.completed_at - self.started_at

    def walk(self) -> list[Run]:
        """This run and all its descendants, depth first."""
        out = [self]
        for c in self.children:
            out.extend(c.walk())
        return out


@runtime_checkable
class RunReader(Protocol):
    """A plugin that can read run records back (`system.runs()`, `system.run(id)`)."""

    async def runs(self, agent_id: str | None = None, limit: int = 50) -> list[Run]: ...

    async def run(self, run_id: str) -> Run: ...
