"""Convert stead history to each vendor's wire format, and parse tool-call arguments back.

stead owns tool-call ids: a `ToolCall.id` becomes the wire id (`tool_calls[].id` for OpenAI, `tool_use.id`
for Anthropic) and `ToolResult.call_id` the id a result answers, so a history written before a restart is
replayed byte for byte. Provider-assigned ids are never kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stead.messages import Message, Reasoning, Text, ToolCall, ToolResult
from stead.providers.base import ToolSpec

__all__ = [
    "arguments_json",
    "parse_arguments",
    "to_anthropic_messages",
    "to_anthropic_tools",
    "to_openai_messages",
    "to_openai_tools",
]

_CACHE = {"type": "ephemeral"}


def parse_arguments(raw: str) -> dict[str, Any] | str:
    """Tool-call arguments as a dict; the raw text when it is not a JSON object (validation reports it)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw


def arguments_json(arguments: dict[str, Any] | str) -> str:
    """The wire text of tool-call arguments (raw text is replayed as the model produced it)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


def _call_id(call: ToolCall, position: tuple[int, int]) -> str:
    return call.id if call.id is not None else f"call_{position[0]}_{position[1]}"


# -- OpenAI Chat Completions --------------------------------------------------------------------------------


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def to_openai_messages(instructions: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Chat Completions messages: instructions as the system message, tool results as `tool` messages.

    Reasoning is not replayed (Chat Completions has no field for it). Tool results are placed before any
    text of the same stead message, because a `tool` message must directly follow its assistant message.
    """
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for m_index, message in enumerate(messages):
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for b_index, block in enumerate(message.content):
            if isinstance(block, Text):
                texts.append(block.text)
            elif isinstance(block, ToolCall):
                calls.append(
                    {
                        "id": _call_id(block, (m_index, b_index)),
                        "type": "function",
                        "function": {"name": block.name, "arguments": arguments_json(block.arguments)},
                    }
                )
            elif isinstance(block, ToolResult):
                out.append({"role": "tool", "tool_call_id": block.call_id, "content": block.output})
        text = "".join(texts)
        if message.role == "assistant":
            if not text and not calls:
                continue
            entry: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
        elif text:
            role = "system" if message.role == "system" else "user"
            out.append({"role": role, "content": text})
    return out


# -- Anthropic Messages -------------------------------------------------------------------------------------


def to_anthropic_tools(tools: Sequence[ToolSpec], *, cache: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
    if cache and out:
        out[-1]["cache_control"] = dict(_CACHE)
    return out


def _anthropic_blocks(message: Message, m_index: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for b_index, block in enumerate(message.content):
        if isinstance(block, Text):
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, Reasoning):
            # Thinking is accepted only with the signature Anthropic gave it; replay it verbatim.
            if message.role != "assistant":
                continue
            if block.redacted:
                blocks.append({"type": "redacted_thinking", "data": block.text})
            elif block.signature is not None:
                blocks.append({"type": "thinking", "thinking": block.text, "signature": block.signature})
        elif isinstance(block, ToolCall):
            args = block.arguments
            wire_input: dict[str, Any] = args if isinstance(args, dict) else {"_invalid_arguments": args}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": _call_id(block, (m_index, b_index)),
                    "name": block.name,
                    "input": wire_input,
                }
            )
        elif isinstance(block, ToolResult):
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.call_id}
            result["content"] = block.output
            if block.is_error:
                result["is_error"] = True
            results.append(result)
    # tool_result blocks must come first in the user message that answers a tool_use.
    return results + blocks


def to_anthropic_messages(messages: Sequence[Message], *, cache: bool = False) -> list[dict[str, Any]]:
    """Messages API turns: user/tool/system input as `user` turns (consecutive ones merged), assistant as-is.

    With `cache`, the last block of the last turn carries a cache breakpoint so the next request (also
    after a restart, since history is replayed verbatim) reads the prefix from the prompt cache.
    """
    out: list[dict[str, Any]] = []
    for m_index, message in enumerate(messages):
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _anthropic_blocks(message, m_index)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            merged: list[dict[str, Any]] = out[-1]["content"] + blocks
            if role == "user":
                merged = [b for b in merged if b["type"] == "tool_result"] + [
                    b for b in merged if b["type"] != "tool_result"
                ]
            out[-1]["content"] = merged
        else:
            out.append({"role": role, "content": blocks})
    if cache and out:
        last = out[-1]["content"][-1]
        if last["type"] in ("text", "tool_result", "tool_use"):
            last["cache_control"] = dict(_CACHE)
    return out
