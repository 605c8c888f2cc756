"""How the CLI shows messages, blocks and tool calls in the terminal (their JSON is
`stead.extend.message_json`, the one readable form, also the HTTP service's)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.text import Text as RichText

from stead.extend import Message, Reasoning, Text, ToolCall, ToolResult

__all__ = ["CUT_NOTE", "call_summary", "one_line", "print_history"]

CUT_NOTE = "(cut off: the response reached its output cap; raise it with context.max_output_tokens)"
"""What the CLI says of a response cut by its output cap (`finish_reason: length`, MR2)."""


def one_line(text: str, limit: int = 200) -> str:
    """Collapse whitespace and cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def call_summary(call: ToolCall, limit: int = 200) -> str:
    """`name(a=2, b=3)` (or the raw argument text when the model sent something that is not an object)."""
    if isinstance(call.arguments, dict):
        args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    else:
        args = call.arguments
    return one_line(f"{call.name}({args})", limit)


_ROLE_STYLE = {
    "user": "bold green",
    "assistant": "bold cyan",
    "tool": "bold magenta",
    "system": "bold yellow",
}


def print_history(console: Console, messages: list[Message]) -> None:
    """The conversation as `stead history` prints it (also `/history` in `stead chat`)."""
    names: dict[str, str] = {}
    for m in messages:
        console.print(RichText(m.role, style=_ROLE_STYLE.get(m.role, "bold")))
        for b in m.content:
            if isinstance(b, Text):
                console.print(RichText(_indent(b.text)))
            elif isinstance(b, Reasoning):
                console.print(RichText(_indent("(thinking) " + b.text), style="dim italic"))
            elif isinstance(b, ToolCall):
                if b.id is not None:
                    names[b.id] = b.name
                console.print(RichText(_indent(f"→ {call_summary(b, 2000)}"), style="cyan"))
            elif isinstance(b, ToolResult):
                name = names.get(b.call_id, "tool")
                style = "red" if b.is_error else ""
                mark = "✗" if b.is_error else "←"
                console.print(RichText(_indent(f"{mark} {name}: {b.output}"), style=style))
        if m.role == "assistant" and m.metadata and m.metadata.get("finish_reason") == "length":
            console.print(RichText(_indent(CUT_NOTE), style="yellow"))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines() or [""])
