"""The JSON shapes of the HTTP service: content blocks, messages and usage as clients see them.

The store keeps blocks in a compact form (`stead.messages.encode_block`); the service speaks a readable one,
with a `type` on every block, the same in REST bodies, REST answers and event payloads."""

from __future__ import annotations

import json
from typing import Any

from stead.errors import InvalidInput
from stead.messages import Block, Message, Reasoning, Text, ToolCall, ToolResult, Usage

__all__ = ["block_json", "blocks_from_json", "dumps", "loads", "message_json", "usage_json"]


def dumps(value: Any) -> str:
    """Compact JSON (the form stored for events and sent on the wire)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def loads(text: str) -> dict[str, Any]:
    """A stored JSON object (an empty dict for anything else)."""
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def block_json(block: Block) -> dict[str, Any]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Reasoning):
        out: dict[str, Any] = {"type": "reasoning", "text": "" if block.redacted else block.text}
        if block.redacted:
            out["redacted"] = True
        return out
    if isinstance(block, ToolCall):
        return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.arguments}
    if isinstance(block, ToolResult):
        return {
            "type": "tool_result",
            "call_id": block.call_id,
            "output": block.output,
            "is_error": block.is_error,
        }
    raise TypeError(f"not a content block: {block!r}")  # pragma: no cover


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost": usage.cost,
    }


def message_json(message: Message, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": message.id,
        "role": message.role,
        "content": [block_json(b) for b in message.content],
        "text": message.text,
        "metadata": message.metadata,
        "usage": usage_json(message.usage),
    }
    if index is not None:
        out["index"] = index
    return out


def blocks_from_json(content: str | list[dict[str, Any]]) -> str | list[Block]:
    """Input content: a string, or text (and reasoning) blocks. Anything else is refused (A7)."""
    if isinstance(content, str):
        return content
    blocks: list[Block] = []
    for item in content:
        kind = item.get("type")
        text = item.get("text")
        if kind not in ("text", "reasoning") or not isinstance(text, str):
            raise InvalidInput("input content blocks must be {type: text|reasoning, text: string}")
        blocks.append(Text(text) if kind == "text" else Reasoning(text))
    return blocks
