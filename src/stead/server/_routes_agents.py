"""Routes: agents, messages (send, steer, batch), history, the unconsumed queue, abort."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from stead.extend import Agent
from stead.server._auth import Principal
from stead.server._deps import PROBLEMS, get_service, problems, requires
from stead.server._errors import ApiError
from stead.server._models import (
    AbortOut,
    Accepted,
    AgentList,
    AgentOut,
    AgentSummary,
    BatchAccepted,
    BatchIn,
    BatchResult,
    CreateAgent,
    MessageIn,
    MessageList,
    MessageOut,
    QueuedOut,
    QueueOut,
)
from stead.server._redact import public_model
from stead.server._service import Service
from stead.server._wire import block_json, message_json

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["agents"], responses=PROBLEMS)

AgentId = Annotated[str, Path(description="The agent's id.", max_length=128)]
Svc = Annotated[Service, Depends(get_service)]
Read = Annotated[Principal, Depends(requires("agents:read"))]
Write = Annotated[Principal, Depends(requires("agents:write"))]
Send = Annotated[Principal, Depends(requires("messages:write"))]


async def agent_out(service: Service, agent: Agent, tenant: str) -> AgentOut:
    config = agent.config
    head, _ = await service.head(agent.id)
    definition = config.extra.get("stead.definition")
    return AgentOut(
        id=agent.id,
        name=agent.name,
        tenant=tenant,
        state=agent.state,
        active=agent.active,
        created_at=await _created_at(service, agent.id),
        provider=config.provider,
        model=public_model(config.model),
        instructions=config.instructions,
        tools=list(config.tools),
        definition=definition if isinstance(definition, str) else None,
        settings={k: public_model(v) if k == "model" else v for k, v in agent.settings.items()},
        event_seq=head,
    )


async def _created_at(service: Service, agent_id: str) -> float:
    async with service.store.transaction() as tx:
        row = await tx.get_agent(agent_id)
    return row.created_at if row is not None else 0.0


@router.post(
    "/agents",
    operation_id="createAgent",
    status_code=201,
    response_model=AgentOut,
    responses={
        200: {"model": AgentOut, "description": "The agent existed (same id, same body)."},
        **problems(409, 413),
    },
    summary="Create an agent",
)
async def create_agent(body: CreateAgent, response: Response, principal: Write, service: Svc) -> AgentOut:
    """From a definition (`{"definition": NAME, "data": {...}}`) or from settings. With an `id`: the same id
    and body again is 200 with the agent; the same id with another body is 409 `agent_exists`."""
    agent, created = await service.create_agent(principal, body)
    if not created:
        response.status_code = 200
    return await agent_out(service, agent, principal.tenant)


@router.get("/agents", operation_id="listAgents", response_model=AgentList, summary="List agents")
async def list_agents(
    principal: Read,
    service: Svc,
    after: Annotated[
        str | None, Query(description="`next_cursor` of the previous page.", max_length=400)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> AgentList:
    """The tenant's agents, oldest first (cursor pagination on creation time and id)."""
    items, nxt = await service.list_agents(principal, after, limit)
    return AgentList(
        items=[AgentSummary(id=i, name=n, active=a, created_at=c) for i, n, c, a in items], next_cursor=nxt
    )


@router.get(
    "/agents/{agent_id}",
    operation_id="getAgent",
    response_model=AgentOut,
    responses=problems(404),
    summary="Get an agent",
)
async def get_agent(agent_id: AgentId, principal: Read, service: Svc) -> AgentOut:
    agent = await service.agent(principal, agent_id)
    return await agent_out(service, agent, principal.tenant)


@router.delete(
    "/agents/{agent_id}",
    operation_id="deleteAgent",
    status_code=204,
    responses=problems(404, 409),
    summary="Delete an agent",
)
async def delete_agent(
    agent_id: AgentId,
    principal: Write,
    service: Svc,
    abort: Annotated[bool, Query(description="Abort its current turn first if it is working.")] = False,
) -> Response:
    """Remove the agent with its history, queue and events. A working agent is 409 `agent_busy` unless
    `?abort=true`."""
    await service.delete_agent(principal, agent_id, abort)
    return Response(status_code=204)


@router.post(
    "/agents/{agent_id}/messages",
    operation_id="postMessage",
    status_code=202,
    response_model=Accepted,
    responses={
        200: {"model": Accepted, "description": "A retry: this id was accepted before."},
        **problems(404, 409, 413),
    },
    summary="Send or steer a message",
)
async def post_message(
    agent_id: AgentId,
    body: MessageIn,
    response: Response,
    principal: Send,
    service: Svc,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", description="The message id, if the body has none.", max_length=128),
    ] = None,
) -> Accepted:
    """Accept one message (returns after the durable commit). 202 `created:true`; a repeated id is 200
    `created:false`; the same id with another body is 422 `id_reused`; `if_busy: reject` on a busy agent
    is 409 `agent_busy`."""
    message_id = body.id
    if idempotency_key is not None:
        if message_id is not None and message_id != idempotency_key:
            raise ApiError(422, "id_mismatch", "the body's id and the Idempotency-Key header differ")
        message_id = idempotency_key
    agent = await service.agent(principal, agent_id)
    outcome = await service.deliver(principal, agent, [(body, message_id)], body.if_busy)
    (acc,) = outcome.acceptances
    if not acc.created:
        response.status_code = 200
    return Accepted(
        message_id=acc.id,
        created=acc.created,
        mode=acc.delivery,
        agent_state=agent.state,
        events_after=outcome.events_after,
    )


@router.post(
    "/agents/{agent_id}/messages:batch",
    operation_id="postMessages",
    status_code=202,
    response_model=BatchAccepted,
    responses={
        200: {"model": BatchAccepted, "description": "Every message was a retry."},
        **problems(404, 409, 413),
    },
    summary="Deliver several messages at once (all or none)",
)
async def post_messages(
    agent_id: AgentId, body: BatchIn, response: Response, principal: Send, service: Svc
) -> BatchAccepted:
    agent = await service.agent(principal, agent_id)
    outcome = await service.deliver(principal, agent, [(m, m.id) for m in body.messages], body.if_busy)
    if not outcome.created_any:
        response.status_code = 200
    return BatchAccepted(
        messages=[
            BatchResult(message_id=a.id, created=a.created, mode=a.delivery) for a in outcome.acceptances
        ],
        agent_state=agent.state,
        events_after=outcome.events_after,
    )


@router.get(
    "/agents/{agent_id}/messages",
    operation_id="listMessages",
    response_model=MessageList,
    responses=problems(404),
    summary="The conversation history",
)
async def list_messages(
    agent_id: AgentId,
    principal: Read,
    service: Svc,
    after: Annotated[
        int | None, Query(ge=-1, description="Messages after this index (-1 or none: from the start).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> MessageList:
    """The stored conversation, in order (user and system input, assistant messages, tool results)."""
    agent = await service.agent(principal, agent_id)
    history = await agent.history()
    start = 0 if after is None else after + 1
    page = history[start : start + limit]
    items = [MessageOut.model_validate(message_json(m, start + i)) for i, m in enumerate(page)]
    nxt = start + len(page) - 1 if start + len(page) < len(history) else None
    return MessageList(items=items, next_cursor=nxt)


@router.get(
    "/agents/{agent_id}/queue",
    operation_id="listQueue",
    response_model=QueueOut,
    responses=problems(404),
    summary="The unconsumed queue",
)
async def list_queue(agent_id: AgentId, principal: Read, service: Svc) -> QueueOut:
    """Accepted messages the agent has not consumed yet, in the order it will take them."""
    agent = await service.agent(principal, agent_id)
    items = []
    for q in await agent.queued():
        content = (
            [block_json(b) for b in q.content]
            if not isinstance(q.content, str)
            else [{"type": "text", "text": q.content}]
        )
        items.append(
            QueuedOut.model_validate(
                {
                    "id": q.id,
                    "mode": q.delivery,
                    "role": q.role,
                    "content": content,
                    "metadata": q.metadata,
                    "settings": q.settings,
                }
            )
        )
    return QueueOut(items=items)


@router.post(
    "/agents/{agent_id}/abort",
    operation_id="abortAgent",
    status_code=202,
    response_model=AbortOut,
    responses=problems(404),
    summary="Abort the current turn",
)
async def abort_agent(agent_id: AgentId, principal: Send, service: Svc) -> AbortOut:
    """Cancel the current turn and settle (X1); queued messages stay queued. Idempotent: aborting an idle
    agent is a no-op. Returns once the abort has committed."""
    agent = await service.agent(principal, agent_id)
    await agent.abort()
    head, _ = await service.head(agent.id)
    return AbortOut(agent_state=agent.state, events_after=head)
