"""Routes: human approvals — list, one, decide (once).

Included only when the system keeps approvals (`approvals_offered`: the policy plugin is loaded, by
`stead.open(approvals=True)` or definitions). Without it the paths are absent from OpenAPI and answer 404
`approvals_off` (`off_router`), so a client learns why instead of guessing at a typo.

Reading needs `runs:read` (approvals are part of what a run is waiting on); deciding needs
`approvals:decide`. Every approval belongs to its agent's tenant: another tenant's id is 404.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query

from stead.extend import Approval
from stead.server._auth import Principal
from stead.server._deps import PROBLEMS, get_service, problems, requires
from stead.server._errors import ApiError
from stead.server._models import ApprovalList, ApprovalOut, DecisionIn, DecisionOut
from stead.server._service import Service

__all__ = ["approval_out", "off_router", "router"]

router = APIRouter(prefix="/v1", tags=["approvals"], responses=PROBLEMS)
off_router = APIRouter(prefix="/v1", include_in_schema=False)

ApprovalId = Annotated[str, Path(description="The approval's id.", max_length=128)]
Svc = Annotated[Service, Depends(get_service)]
Read = Annotated[Principal, Depends(requires("runs:read"))]
Decide = Annotated[Principal, Depends(requires("approvals:decide"))]


def approval_out(a: Approval) -> ApprovalOut:
    return ApprovalOut(
        id=a.id,
        agent_id=a.agent_id,
        run_id=a.run_id,
        root_run_id=a.root_run_id,
        call_id=a.call_id,
        tool=a.tool,
        arguments=a.arguments,
        effects=a.effects,
        destructive=a.destructive,
        mode=a.mode,
        reason=a.reason,
        status=a.status,
        note=a.note,
        edited_arguments=a.edited_arguments,
        decided_by=a.decided_by,
        created_at=a.created_at,
        decided_at=a.decided_at,
        expires_at=a.expires_at,
    )


@router.get("/approvals", operation_id="listApprovals", response_model=ApprovalList, summary="List approvals")
async def list_approvals(
    principal: Read,
    service: Svc,
    status: Annotated[
        Literal["pending", "decided", "all"],
        Query(description="`pending` (default), `decided` (approved, rejected, expired, cancelled), `all`."),
    ] = "pending",
    agent_id: Annotated[str | None, Query(max_length=128)] = None,
    root_run_id: Annotated[
        str | None,
        Query(
            max_length=128,
            description="Everything a root run waits on: its own approvals and its sub-agents'.",
        ),
    ] = None,
    after: Annotated[
        str | None, Query(description="`next_cursor` of the previous page.", max_length=400)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> ApprovalList:
    """The tenant's approvals, oldest first (cursor pagination on creation time and id)."""
    items, nxt = await service.list_approvals(
        principal, status=status, agent_id=agent_id, root_run_id=root_run_id, after=after, limit=limit
    )
    return ApprovalList(items=[approval_out(a) for a in items], next_cursor=nxt)


@router.get(
    "/approvals/{approval_id}",
    operation_id="getApproval",
    response_model=ApprovalOut,
    responses=problems(404),
    summary="Get an approval",
)
async def get_approval(approval_id: ApprovalId, principal: Read, service: Svc) -> ApprovalOut:
    return approval_out(await service.approval(principal, approval_id))


@router.post(
    "/approvals/{approval_id}/decision",
    operation_id="decideApproval",
    response_model=DecisionOut,
    responses=problems(404, 409),
    summary="Approve or deny a pending approval (decide once)",
)
async def decide_approval(
    approval_id: ApprovalId, body: DecisionIn, principal: Decide, service: Svc
) -> DecisionOut:
    """Returns after the decision's commit. `approve`: the held call runs once (with `edited_arguments`
    when given, validated first: 422 `invalid_input`). `deny`: its error result "rejected by reviewer:
    <reason>" commits with the decision. The first decision wins: the same decision again is 200 with the
    stored one (`decided: false`); another one is 409 `approval_decided`."""
    outcome = await service.decide(principal, approval_id, body.decision, body.reason, body.edited_arguments)
    return DecisionOut(approval=approval_out(outcome.approval), decided=outcome.decided)


_OFF = "approvals are off in this service: open the system with approvals=True (or with definitions)"


@off_router.get("/approvals")
@off_router.get("/approvals/{approval_id}")
@off_router.post("/approvals/{approval_id}/decision")
async def approvals_off(principal: Annotated[Principal, Depends(requires(None))]) -> None:
    """Authenticated like the real routes (a caller without a token learns nothing), then says why."""
    raise ApiError(404, "approvals_off", _OFF)
