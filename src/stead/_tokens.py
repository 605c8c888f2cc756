"""Token accounting without a tokenizer download (issue 10 §1): how big a request is, offline.

The primary measure of a context is what the server reported for the previous response (its input plus
output tokens); only what was appended since is estimated (`context_tokens`). When a server reports
nothing at all (a llama.cpp server streaming without usage), the kernel records an estimate for the
response, flagged `Usage.estimated`, so run records show `~1,234` instead of a false 0 and the compaction
trigger still fires.

The estimate mimics how byte-pair tokenizers split text (o200k_base and its relatives pre-split into
letter runs, digit groups of at most three, punctuation runs and whitespace): a short word is one token, a
long one about one per four letters, each digit group one, punctuation about one per character. Measured
against o200k_base (`bench/token_estimate.py`, `docs/context.md`) it stays within about ±20 % on prose,
code, JSON, logs and hex — where the usual chars/4 rule undercounts JSON and logs by half, which is the
dangerous direction for a window check. `tiktoken` is not used: it downloads its encodings on first use
and fails offline. Long texts are estimated from evenly spread samples, so a 1 MB tool result costs
about as much as 16 KB.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from stead.messages import Message, Reasoning, Text, ToolCall, ToolResult

__all__ = [
    "MESSAGE_OVERHEAD",
    "estimate_messages",
    "estimate_record",
    "estimate_text",
    "estimate_tools",
]

_PIECE = re.compile(r"[^\W\d_]+|\d{1,3}|[^\w\s]+|_+|\s+")
MESSAGE_OVERHEAD = 4
"""Tokens a chat template adds around each message (role markers, separators)."""
_SAMPLE = 4096
_SAMPLES = 4


def _exact(text: str) -> float:
    n = 0.0
    for m in _PIECE.finditer(text):
        piece = m.group()
        c = piece[0]
        size = len(piece)
        if c.isalpha():
            n += 1.0 if size <= 6 else size / 4.0
        elif c.isdigit():
            n += 1.0
        elif c.isspace():
            n += 0.0 if size == 1 else 0.5
        else:
            n += 1.0 if size == 1 else size * 0.7
    return n


_CACHED_SIZE = 4096
"""Texts up to this many characters are remembered (the last `_CACHED` of them): the instructions, tool
specifications and recent history are estimated again on every request of a conversation. Bounded in
entries and in entry size, so a hostile tool output cannot grow it."""
_CACHED = 256


@functools.lru_cache(maxsize=_CACHED)
def _short(text: str) -> int:
    return math.ceil(_exact(text))


def estimate_text(text: str) -> int:
    """Estimated tokens of `text` (0 for the empty string)."""
    size = len(text)
    if size == 0:
        return 0
    if size <= _CACHED_SIZE:
        return _short(text)
    if size <= _SAMPLE * _SAMPLES:
        return math.ceil(_exact(text))
    step = size // _SAMPLES
    sampled = sum(_exact(text[i * step : i * step + _SAMPLE]) for i in range(_SAMPLES))
    return math.ceil(sampled * size / (_SAMPLE * _SAMPLES))


def _block_tokens(block: Any) -> int:
    if isinstance(block, Text | Reasoning):
        return estimate_text(block.text)
    if isinstance(block, ToolCall):
        args = block.arguments if isinstance(block.arguments, str) else json.dumps(block.arguments)
        return estimate_text(block.name) + estimate_text(args) + 3
    if isinstance(block, ToolResult):
        return estimate_text(block.output) + 3
    return 0


def estimate_messages(messages: Iterable[Message]) -> int:
    """Estimated tokens of a provider context's messages."""
    return sum(MESSAGE_OVERHEAD + sum(_block_tokens(b) for b in m.content) for m in messages)


def estimate_tools(specs: Sequence[Any]) -> int:
    """Estimated tokens of the tool specifications offered (name, description, JSON schema)."""
    total = 0
    for s in specs:
        total += (
            estimate_text(s.name) + estimate_text(s.description) + estimate_text(json.dumps(s.parameters))
        )
        total += 6
    return total


def _stored_block(b: dict[str, Any]) -> int:
    kind = b.get("t")
    if kind in ("x", "z"):
        return estimate_text(str(b.get("x", "")))
    if kind == "c":
        args = b.get("a")
        return (
            estimate_text(str(b.get("n", "")))
            + estimate_text(args if isinstance(args, str) else json.dumps(args))
            + 3
        )
    if kind == "r":
        return estimate_text(str(b.get("o", ""))) + 3
    return 0


def estimate_record(rec: dict[str, Any]) -> int:
    """Estimated tokens a stored history record adds to the provider context (`stead.core.records`)."""
    kind = rec.get("k")
    if kind == "u":
        return MESSAGE_OVERHEAD + sum(_stored_block(b) for b in rec.get("c") or ())
    if kind in ("b", "t"):
        return _stored_block(rec.get("b") or {}) + 1
    if kind == "s":
        return MESSAGE_OVERHEAD + estimate_text(str(rec.get("x", "")))
    if kind == "c":
        text = rec.get("x")
        return MESSAGE_OVERHEAD + estimate_text(str(text)) if text else 0
    return 0
