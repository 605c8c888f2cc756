"""Expiration (issue 10 §4, after MemberJunction): old tool results leave the provider context as stubs
the model can expand again.

With `ContextPolicy.expire_tool_results_after_turns = N`, a tool result older than N responses is shown
to the model as its first 500 characters and a note naming the built-in `recall_tool_result(call_id)`
tool, which returns the whole result (from the history or, after a compaction, from the archive). The
stored history is not changed: expiration is a pure function of the committed records, so a live and a
restarted process send the same context (R4). The cache-stable prefix — the instructions, injected
context and the first request (every message before the first response) — never expires.
"""

from __future__ import annotations

import json

from stead.core.records import ResultRecord, decode_record, full_records
from stead.core.state import RECALL
from stead.messages import Message, ToolResult
from stead.tools._tool import Tool, tool
from stead.tools.context import ToolContext

__all__ = ["RECALL_TOOL", "expire", "recall_tool"]

RECALL_TOOL = RECALL
KEEP_CHARS = 500


def expire(messages: list[Message], after_turns: int) -> list[Message]:
    """The provider context with tool results older than `after_turns` responses stubbed."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    out = list(messages)
    later = 0  # responses after the message being looked at
    for i in range(len(messages) - 1, first, -1):
        m = messages[i]
        if m.role == "assistant":
            later += 1
        elif m.role == "tool" and later > after_turns:
            blocks = [_stub(b) if isinstance(b, ToolResult) else b for b in m.content]
            if any(a is not b for a, b in zip(blocks, m.content, strict=True)):
                out[i] = Message(m.role, blocks, id=m.id, usage=m.usage, metadata=m.metadata)
    return out


def _stub(result: ToolResult) -> ToolResult:
    n = len(result.output)
    if n <= KEEP_CHARS + 80:
        return result
    note = (
        f"…[expired: {n - KEEP_CHARS:,} more characters; "
        f'{RECALL_TOOL}(call_id="{result.call_id}") shows the whole result]'
    )
    return ToolResult(result.call_id, result.output[:KEEP_CHARS] + note, result.is_error)


async def _recall(call_id: str, ctx: ToolContext) -> str:
    """Show the whole result of an earlier tool call whose result was shortened (expired or compacted).

    Args:
        call_id: The id of the tool call whose result to show.
    """
    async with ctx.store.transaction() as tx:
        current = [json.loads(r) for r in await tx.load(ctx.agent_id)]
        archive = await tx.load_archive(ctx.agent_id)
    for raw in reversed(full_records(archive, current)):
        rec = decode_record(raw)
        if isinstance(rec, ResultRecord) and rec.result.call_id == call_id and rec.cut is None:
            return rec.result.output
    raise LookupError(f"no tool result with call id {call_id!r} in this conversation")


def recall_tool() -> Tool:
    """The built-in `recall_tool_result(call_id)` tool (read-only, safe to run again: durable)."""
    return tool(name=RECALL_TOOL, durable=True)(_recall)
