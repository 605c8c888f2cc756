"""Route dependencies: the service behind the app, and who is calling (authentication, scope, rate limit)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stead.server._auth import CSRF_HEADER, SESSION_COOKIE, Principal, retry_after
from stead.server._errors import ApiError, Problem
from stead.server._service import Service

__all__ = ["PROBLEMS", "bearer", "check_throttle", "client_address", "get_service", "problems", "requires"]

bearer = HTTPBearer(auto_error=False, description="A token from the service's token file.")

_DESCRIPTIONS = {
    400: "The request could not be read (an unparsable body).",
    401: "No valid token (the answer carries `WWW-Authenticate: Bearer`).",
    403: "The token lacks the scope this operation needs.",
    404: "No such resource in the caller's tenant.",
    409: "Conflict (`agent_busy`, `agent_exists`, `approval_decided`).",
    413: "The request or message is larger than the limit.",
    422: "The request is malformed (`invalid_request`, `invalid_input`, `id_reused`, `invalid_cursor`).",
    429: "Rate limited (`Retry-After` says when to retry).",
    503: "The service is closing or its store is unavailable.",
}


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses for error statuses (problem details)."""
    return {c: {"model": Problem, "description": _DESCRIPTIONS.get(c, "Error")} for c in codes}


PROBLEMS = problems(400, 401, 403, 422, 429, 503)
"""What any authenticated operation may answer."""


async def get_service(request: Request) -> Service:
    """(async: FastAPI runs plain-function dependencies in a thread pool, a thread hop per request)"""
    service: Service = request.app.state.stead
    return service


def client_address(request: Request) -> str:
    """The peer's address (the key failed token attempts are counted under)."""
    return request.client.host if request.client is not None else "unknown"


def check_throttle(service: Service, request: Request) -> None:
    """429 while the caller's address has used up its failed token attempts (SEC7): no token is even
    looked at, so guessing goes no faster than the throttle."""
    _limited(
        service.auth.throttled(client_address(request)), "too many failed token attempts from this address"
    )


def _limited(wait: float | None, detail: str) -> None:
    """429 `rate_limited` with `Retry-After` when there is a `wait`."""
    if wait is not None:
        raise ApiError(429, "rate_limited", detail, headers={"Retry-After": retry_after(wait)})


def authenticate(
    service: Service, request: Request, credentials: HTTPAuthorizationCredentials | None
) -> Principal:
    auth = service.auth
    if not auth.required:
        return auth.implicit()
    challenge = {"WWW-Authenticate": 'Bearer realm="stead"'}
    check_throttle(service, request)
    if credentials is not None:
        principal = auth.check_secret(credentials.credentials)
        if principal is None:
            auth.failed(client_address(request))
            raise ApiError(
                401,
                "invalid_token",
                "the bearer token is not valid (unknown or expired)",
                headers={"WWW-Authenticate": 'Bearer realm="stead", error="invalid_token"'},
            )
        return principal
    if request.headers.get("authorization"):
        raise ApiError(
            401, "unauthorized", "the Authorization header must be 'Bearer <token>'", headers=challenge
        )
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        principal = auth.session(sid)
        if principal is not None:
            if request.method not in ("GET", "HEAD", "OPTIONS") and request.headers.get(CSRF_HEADER) != "1":
                raise ApiError(403, "csrf", f"a write with the session cookie must send '{CSRF_HEADER}: 1'")
            return principal
    raise ApiError(401, "unauthorized", "this service needs a bearer token", headers=challenge)


def requires(scope: str | None) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the calling principal, which must hold `scope` (None: any) and be within its rate
    limit."""

    async def dependency(
        request: Request,
        service: Annotated[Service, Depends(get_service)],
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        principal = authenticate(service, request, credentials)
        _limited(service.auth.limit(principal), "too many requests for this token")
        if scope is not None and not principal.allows(scope):
            raise ApiError(403, "missing_scope", f"this token lacks the scope {scope!r}")
        return principal

    dependency.__name__ = f"requires_{(scope or 'auth').replace(':', '_')}"
    return dependency
