"""The JSON shapes of the HTTP service: content blocks, messages and usage as clients see them.

The store keeps blocks in a compact form (`stead.messages.encode_block`); the service speaks a readable one,
with a `type` on every block, the same in REST bodies, REST answers and event payloads. That form is the
kernel's (`block_json`, `message_json`, `usage_json` from `stead.extend`), the same one `stead history
--json` prints: re-exported here for the service's modules."""

from __future__ import annotations

import json
from typing import Any

from stead.extend import Block, InvalidInput, Reasoning, Text, block_json, message_json, usage_json

__all__ = ["block_json", "blocks_from_json", "dumps", "loads", "message_json", "usage_json"]


def dumps(value: Any) -> str:
    """Compact JSON (the form stored for events and sent on the wire)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def loads(text: str) -> dict[str, Any]:
    """A stored JSON object (an empty dict for anything else)."""
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


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
