"""Crash child for the OpenAI Agents SDK (SQLiteSession); see _crash_common for the protocol.

``SQLiteSession`` is conversation memory: the run loop's own state (``RunState``) is saved only if
the application serializes it at an interruption (e.g. a tool approval), so after a crash there is
nothing to resume from. The closest continuation is a new ``Runner.run`` on the same session with
no new input: the model is shown the stored history and asked again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from _crash_common import CONV, K, Recorder, call_id, parse_args, user_text
from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem
from agents.usage import Usage
from openai_agents_loop import ScriptedModel, scripted_output

VARIANTS = ["default"]


async def amain() -> None:
    args = parse_args(VARIANTS)
    rec = Recorder(args.dir, args.phase)
    set_tracing_disabled(True)

    class CrashModel(ScriptedModel):
        async def get_response(
            self, system_instructions: str | None, input: str | list[TResponseInputItem], *a: Any, **kw: Any
        ) -> ModelResponse:
            output = scripted_output(input, self.k)
            first = output[0]
            rec.model_called(json.loads(first.arguments)["a"] if first.type == "function_call" else self.k)
            return ModelResponse(output=output, usage=Usage(), response_id=None)

    @function_tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        await rec.atool_started(call_id(CONV, a), a)
        return a + b

    agent = Agent(name="crash", instructions="Add things up.", model=CrashModel(K), tools=[add])
    session = SQLiteSession(CONV, args.dir / "agents.db")
    if args.phase == "run":
        await Runner.run(agent, user_text(CONV), session=session, max_turns=K + 5)
        raise SystemExit("run phase finished without being killed")

    stored = await session.get_items()
    how = (
        f"Runner.run(agent, [], session=session) on the stored history ({len(stored)} items); "
        "no run state to resume"
    )
    result = await Runner.run(agent, [], session=session, max_turns=K + 5)
    items: list[dict[str, Any]] = [dict(i) for i in await session.get_items()]
    session.close()
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    users = [i for i in items if i.get("role") == "user"]
    print(
        json.dumps(
            {
                "resume": how,
                "final_output": result.final_output,
                "user_messages_in_history": len(users),
                "tool_results_in_history": len(outputs),
                "duplicate_tool_results_in_history": len(outputs) - len(set(outputs)),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(amain())
