"""`stead.server`: the HTTP service — REST, resumable SSE, tokens and tenants, OpenAPI, and a run viewer.

    pip install 'stead[server]'

    system = await stead.server.open("sqlite:///app.db", definitions="agents/")
    app = stead.server.create_app(system, tokens="tokens.yaml")   # a FastAPI app
    await stead.server.serve(app, host="127.0.0.1", port=8000)      # or any ASGI server

or from the command line: `stead serve --db app.db --definitions agents/ --tokens tokens.yaml`.
Routes, events and the token file: docs/server.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stead.extend import AgentSystem, Plugin
from stead.server._app import create_app
from stead.server._auth import (
    SCOPES,
    Auth,
    Principal,
    RateLimit,
    TenantPolicy,
    Token,
    hash_token,
    load_tokens,
)
from stead.server._plugin import DURABLE_EVENTS, LIVE_EVENTS, ServerPlugin
from stead.server._run import Server, serve

__all__ = [
    "DURABLE_EVENTS",
    "LIVE_EVENTS",
    "SCOPES",
    "Auth",
    "Principal",
    "RateLimit",
    "Server",
    "ServerPlugin",
    "TenantPolicy",
    "Token",
    "create_app",
    "hash_token",
    "load_tokens",
    "open",
    "serve",
]


async def open(
    url: str = "sqlite:///stead.db",
    *,
    plugins: Sequence[Plugin] = (),
    server: ServerPlugin | None = None,
    **kwargs: Any,
) -> AgentSystem:
    """`stead.open(url, ...)` with a `ServerPlugin` added (or the one given as `server=`)."""
    import stead

    extra = [p for p in plugins]
    if not any(isinstance(p, ServerPlugin) for p in extra):
        extra.append(server if server is not None else ServerPlugin())
    return await stead.open(url, plugins=extra, **kwargs)
