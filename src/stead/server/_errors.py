"""Errors as RFC 9457 problem details (`application/problem+json`), each with a stable `code`.

Every error the service returns — its own, a stead error, a validation failure, an unknown route — has the
same shape: `type` (`urn:stead:problem:<code>`), `title`, `status`, `detail`, `code`; validation failures add
`errors` (where and what)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from stead.extend import (
    AgentNotFound,
    Closed,
    ConfigurationError,
    InvalidInput,
    NotFound,
    ProviderError,
    RunNotFound,
    SteadError,
    StoreError,
)
from stead.server._redact import public_text

__all__ = ["PROBLEM", "ApiError", "Problem", "install_handlers", "problem_response"]

log = logging.getLogger("stead.server")

PROBLEM = "application/problem+json"

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable",
}
_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}


class Problem(BaseModel):
    """An RFC 9457 problem: what went wrong, with a stable machine-readable `code`."""

    type: str = Field(description="`urn:stead:problem:<code>`")
    title: str
    status: int
    detail: str
    code: str = Field(description="Stable error code, e.g. `agent_busy`, `id_reused`, `not_found`.")
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="Validation failures: where (`loc`) and what (`msg`)."
    )


class ApiError(Exception):
    """Raised by routes: becomes a problem response with this status and code."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.errors = errors


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:stead:problem:{code}",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM)


def _stead_status(e: SteadError) -> tuple[int, str]:
    if isinstance(e, AgentNotFound | RunNotFound | NotFound):
        return 404, "not_found"
    if isinstance(e, InvalidInput):
        return 422, "invalid_input"
    if isinstance(e, ConfigurationError):
        return 422, "configuration"
    if isinstance(e, Closed):
        return 503, "closing"
    if isinstance(e, StoreError):
        return 503, "store_unavailable"
    if isinstance(e, ProviderError):
        return 502, "provider"
    return 500, "internal"


def caller_detail(exc: SteadError) -> str:
    """What a caller reads of a stead error: its first line (no file's lines quoted after it), a model
    server's answer cut to its status line, absolute server paths reduced to their last part (SEC1b,
    SEC7e); the whole text goes to the log."""
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if first != text.strip():
        log.info("refused with: %s", text)
    return public_text(first) or first


def _clean(errors: list[Any]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": e.get("type")}
        )
    return out


def install_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return problem_response(exc.status, exc.code, exc.detail, headers=exc.headers, errors=exc.errors)

    async def stead_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SteadError)
        status, code = _stead_status(exc)
        if status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        return problem_response(status, code, caller_detail(exc))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _clean(list(exc.errors()))
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        detail = f"{'.'.join(first['loc'])}: {first['msg']}" if first["loc"] else str(first["msg"])
        return problem_response(422, "invalid_request", detail, errors=errors)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _CODES.get(exc.status_code, "error")
        headers = dict(exc.headers) if exc.headers else None
        return problem_response(exc.status_code, code, str(exc.detail), headers=headers)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return problem_response(500, "internal", "the service failed; see its log")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(SteadError, stead_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
