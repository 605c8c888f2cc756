"""Crash child for stead; see _crash_common for the protocol.

stead needs no resume code: opening the store restores every agent that owes work. The interrupted call
of the default (non-durable) tool is not run again; it gets an in-doubt error result that the model sees.
"""

from __future__ import annotations

import asyncio
import json

from _crash_common import CONV, K, Recorder, call_id, parse_args, user_text

import stead
from stead.providers.scripted import ScriptedProvider

VARIANTS = ["default"]
AGENT_ID = "crashcompareagent0000001"


async def amain() -> None:
    args = parse_args(VARIANTS)
    rec = Recorder(args.dir, args.phase)

    @stead.tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        await rec.atool_started(call_id(CONV, a), a)
        return a + b

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        rounds = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            if m.role == "tool":
                rounds += 1
        rec.model_called(rounds)
        if rounds < K:
            return [stead.ToolCall("add", {"a": rounds, "b": 1})]
        return [stead.Text(f"The answer is {K}.")]

    url = f"sqlite:///{args.dir / 'stead.db'}"
    system = await stead.open(url, providers={"scripted": ScriptedProvider(respond)}, tools=[add])
    if args.phase == "run":
        agent = await system.create(provider="scripted", model="scripted", tools=["add"], agent_id=AGENT_ID)
        await agent.send(user_text(CONV))
        await agent.wait_idle()
        raise SystemExit("run phase finished without being killed")
    agent = await system.get(AGENT_ID)
    restored = AGENT_ID in system.restored
    await agent.wait_idle()
    history = await agent.history()
    await system.close()
    results = [b for m in history if m.role == "tool" for b in m.content if isinstance(b, stead.ToolResult)]
    ids = [r.call_id for r in results]
    print(
        json.dumps(
            {
                "resume": f"stead.open() restored the agent (restored={restored}); no resume code",
                "final_output": history[-1].text if history else None,
                "user_messages_in_history": sum(1 for m in history if m.role == "user"),
                "tool_results_in_history": len(results),
                "duplicate_tool_results_in_history": len(ids) - len(set(ids)),
                "in_doubt_results": sum(1 for r in results if r.is_error),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(amain())
