"""A scripted MCP server over streamable HTTP for tests/mcp: `python http_server.py PORT [AUTHORIZATION]`
serves `http://127.0.0.1:PORT/mcp`. With AUTHORIZATION, every HTTP request without exactly that
`Authorization` header is refused (401) before the MCP server sees it. Tools: `echo` returns its arguments,
`authorization` the `Authorization` header its own request carried, `slow` answers after the given
seconds, `stall` never answers (it waits on an event nobody sets)."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.responses import PlainTextResponse

server = MCPServer("web", log_level="WARNING")


@server.tool()
def echo(text: str, n: int = 1) -> str:
    """Echo the arguments back, as JSON."""
    return json.dumps({"text": text, "n": n}, sort_keys=True)


@server.tool()
def authorization(ctx: Context) -> str:
    """The Authorization header of this call's HTTP request."""
    headers = ctx.headers or {}
    return headers.get("authorization", "(none)")


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after `seconds`, sending nothing meanwhile."""
    await anyio.sleep(seconds)
    return f"slept {seconds:g}"


@server.tool()
async def stall() -> str:
    """Never answers."""
    await anyio.Event().wait()
    return "unreachable"


def require(expected: str, app: Any) -> Any:
    """`app` behind a check of the Authorization header."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope["headers"]).get(b"authorization", b"").decode()
            if got != expected:
                await PlainTextResponse(f"bad authorization {got!r}", status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    port = int(sys.argv[1])
    app: Any = server.streamable_http_app(host="127.0.0.1")
    if len(sys.argv) > 2:
        app = require(sys.argv[2], app)
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()
