"""Messages and content blocks, and their compact JSON form in the store.

Blocks are small frozen dataclasses so that `stead.Text("hi")` reads naturally and costs little on the hot
path. `encode_block` / `decode_block` define the stored form; it is part of the on-disk format.
`block_json` / `message_json` define the readable form callers see (the CLI's `--json`, the HTTP service).

Text that cannot be encoded as UTF-8 (a lone surrogate, U+D800–U+DFFF, which a Python `str` can hold but
no store can) is repaired where it enters from outside (`repair_block`: model output, tool results): each
lone surrogate becomes U+FFFD (a valid pair becomes its character), and the block says so
(`repaired=True`, stored as `"f":1`). Input from callers is refused instead (A7, `unstorable`).
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
    "block_json",
    "decode_block",
    "encode_block",
    "message_json",
    "repair_block",
    "repair_text",
    "repair_value",
    "text_of",
    "unstorable",
    "usage_json",
]

Role: TypeAlias = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text. `repaired`: text that could not be stored was replaced with U+FFFD (S5)."""

    text: str
    repaired: bool = field(default=False, repr=False)


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Model reasoning. `signature` (Anthropic thinking) is kept so replayed history is accepted verbatim."""

    text: str
    signature: str | None = None
    redacted: bool = False
    repaired: bool = field(default=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A request by the model to run a tool.

    `arguments` is a dict, or the raw argument text when the model produced something that is not a JSON
    object (validation turns that into an error result). `id` is assigned by stead when omitted.
    `repaired`: text in it that could not be stored was replaced with U+FFFD (S5).
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None
    repaired: bool = field(default=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The one result of a tool call. `output` is what the model sees; `repaired`: text in it that could not
    be stored was replaced with U+FFFD (S5)."""

    call_id: str
    output: str
    is_error: bool = False
    repaired: bool = field(default=False, repr=False)


Block: TypeAlias = Text | Reasoning | ToolCall | ToolResult


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one inference, and its cost in USD when the model's prices are known.

    `estimated` is True when the server reported no usage and stead counted the tokens itself (offline,
    `stead._tokens`): the numbers are then an estimate, shown as such (`~1,234`), never as 0."""

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
    out: dict[str, Any]
    if isinstance(block, Text):
        out = {"t": "x", "x": block.text}
    elif isinstance(block, ToolCall):
        out = {"t": "c", "n": block.name, "a": block.arguments, "i": block.id}
    elif isinstance(block, ToolResult):
        out = {"t": "r", "i": block.call_id, "o": block.output}
        if block.is_error:
            out["e"] = 1
    elif isinstance(block, Reasoning):
        out = {"t": "z", "x": block.text}
        if block.signature is not None:
            out["s"] = block.signature
        if block.redacted:
            out["d"] = 1
    else:
        raise TypeError(f"not a content block: {block!r}")
    if block.repaired:
        out["f"] = 1
    return out


def decode_block(data: dict[str, Any]) -> Block:
    """Inverse of `encode_block`."""
    kind = data["t"]
    fixed = "f" in data and bool(data["f"])
    if kind == "x":
        return Text(data["x"], fixed)
    if kind == "c":
        return ToolCall(data["n"], data["a"], data["i"], fixed)
    if kind == "r":
        return ToolResult(data["i"], data["o"], bool(data.get("e")), fixed)
    if kind == "z":
        return Reasoning(data["x"], data.get("s"), bool(data.get("d")), fixed)
    raise ValueError(f"unknown stored block kind {kind!r}")


# ------------------------------------------------------------------------------------- the readable form
def block_json(block: Block) -> dict[str, Any]:
    """A content block as callers read it, with a `type` on every block: the one form of `stead history
    --json`, the HTTP service's answers and its event payloads.

    A redacted reasoning block (Anthropic's `redacted_thinking`) holds the vendor's encrypted data, kept only
    to be replayed to the model verbatim: it shows as `{"type": "reasoning", "text": "", "redacted": true}`,
    never the data (as a signature is never shown)."""
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Reasoning):
        if block.redacted:
            return {"type": "reasoning", "text": "", "redacted": True}
        return {"type": "reasoning", "text": block.text}
    if isinstance(block, ToolCall):
        return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.arguments}
    if isinstance(block, ToolResult):
        return {
            "type": "tool_result",
            "call_id": block.call_id,
            "output": block.output,
            "is_error": block.is_error,
        }
    raise TypeError(f"not a content block: {block!r}")


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    """A usage record as callers read it (None for None)."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost": usage.cost,
    }


def message_json(message: Message, index: int | None = None, *, sparse: bool = False) -> dict[str, Any]:
    """A history message as callers read it, its blocks in `block_json`'s form.

    The full form (the HTTP service) has every field, null where unset, the joined `text`, and `index`
    when one is given. The sparse form (`stead history --json`) has `role`, `content` and only those of
    `id`, `usage`, `metadata` that are set."""
    content = [block_json(b) for b in message.content]
    out: dict[str, Any]
    if sparse:
        out = {"role": message.role}
        if message.id is not None:
            out["id"] = message.id
        out["content"] = content
        if message.usage is not None:
            out["usage"] = usage_json(message.usage)
        if message.metadata:
            out["metadata"] = message.metadata
        return out
    out = {
        "id": message.id,
        "role": message.role,
        "content": content,
        "text": message.text,
        "metadata": message.metadata,
        "usage": usage_json(message.usage),
    }
    if index is not None:
        out["index"] = index
    return out


# ---------------------------------------------------------------------------------------------- S5, A7
def _storable_text(text: str) -> bool:
    if text.isascii():  # O(1) in CPython: most text never pays for the check
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def repair_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (a valid surrogate pair becomes the character it
    encodes); `text` itself when it can be stored as it is."""
    if _storable_text(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def repair_value(value: Any) -> Any:
    """A JSON value (tool-call arguments) with `repair_text` applied to every string in it, keys included;
    `value` itself when nothing needed it."""
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for k, v in value.items():
            k2, v2 = repair_text(k) if isinstance(k, str) else k, repair_value(v)
            changed = changed or k2 is not k or v2 is not v
            out[k2] = v2
        return out if changed else value
    if isinstance(value, list):
        items = [repair_value(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def repair_block(block: Block) -> Block:
    """S5: the block with text that cannot be stored (lone surrogates) replaced by U+FFFD and marked
    `repaired=True`; the block itself when nothing needed it (the usual case, checked cheaply)."""
    if isinstance(block, Text):
        text = repair_text(block.text)
        return block if text is block.text else Text(text, True)
    if isinstance(block, ToolResult):
        cid, out = repair_text(block.call_id), repair_text(block.output)
        if cid is block.call_id and out is block.output:
            return block
        return ToolResult(cid, out, block.is_error, True)
    if isinstance(block, ToolCall):
        name, args = repair_text(block.name), repair_value(block.arguments)
        bid = block.id if block.id is None else repair_text(block.id)
        if name is block.name and args is block.arguments and bid is block.id:
            return block
        return ToolCall(name, args, bid, True)
    text = repair_text(block.text)
    sig = block.signature if block.signature is None else repair_text(block.signature)
    if text is block.text and sig is block.signature:
        return block
    return Reasoning(text, sig, block.redacted, True)


def unstorable(value: Any) -> str | None:
    """A7: what in a JSON value (message content, metadata, settings) cannot be stored ("a lone surrogate
    U+D800 ..."), or None when all of it can."""
    try:
        dumps(value).encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone surrogate U+{ord(e.object[e.start]):04X} (text must be valid Unicode)"
    return None


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
