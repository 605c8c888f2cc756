"""`stead.Approval` and `stead.Decision`: the public view of human approvals, and the seam that serves them.

The approvals themselves are kept by a plugin (`stead.policy`, enabled by `stead.open(approvals=True)` or by
definitions); the kernel tier only knows their shape, so `system.approvals()`, `system.approve()`,
`system.reject()` and `agent.approvals()` can be offered without the system importing the layer that
keeps them: the system asks the first plugin that is an `ApprovalSource`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from stead._scope import AgentScope

__all__ = ["APPROVAL_STATUSES", "Approval", "ApprovalSource", "ApprovalStatus", "Decision"]

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled"]
APPROVAL_STATUSES: tuple[ApprovalStatus, ...] = ("pending", "approved", "rejected", "expired", "cancelled")


@dataclass(frozen=True, slots=True)
class Approval:
    """One request for a human decision on one tool call.

    The call has not started while `status` is `pending`, so it can never be in doubt. `root_run_id` is the
    run of the root agent of the delegation tree (the run itself for a root agent), so one query lists
    everything a request waits on. `arguments` are the model's; `edited_arguments` the reviewer's, when
    the call was approved with changes. `reason` says why the policy asked."""

    id: str
    agent_id: str
    run_id: str
    root_run_id: str
    call_id: str
    tool: str
    arguments: Any
    effects: str
    destructive: bool
    mode: str
    """The permission mode the call was dispatched under."""
    reason: str
    status: ApprovalStatus
    note: str | None
    edited_arguments: Any
    decided_by: str | None
    created_at: float
    decided_at: float | None
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class Decision:
    """What `system.approve` / `system.reject` did: `decided` is False when the approval had been decided
    before (the first decision wins); `approval` is then the stored one, with its status and note."""

    approval: Approval
    decided: bool

    @property
    def status(self) -> ApprovalStatus:
        return self.approval.status


@runtime_checkable
class ApprovalSource(Protocol):
    """A plugin that keeps approvals (`system.approvals()`, `system.approve()`, `system.reject()`)."""

    async def approvals(
        self,
        status: ApprovalStatus | None = "pending",
        agent_id: str | None = None,
        root_run_id: str | None = None,
    ) -> list[Approval]: ...

    async def approvals_page(
        self,
        *,
        status: Literal["pending", "decided"] | None = None,
        agent_id: str | None = None,
        root_run_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int = 50,
        scope: AgentScope | None = None,
    ) -> list[Approval]:
        """At most `limit` approvals of agents that exist, oldest first (by creation time, then id),
        strictly after the cursor `after` = `(created_at, id)` of the last one a caller saw. `status`:
        `pending`, `decided` (any other status) or None (all); `scope`: only approvals of its agents (the
        service's tenant, `AgentScope`)."""
        ...

    async def approval(self, approval_id: str) -> Approval: ...

    async def approval_for_call(self, call_id: str) -> Approval | None:
        """The approval asked for the tool call `call_id`, or None. Inside a transaction of the system's
        store (a `*_tx` hook), it reads in that transaction."""
        ...

    async def approve(
        self,
        approval_id: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        decided_by: str | None = None,
    ) -> Decision: ...

    async def reject(
        self, approval_id: str, *, note: str | None = None, decided_by: str | None = None
    ) -> Decision: ...
