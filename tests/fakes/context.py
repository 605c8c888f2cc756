"""Helpers for context-management tests: a tool loop with large results on a scripted model that
reports no usage (so stead estimates it), writes summaries for compaction requests, and refuses requests
larger than its window like a real server.

    model = WindowModel(window=3000)
    system = await stead.open(url, providers={"m": model.provider}, tools=[fetch])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import stead
from stead._tokens import estimate_messages, estimate_text, estimate_tools
from stead.providers.scripted import ScriptedProvider, ScriptedResponse

__all__ = ["BIG", "WindowModel", "fetch", "request_tokens", "stored", "tool_pairs_ok"]

BIG = 1500
"""Characters of each `fetch` result."""


@stead.tool
async def fetch(n: int) -> str:
    "Fetch page n (a large result)."
    body = f"page {n}: " + " ".join(f"word{n}x{i}" for i in range(BIG // 8))
    return body[:BIG]


def request_tokens(request: stead.ProviderRequest) -> int:
    """What the fake server counts for a request (the same estimate stead uses)."""
    return (
        estimate_text(request.instructions)
        + estimate_tools(request.tools)
        + estimate_messages(request.messages)
    )


@dataclass
class WindowModel:
    """A scripted model: `rounds` fetch calls per user message, then an answer; summaries for compaction
    requests; a `context_length_exceeded` error for any request over `window` tokens (when `enforce`)."""

    window: int = 3000
    rounds: int = 12
    enforce: bool = True
    summary_error: str | None = None
    summaries: list[stead.ProviderRequest] = field(default_factory=list)
    turns: list[stead.ProviderRequest] = field(default_factory=list)
    largest: int = 0
    overflows: int = 0
    provider: ScriptedProvider = field(init=False)

    def __post_init__(self) -> None:
        self.provider = ScriptedProvider(self.respond)

    def respond(self, request: stead.ProviderRequest) -> ScriptedResponse:
        size = request_tokens(request)
        if self.enforce and size > self.window:
            self.overflows += 1
            return ScriptedResponse(
                error=f"context too long: This model's maximum context length is {self.window} tokens. "
                f"However, your messages resulted in {size} tokens (context_length_exceeded)",
            )
        self.largest = max(self.largest, size)
        if request.purpose == "compaction":
            self.summaries.append(request)
            if self.summary_error is not None:
                return ScriptedResponse(error=self.summary_error)
            body = request.messages[-1].text
            return ScriptedResponse(
                blocks=[stead.Text(f"summary #{len(self.summaries)} of {len(body)} characters")],
                report_usage=False,
            )
        self.turns.append(request)
        # the position comes from the last call's argument (kept after a compaction), not from counting
        # the results still in the context
        n = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            calls = [b for b in m.content if isinstance(b, stead.ToolCall)]
            if calls and isinstance(calls[-1].arguments, dict):
                n = int(calls[-1].arguments.get("n", 0)) + 1
                break
        if n < self.rounds:
            return ScriptedResponse(blocks=[stead.ToolCall("fetch", {"n": n})], report_usage=False)
        return ScriptedResponse(blocks=[stead.Text(f"done after {n} fetches")], report_usage=False)


async def stored(
    system: stead.AgentSystem, agent_id: str
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(current history records, archive rows) as stored."""
    async with system.store.transaction() as tx:
        current = [json.loads(r) for r in await tx.load(agent_id)]
        archive = await tx.load_archive(agent_id)
    return current, archive


def tool_pairs_ok(records: list[dict[str, Any]]) -> bool:
    """Every tool result's call is in `records` before it, and every call has exactly one result."""
    calls: list[str] = []
    results: list[str] = []
    for rec in records:
        if rec["k"] == "b" and rec["b"]["t"] == "c":
            calls.append(rec["b"]["i"])
        elif rec["k"] == "t":
            if rec["b"]["i"] not in calls:
                return False
            results.append(rec["b"]["i"])
    return sorted(calls) == sorted(results) and len(set(results)) == len(results)
