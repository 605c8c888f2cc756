"""`create_app(system)`: the FastAPI application over an open `AgentSystem` that has the `ServerPlugin`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import stead
from stead.extend import AgentSystem, ConfigurationError
from stead.server._auth import Auth, Token, load_tokens
from stead.server._errors import PROBLEM, install_handlers, problem_response
from stead.server._events_schema import event_schema
from stead.server._guard import LOOPBACK_HOSTS, UI_HEADERS, HostOriginGuard
from stead.server._plugin import ServerPlugin
from stead.server._routes_agents import router as agents_router
from stead.server._routes_approvals import off_router as approvals_off_router
from stead.server._routes_approvals import router as approvals_router
from stead.server._routes_ops import STATIC, ui_router
from stead.server._routes_ops import router as ops_router
from stead.server._routes_runs import events_router
from stead.server._routes_runs import router as runs_router
from stead.server._service import Service, ServiceConfig, approvals_offered

__all__ = ["create_app"]

_DESCRIPTION = """\
Durable agents over HTTP. Every write returns after its durable commit; message ids (or the
`Idempotency-Key` header) make retries safe; event streams resume by sequence number (`Last-Event-ID` or
`?after=`). Errors are RFC 9457 problem details with a stable `code`. Every resource belongs to the
caller's tenant: another tenant's id is 404. See docs/server.md."""


class _BodyLimit:
    """413 for a request body over `limit` bytes, before the route runs (declared or streamed length);
    408 for a body that takes longer than `timeout` seconds to arrive (SEC6a)."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = 30.0) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._refuse(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        try:
            async with asyncio.timeout(self.timeout):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body = message.get("body", b"")
                    size += len(body)
                    if size > self.limit:
                        await self._refuse(scope, receive, send)
                        return
                    chunks.append(body)
                    more = message.get("more_body", False)
        except TimeoutError:
            slow = problem_response(408, "request_timeout", f"the request body took over {self.timeout:g} s")
            slow.headers["Connection"] = "close"
            await slow(scope, receive, send)
            return
        data = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(413, "payload_too_large", f"the request body is over {self.limit} bytes")
        await response(scope, receive, send)


class _UiHeaders:
    """CSP, `frame-ancestors 'none'` and friends on the viewer's page and assets (SEC7c)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == "/ui" or path.startswith("/ui/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in UI_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(
    system: AgentSystem,
    *,
    auth: Auth | None = None,
    tokens: str | os.PathLike[str] | list[Token] | None = None,
    heartbeat: float = 15.0,
    retry_ms: int = 2000,
    max_body_bytes: int | None = None,
    ui: bool = True,
    close_system: bool = False,
    allow_models: Sequence[str] = (),
    allowed_hosts: Iterable[str] | None = None,
    max_streams: int = 1000,
    max_streams_per_token: int = 100,
    docs: bool = False,
    body_timeout: float = 30.0,
) -> FastAPI:
    """The HTTP service for `system`, which must have been opened with a `ServerPlugin`
    (`stead.server.open(url, ...)` does that).

    Authentication: `auth` (an `Auth`), or `tokens` (a token file path, or a list of `Token`s); none of
    them: one implicit tenant, no authentication — keep such a service on loopback. `heartbeat` seconds of
    silence send `: ping` on streams; `max_body_bytes` (default: the system's payload limit plus room for
    the envelope) bounds request bodies (413). `close_system=True`: the app closes the system when it
    shuts down.

    Security (docs/security.md): `allow_models` — patterns of model strings with a base URL or a scripted
    file that callers may use (none by default); `allowed_hosts` — the `Host` names served (default
    without tokens: localhost, 127.0.0.1, ::1, plus these; with tokens: any, unless given); at most
    `max_streams` event streams open, `max_streams_per_token` per token (429 beyond); `docs=True` serves
    `/docs` (Swagger UI, whose script and style come from a CDN: off by default); a request body that takes
    over `body_timeout` seconds to arrive is 408.

    The approval routes (`/v1/approvals...`) are served when the system keeps approvals (the policy
    plugin: `approvals=True`, or definitions); otherwise they are absent from the schema and answer 404
    `approvals_off`."""
    if not system.has_plugin(ServerPlugin.name):
        raise ConfigurationError(
            "create_app needs a system opened with the server plugin: "
            "stead.server.open(url, ...) or stead.open(url, plugins=[stead.server.ServerPlugin()])"
        )
    plugin = system.plugin(ServerPlugin.name)
    assert isinstance(plugin, ServerPlugin)
    if auth is None:
        if tokens is None:
            auth = Auth()
        elif isinstance(tokens, list):
            auth = Auth(tokens)
        else:
            auth = load_tokens(Path(tokens))
    limit = max_body_bytes if max_body_bytes is not None else system.admission.max_payload_bytes + 64 * 1024
    config = ServiceConfig(
        heartbeat,
        retry_ms,
        limit,
        allow_models=tuple(allow_models),
        max_streams=max_streams,
        max_streams_per_token=max_streams_per_token,
    )
    service = Service(system, plugin, auth, config)
    extra_hosts = {h.strip().lower().strip("[]") for h in allowed_hosts or ()}
    hosts = (
        frozenset(LOOPBACK_HOSTS | extra_hosts)
        if not auth.required
        else (frozenset(extra_hosts) if allowed_hosts is not None else None)
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            plugin.hub.close()  # end every stream: nothing waits on a stream that never ends
            if close_system:
                await system.close()

    app = FastAPI(
        title="stead",
        version=stead.__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url="/docs" if docs else None,
        redoc_url=None,
    )
    app.state.stead = service
    install_handlers(app)
    app.include_router(ops_router)
    app.include_router(agents_router)
    app.include_router(runs_router)
    app.include_router(approvals_router if approvals_offered(system) else approvals_off_router)
    app.include_router(events_router)
    if ui:
        app.include_router(ui_router)
        app.mount("/ui/assets", StaticFiles(directory=STATIC), name="ui-assets")
    app.add_middleware(_BodyLimit, limit=limit, timeout=body_timeout)
    app.add_middleware(_UiHeaders)
    app.add_middleware(HostOriginGuard, hosts=hosts)  # outermost: before anything reads the request
    _custom_openapi(app)
    return app


def _custom_openapi(app: FastAPI) -> None:
    """Error answers are `application/problem+json`; the stream schemas are components."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        for path in schema.get("paths", {}).values():
            for op in path.values():
                for status, response in op.get("responses", {}).items():
                    content = response.get("content")
                    if content and status.isdigit() and int(status) >= 400 and "application/json" in content:
                        content[PROBLEM] = content.pop("application/json")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        event, defs = event_schema()
        components.update(defs)
        components["AgentEvent"] = event
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
