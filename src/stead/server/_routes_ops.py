"""Routes: health and readiness, browser sessions, the run viewer's page and assets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import FileResponse, RedirectResponse

from stead.server._auth import SESSION_COOKIE, Principal
from stead.server._deps import check_throttle, client_address, get_service, problems, requires
from stead.server._errors import ApiError
from stead.server._models import Health, SessionIn, SessionOut
from stead.server._service import Service

__all__ = ["STATIC", "router", "ui_router"]

STATIC = Path(__file__).parent / "static"

router = APIRouter(prefix="/v1", tags=["service"])
ui_router = APIRouter(include_in_schema=False)
Svc = Annotated[Service, Depends(get_service)]
Anyone = Annotated[Principal, Depends(requires(None))]


@router.get("/healthz", operation_id="healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get(
    "/readyz", operation_id="readyz", response_model=Health, responses=problems(503), summary="Readiness"
)
async def readyz(service: Svc) -> Health:
    """The store answers a read, the system accepts work and the event hub runs."""
    if service.system.closing or service.plugin.hub.closed:
        raise ApiError(503, "closing", "the service is shutting down")
    async with service.store.transaction() as tx:
        await tx.fetch("SELECT 1")
    return Health(
        status="ok", checks={"store": "ok", "events": "ok", "streams": str(service.plugin.hub.subscribers())}
    )


def _session_out(service: Service, principal: Principal) -> SessionOut:
    return SessionOut(
        tenant=principal.tenant, scopes=sorted(principal.scopes), auth_required=service.auth.required
    )


@router.post(
    "/sessions",
    operation_id="createSession",
    status_code=201,
    response_model=SessionOut,
    responses={
        200: {"model": SessionOut, "description": "No tokens are configured: no session needed."},
        **problems(400, 401, 422, 429),
    },
    summary="Trade a token for a browser session cookie",
)
async def create_session(body: SessionIn, request: Request, response: Response, service: Svc) -> SessionOut:
    """The viewer posts a token once and gets an HttpOnly, SameSite=Strict `stead_session` cookie, so
    streams (`EventSource`) authenticate without a token in the URL. Writes with the cookie must send
    `X-Stead-Request: 1`."""
    auth = service.auth
    if not auth.required:
        response.status_code = 200
        return _session_out(service, auth.implicit())
    check_throttle(service, request)
    opened = auth.open_session(body.token)
    if opened is None:
        auth.failed(client_address(request))
        raise ApiError(
            401,
            "invalid_token",
            "the token is not valid",
            headers={"WWW-Authenticate": 'Bearer realm="stead"'},
        )
    sid, principal = opened
    response.set_cookie(
        SESSION_COOKIE,
        sid,
        max_age=int(auth.session_seconds),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return _session_out(service, principal)


@router.get(
    "/session",
    operation_id="getSession",
    response_model=SessionOut,
    responses=problems(401, 429),
    summary="Who the caller is",
)
async def get_session(principal: Anyone, service: Svc) -> SessionOut:
    return _session_out(service, principal)


@router.delete("/session", operation_id="deleteSession", status_code=204, summary="End the browser session")
async def delete_session(request: Request, service: Svc) -> Response:
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        service.auth.close_session(sid)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@ui_router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui")


@ui_router.get("/ui")
async def ui() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})
