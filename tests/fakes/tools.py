"""Tools the tests share: one that stops for good where its process is killed or its call cancelled
(`hang`, `never_finishing`), and one that delegates to a child agent linked to the calling run
(`delegating_tool`)."""

from __future__ import annotations

import asyncio
from typing import Any

import stead
from stead.observability import PARENT_KEY, traceparent_for_call

__all__ = ["delegating_tool", "hang", "never_finishing"]

TIMEOUT = 5.0


async def hang(started: asyncio.Event) -> None:
    """Where a tool call stops for good: set `started`, then wait for ever — until the call is cancelled (an
    abort) or its process dies (`crash`)."""
    started.set()
    await asyncio.Event().wait()


def never_finishing(name: str = "wait_forever") -> tuple[stead.Tool, asyncio.Event]:
    """A tool `name` (no arguments) whose calls never finish by themselves (`hang`), and the event set when
    one has started."""
    started = asyncio.Event()

    async def call() -> str:
        await hang(started)
        return "unreachable"

    return stead.tool(name=name, description="Never finishes by itself.")(call), started


def delegating_tool(holder: dict[str, Any], *, traced: bool = False) -> stead.Tool:
    """A `delegate(question)` tool: sends the question to agent `holder["child"]` of `holder["system"]`,
    linked to the calling run and step (`PARENT_KEY`; `traced`: with the call's span as `traceparent`,
    checked to be there), waits for it to settle and returns its last text."""

    @stead.tool
    async def delegate(ctx: stead.ToolContext, question: str) -> str:
        "Ask the child agent."
        system: stead.AgentSystem = holder["system"]
        child = await system.get(holder["child"])
        link = {"run_id": ctx.run_id, "step_id": ctx.call_id, "agent_id": ctx.agent_id}
        if traced:
            link["traceparent"] = traceparent_for_call(ctx.call_id)
            assert link["traceparent"] is not None
        await child.send(question, metadata={PARENT_KEY: link})
        await child.wait_idle(timeout=TIMEOUT)
        return (await child.history())[-1].text

    return delegate
