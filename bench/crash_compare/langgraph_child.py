"""Crash child for LangGraph (SqliteSaver checkpointer); see _crash_common for the protocol.

Resume, as LangGraph documents for a thread interrupted by a failure: ``graph.invoke(None, config)``
with the same ``thread_id`` continues from the last saved checkpoint (the pending ``tools`` step).
If no checkpoint exists (``durability="exit"`` saves only when the invoke returns), the only way on
is to send the user message again.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from typing import Any

from _crash_common import CONV, K, Recorder, call_id, parse_args, user_text
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph_loop import ScriptedChatModel, scripted_reply

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

VARIANTS = ["sync", "async", "exit"]


def main() -> None:
    args = parse_args(VARIANTS)
    rec = Recorder(args.dir, args.phase)

    class CrashModel(ScriptedChatModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **kw: Any) -> ChatResult:
            reply = scripted_reply(messages, self.k)
            rec.model_called(reply.tool_calls[0]["args"]["a"] if reply.tool_calls else self.k)
            return ChatResult(generations=[ChatGeneration(message=reply)])

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        rec.tool_started(call_id(CONV, a), a)
        return a + b

    conn = sqlite3.connect(args.dir / "langgraph.db", check_same_thread=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(CrashModel(k=K), [add], checkpointer=SqliteSaver(conn))
    config: Any = {"configurable": {"thread_id": CONV}, "recursion_limit": 4 * K + 10}
    durability: Any = args.variant
    if args.phase == "run":
        graph.invoke({"messages": [HumanMessage(user_text(CONV))]}, config, durability=durability)
        raise SystemExit("run phase finished without being killed")

    state = graph.get_state(config)
    if state.next:
        how = f"graph.invoke(None, config): resumed from the last checkpoint, next={list(state.next)}"
        result = graph.invoke(None, config, durability=durability)
    elif not state.values.get("messages"):
        how = "no checkpoint for the thread: sent the user message again"
        result = graph.invoke({"messages": [HumanMessage(user_text(CONV))]}, config, durability=durability)
    else:
        how = "thread already finished"
        result = state.values
    messages = result["messages"]
    tool_ids = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    last = messages[-1]
    print(
        json.dumps(
            {
                "resume": how,
                "final_output": last.content if isinstance(last, AIMessage) else None,
                "user_messages_in_history": sum(isinstance(m, HumanMessage) for m in messages),
                "tool_results_in_history": len(tool_ids),
                "duplicate_tool_results_in_history": len(tool_ids) - len(set(tool_ids)),
            }
        )
    )


if __name__ == "__main__":
    main()
