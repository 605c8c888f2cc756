"""A scripted MCP server over stdio for tests/mcp: `echo` answers, `die` kills the server process in the
middle of the call (no answer ever comes), `count` says how many times this process started (from a file
named by the first argument)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

STARTS = Path(sys.argv[1]) if len(sys.argv) > 1 else None
if STARTS is not None:
    with STARTS.open("a") as f:
        f.write(f"{os.getpid()}\n")

server = MCPServer("dying")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo {text}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False))
def die(text: str) -> str:
    """Kill the server in the middle of the call."""
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def starts() -> int:
    """How many times a server process started."""
    return len(STARTS.read_text().splitlines()) if STARTS is not None else 0


if __name__ == "__main__":
    server.run("stdio")
