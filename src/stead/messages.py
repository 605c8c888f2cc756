"""Messages and content blocks, and their compact JSON form in the store.

Blocks are small frozen dataclasses so that `stead.Text("hi")` reads naturally and costs little on the hot
path. `encode_block` / `decode_block` define the stored form; it is part of the on-disk format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = [
    "Block",
    "Message",
    "Reasoning",
    "Role",
    "Text",
    "ToolCall",
    "ToolResult",
    "Usage",
    "decode_block",
    "encode_block",
    "text_of",
]

Role: TypeAlias = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Model reasoning. `signature` (Anthropic thinking) is kept so replayed history is accepted verbatim."""

    text: str
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A request by the model to run a tool.

    `arguments` is a dict, or the raw argument text when the model produced something that is not a JSON
    object (validation turns that into an error result). `id` is assigned by stead when omitted.
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The one result of a tool call. `output` is what the model sees."""

    call_id: str
    output: str
    is_error: bool = False


Block: TypeAlias = Text | Reasoning | ToolCall | ToolResult


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one inference, and its cost in USD when the model's prices are known.

    `estimated` is True when the server reported no usage and stead counted the tokens itself (offline,
    `stead.core.tokens`): the numbers are then an estimate, shown as such (`~1,234`), never as 0."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = None
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of an agent's history.

    Consecutive assistant blocks of one response form one assistant message; `usage` is set on an
    assistant message when the response reported it. `id` is the acceptance id for user/system input;
    `user` and `tenant` are who sent it (`agent.send(..., user="u-42")`), stored with the message.
    """

    role: Role
    content: list[Block]
    id: str | None = None
    usage: Usage | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    tenant: str | None = None

    @property
    def text(self) -> str:
        """The concatenated text blocks."""
        return text_of(self.content)


def text_of(blocks: list[Block]) -> str:
    """Concatenate the `Text` blocks of a content list."""
    return "".join(b.text for b in blocks if isinstance(b, Text))


def encode_block(block: Block) -> dict[str, Any]:
    """The stored JSON form of a block (short keys: this is written once per block)."""
    if isinstance(block, Text):
        return {"t": "x", "x": block.text}
    if isinstance(block, ToolCall):
        return {"t": "c", "n": block.name, "a": block.arguments, "i": block.id}
    if isinstance(block, ToolResult):
        out: dict[str, Any] = {"t": "r", "i": block.call_id, "o": block.output}
        if block.is_error:
            out["e"] = 1
        return out
    if isinstance(block, Reasoning):
        r: dict[str, Any] = {"t": "z", "x": block.text}
        if block.signature is not None:
            r["s"] = block.signature
        if block.redacted:
            r["d"] = 1
        return r
    raise TypeError(f"not a content block: {block!r}")


def decode_block(data: dict[str, Any]) -> Block:
    """Inverse of `encode_block`."""
    kind = data["t"]
    if kind == "x":
        return Text(data["x"])
    if kind == "c":
        return ToolCall(data["n"], data["a"], data["i"])
    if kind == "r":
        return ToolResult(data["i"], data["o"], bool(data.get("e")))
    if kind == "z":
        return Reasoning(data["x"], data.get("s"), bool(data.get("d")))
    raise ValueError(f"unknown stored block kind {kind!r}")


def encode_usage(usage: Usage) -> list[Any]:
    """Stored form of a usage record (a fifth element `1` marks an estimate; older records have four)."""
    if usage.estimated:
        return [usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.cost, 1]
    return [usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.cost]


def decode_usage(data: list[Any]) -> Usage:
    """Inverse of `encode_usage`."""
    return Usage(int(data[0]), int(data[1]), int(data[2]), data[3], len(data) > 4 and bool(data[4]))


def dumps(value: Any) -> str:
    """Compact JSON used for every stored value."""
    return _encode(value)


# `json.dumps` with options builds a JSONEncoder on every call; one, built once, encodes the same text
# (stored values are encoded on every commit of the hot path). Without the circular-reference check (a dict
# of ids per container, per call): a value that contains itself still fails, with RecursionError.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode
