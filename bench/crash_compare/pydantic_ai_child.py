"""Crash child for Pydantic AI (no persistence); see _crash_common for the protocol.

Pydantic AI keeps a run in memory, so a killed run leaves nothing behind: the application can only
run the user message again from the start. (Its durable-execution integrations — Temporal, DBOS,
Prefect — need those external systems and are not part of this comparison.)
"""

from __future__ import annotations

import asyncio
import json

from _crash_common import CONV, K, Recorder, call_id, parse_args, user_text
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_loop import scripted_response

VARIANTS = ["default"]


async def amain() -> None:
    args = parse_args(VARIANTS)
    rec = Recorder(args.dir, args.phase)

    async def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        response = scripted_response(messages, K)
        part = response.parts[0]
        rec.model_called(int(part.args_as_dict()["a"]) if isinstance(part, ToolCallPart) else K)
        return response

    agent: Agent[None, str] = Agent(FunctionModel(model_fn), instructions="Add things up.")

    @agent.tool_plain
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        await rec.atool_started(call_id(CONV, a), a)
        return a + b

    if args.phase == "run":
        await agent.run(user_text(CONV))
        raise SystemExit("run phase finished without being killed")

    result = await agent.run(user_text(CONV))
    returns = [
        p.tool_call_id
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    print(
        json.dumps(
            {
                "resume": "nothing persisted: agent.run(user message) again from the start",
                "final_output": result.output,
                "user_messages_in_history": 1,
                "tool_results_in_history": len(returns),
                "duplicate_tool_results_in_history": len(returns) - len(set(returns)),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(amain())
