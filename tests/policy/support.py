"""Shared pieces of the policy tests: tools of every declaration, a responder that calls the tools a
message names, and a system with approvals on."""

from __future__ import annotations

from collections import Counter
from typing import Any

import stead
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 10.0
ran: Counter[str] = Counter()
"""Tool name → how many times its body ran (reset by each test that reads it)."""


@stead.tool(effects="read")
async def read_file(path: str) -> str:
    "Read a file."
    ran["read_file"] += 1
    return f"contents of {path}"


@stead.tool(effects="write")
async def write_file(path: str, text: str = "x") -> str:
    "Write a file in the workspace."
    ran["write_file"] += 1
    return f"wrote {path}"


@stead.tool
async def fetch(url: str) -> str:
    "Fetch a URL (declares nothing: counts as external)."
    ran["fetch"] += 1
    return f"fetched {url}"


@stead.tool(effects="write", destructive=True)
async def delete_file(path: str) -> str:
    "Delete a file."
    ran["delete_file"] += 1
    return f"deleted {path}"


@stead.tool(effects="read", approval="always")
async def peek(path: str) -> str:
    "Read a file, always with approval."
    ran["peek"] += 1
    return f"peeked {path}"


@stead.tool(effects="external", approval="never")
async def ping(host: str) -> str:
    "Ping a host (never asks)."
    ran["ping"] += 1
    return f"pong {host}"


TOOLS = [read_file, write_file, fetch, delete_file, peek, ping]
NAMES = [t.name for t in TOOLS]
ARGS: dict[str, dict[str, Any]] = {
    "read_file": {"path": "a.txt"},
    "write_file": {"path": "a.txt"},
    "fetch": {"url": "http://example.invalid"},
    "delete_file": {"path": "a.txt"},
    "peek": {"path": "a.txt"},
    "ping": {"host": "localhost"},
}


def respond(request: stead.ProviderRequest) -> list[stead.Block]:
    """`call T1 T2 ...` → one response calling those tools (in parallel), then a text answer listing the
    results; any other message → a text answer."""
    last_user = next(m for m in reversed(request.messages) if m.role == "user")
    if request.messages[-1].role == "tool":
        outputs = [b.output for b in request.messages[-1].content if isinstance(b, stead.ToolResult)]
        return [stead.Text("results: " + " | ".join(outputs))]
    words = last_user.text.split()
    if words and words[0] == "call":
        return [stead.ToolCall(name, dict(ARGS.get(name, {}))) for name in words[1:]]
    return [stead.Text(f"answer to {last_user.text}")]


class EventLog(stead.Hooks):
    """Every approval event, in order (an observing hook: it sees what `agent.events()` sees)."""

    def __init__(self) -> None:
        self.events: list[stead.ApprovalRequested | stead.ApprovalDecided] = []

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        if isinstance(event, stead.ApprovalRequested | stead.ApprovalDecided):
            self.events.append(event)


def open_system(url: str, **kwargs: Any) -> stead.system.Opening:
    kwargs.setdefault("approvals", True)
    return stead.open(url, providers={"scripted": ScriptedProvider(respond)}, tools=TOOLS, **kwargs)


def results(history: list[stead.Message]) -> dict[str, tuple[str, bool]]:
    """Tool name → (output, is_error) of each call in the history (by the call's tool name)."""
    names = {b.id: b.name for m in history for b in m.content if isinstance(b, stead.ToolCall)}
    return {
        names[b.call_id]: (b.output, b.is_error)
        for m in history
        for b in m.content
        if isinstance(b, stead.ToolResult)
    }
