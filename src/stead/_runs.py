"""`stead.Run` and `stead.Step`: the public view of run records, and the seam that reads them.

The records themselves are written by a plugin (`stead.observability`, on by default); the kernel tier only
knows their shape, so `system.runs()` / `system.run(id)` can be offered without the system importing the
layer that writes them: the system asks the first plugin that is a `RunReader`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stead._scope import AgentScope

__all__ = ["Run", "RunReader", "Step", "run_json", "step_json"]


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


def run_json(run: Run) -> dict[str, Any]:
    """A run as callers read it, without its steps and children: the one JSON form of a run, which the HTTP
    service answers (its error made public) and `stead runs --json` prints a part of. `usage_estimated` and
    `usage_unknown` say how far its tokens are known (see `Run`)."""
    return {
        "id": run.id,
        "agent_id": run.agent_id,
        "agent_name": run.agent_name,
        "parent_run_id": run.parent_run_id,
        "parent_step_id": run.parent_step_id,
        "status": run.status,
        "started_at": run.started_at,
        "completed_at": run.completed_at,
        "duration": run.duration,
        "error": run.error,
        "final_message": run.final_message,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cached_tokens": run.cached_tokens,
        "cost": run.cost,
        "own_input_tokens": run.own_input_tokens,
        "own_output_tokens": run.own_output_tokens,
        "own_cost": run.own_cost,
        "iterations": run.iterations,
        "restarts": run.restarts,
        "breadcrumb": run.breadcrumb,
        "usage_estimated": run.usage_estimated,
        "usage_unknown": run.usage_unknown,
    }


def step_json(step: Step) -> dict[str, Any]:
    """A step as callers read it: the one JSON form of a step (see `run_json`)."""
    return {
        "id": step.id,
        "run_id": step.run_id,
        "number": step.number,
        "type": step.type,
        "name": step.name,
        "status": step.status,
        "started_at": step.started_at,
        "completed_at": step.completed_at,
        "duration": step.duration,
        "target": step.target,
        "target_run_id": step.target_run_id,
        "error": step.error,
        "input": step.input,
        "output": step.output,
    }


@runtime_checkable
class RunReader(Protocol):
    """A plugin that can read run records back (`system.runs()`, `system.run(id)`)."""

    async def runs(self, agent_id: str | None = None, limit: int = 50) -> list[Run]: ...

    async def runs_page(
        self,
        *,
        agent_id: str | None = None,
        status: str | None = None,
        parent_run_id: str | None = None,
        roots: bool = False,
        before: tuple[float, str] | None = None,
        limit: int = 50,
        scope: AgentScope | None = None,
    ) -> list[Run]:
        """At most `limit` runs of agents that exist, newest first (by start time, then id), without steps
        or children, strictly before the cursor `before` = `(started_at, id)` of the last one a caller saw;
        filtered by agent, status, parent run (`roots`: only runs without one) and `scope` (the service's
        tenant, `AgentScope`). A running run's totals are summed from its steps so far."""
        ...

    async def run(self, run_id: str) -> Run: ...
