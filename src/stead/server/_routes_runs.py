"""Routes: runs (list, one, steps, tree) and the event streams (an agent's, one run's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from stead.extend import Run, Step, run_json, step_json
from stead.server._auth import Principal
from stead.server._deps import PROBLEMS, get_service, problems, requires
from stead.server._models import RunList, RunOut, RunTree, StepList, StepOut
from stead.server._redact import public_text
from stead.server._service import Service
from stead.server._stream import event_stream, parse_cursor

__all__ = ["events_router", "router"]

router = APIRouter(prefix="/v1", tags=["runs"], responses=PROBLEMS)
events_router = APIRouter(prefix="/v1", tags=["events"], responses=PROBLEMS)

RunId = Annotated[str, Path(description="The run's id.", max_length=128)]
AgentId = Annotated[str, Path(description="The agent's id.", max_length=128)]
Svc = Annotated[Service, Depends(get_service)]
Runs = Annotated[Principal, Depends(requires("runs:read"))]
Read = Annotated[Principal, Depends(requires("agents:read"))]
RunStatus = Literal["running", "completed", "failed", "cancelled", "awaiting_input"]


def step_out(s: Step) -> StepOut:
    return StepOut(**{**step_json(s), "error": public_text(s.error)})


def run_fields(r: Run) -> dict[str, Any]:
    """The run's JSON (`run_json`: the one form, also `stead runs --json`'s) with its error made public."""
    return {**run_json(r), "error": public_text(r.error)}


def run_tree(r: Run) -> RunTree:
    return RunTree(
        **run_fields(r), steps=[step_out(s) for s in r.steps], children=[run_tree(c) for c in r.children]
    )


@router.get("/runs", operation_id="listRuns", response_model=RunList, summary="List runs")
async def list_runs(
    principal: Runs,
    service: Svc,
    agent_id: Annotated[str | None, Query(max_length=128)] = None,
    status: RunStatus | None = None,
    parent_run_id: Annotated[str | None, Query(max_length=128)] = None,
    roots: Annotated[bool, Query(description="Only runs without a parent (not delegations).")] = False,
    after: Annotated[
        str | None, Query(description="`next_cursor` of the previous page.", max_length=400)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> RunList:
    """The tenant's runs, newest first, without steps (cursor pagination on start time and id)."""
    items, nxt = await service.list_runs(
        principal,
        agent_id=agent_id,
        status=status,
        parent_run_id=parent_run_id,
        roots=roots,
        after=after,
        limit=limit,
    )
    return RunList(items=[RunOut.model_validate(i) for i in items], next_cursor=nxt)


@router.get(
    "/runs/{run_id}",
    operation_id="getRun",
    response_model=RunOut,
    responses=problems(404),
    summary="Get a run",
)
async def get_run(run_id: RunId, principal: Runs, service: Svc) -> RunOut:
    return RunOut(**run_fields(await service.run(principal, run_id)))


@router.get(
    "/runs/{run_id}/steps",
    operation_id="listRunSteps",
    response_model=StepList,
    responses=problems(404),
    summary="A run's steps",
)
async def list_run_steps(run_id: RunId, principal: Runs, service: Svc) -> StepList:
    run = await service.run(principal, run_id)
    return StepList(items=[step_out(s) for s in run.steps])


@router.get(
    "/runs/{run_id}/tree",
    operation_id="getRunTree",
    response_model=RunTree,
    responses=problems(404),
    summary="A run with its steps and child runs, recursively",
)
async def get_run_tree(run_id: RunId, principal: Runs, service: Svc) -> RunTree:
    return run_tree(await service.run(principal, run_id))


_SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A Server-Sent Event stream (see docs/server.md for every event type).",
        "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/AgentEvent"}}},
    }
}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID", description="Resume after this event id (sent by EventSource).", max_length=64
    ),
]


class SlotResponse(StreamingResponse):
    """A stream that gives its slot back when it ends, however it ends (its body may never start: a
    client gone before the first byte)."""

    def __init__(self, release: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        self._release = release
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            release()
            raise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


@events_router.get(
    "/agents/{agent_id}/events",
    operation_id="streamAgentEvents",
    response_class=StreamingResponse,
    responses={**_SSE, **problems(404)},
    summary="Stream an agent's events (SSE, resumable)",
)
async def stream_agent_events(
    agent_id: AgentId,
    principal: Read,
    service: Svc,
    last_event_id: LastEventId = None,
    after: Annotated[int | None, Query(ge=0, description="Replay events after this seq, then live.")] = None,
    deltas: Annotated[bool, Query(description="Also send token deltas (live only, never stored).")] = False,
) -> StreamingResponse:
    """`Last-Event-ID` or `?after=SEQ` resumes (`?after=0`: everything retained); no cursor: live only."""
    await service.agent(principal, agent_id)
    cursor, mid_block = parse_cursor(last_event_id, after)
    config = service.config
    release = service.streams.take(principal)
    frames = event_stream(
        service,
        agent_id,
        after=cursor,
        mid_block=mid_block,
        deltas=deltas,
        heartbeat=config.heartbeat,
        retry_ms=config.retry_ms,
    )
    return SlotResponse(release, frames, media_type="text/event-stream", headers=_SSE_HEADERS)


@events_router.get(
    "/runs/{run_id}/events",
    operation_id="streamRunEvents",
    response_class=StreamingResponse,
    responses={**_SSE, **problems(404)},
    summary="Stream one run's events (SSE, resumable; ends with `done`)",
)
async def stream_run_events(
    run_id: RunId,
    principal: Runs,
    service: Svc,
    last_event_id: LastEventId = None,
    after: Annotated[int | None, Query(ge=0, description="Replay events after this seq (default 0).")] = None,
    deltas: bool = False,
) -> StreamingResponse:
    """The run's events from its start (or the cursor), then live, then `event: done` after it settles."""
    run = await service.run(principal, run_id)
    cursor, mid_block = parse_cursor(last_event_id, after)
    config = service.config
    release = service.streams.take(principal)
    frames = event_stream(
        service,
        run.agent_id,
        after=0 if cursor is None else cursor,
        mid_block=mid_block,
        deltas=deltas,
        run_id=run.id,
        run_settled=run.status not in ("running", "awaiting_input"),
        heartbeat=config.heartbeat,
        retry_ms=config.retry_ms,
    )
    return SlotResponse(release, frames, media_type="text/event-stream", headers=_SSE_HEADERS)
