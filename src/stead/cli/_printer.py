"""How `stead run` and `stead chat` show a working agent: the model's text on stdout as it streams, tool
activity (dimmed) on stderr, sub-agents' calls indented by their depth in the delegation tree."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console
from rich.text import Text as RichText

import stead
from stead.cli._common import quiet_broken_pipe
from stead.cli._render import call_summary, one_line
from stead.messages import Reasoning, Text, ToolCall, ToolResult

__all__ = ["Printer", "TeamProgress"]


@dataclass
class Printer:
    """Streams an agent's events: text to stdout, tool activity dimmed on stderr.

    `line_buffered` (chat) writes text a whole line at a time, so a prompt redrawn below the output never
    splits a line. A stdout closed by its reader is dropped quietly: the agent's turn still completes."""

    err: Console
    line_buffered: bool = False
    stream: TextIO | None = None
    at_line_start: bool = True
    streamed: bool = False
    failures: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    _pending: str = ""
    _closed: bool = False

    def _write(self, text: str) -> None:
        if self._closed:
            return
        stream = self.stream or sys.stdout
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            self._closed = True
            quiet_broken_pipe()

    def _out(self, text: str) -> None:
        if not text:
            return
        if self.line_buffered:
            self._pending += text
            head, sep, tail = self._pending.rpartition("\n")
            if sep:
                self._write(head + "\n")
                self._pending = tail
        else:
            self._write(text)
        self.at_line_start = text.endswith("\n")

    def newline(self) -> None:
        if self._pending:
            self._write(self._pending + "\n")
            self._pending = ""
        elif not self.at_line_start:
            self._write("\n")
        self.at_line_start = True

    def note(self, text: str, style: str = "dim") -> None:
        self.newline()
        self.err.print(RichText(text, style=style))

    def handle(self, ev: stead.Event) -> None:
        if isinstance(ev, stead.TextDelta):
            self._out(ev.text)
            self.streamed = True
        elif isinstance(ev, stead.BlockEnd):
            block = ev.block
            if isinstance(block, Text):
                if not self.streamed:
                    self._out(block.text)
                self.newline()
            elif isinstance(block, ToolCall) and block.id is not None:
                self.names[block.id] = block.name
            elif isinstance(block, Reasoning) and block.text and not block.redacted:
                self.note(f"(thinking) {one_line(block.text)}", "dim italic")
            self.streamed = False
        elif isinstance(ev, stead.BlockReset):
            self.streamed = False
            self._pending = ""
            self.note("[the partial response above was dropped; the model is asked again]", "yellow")
        elif isinstance(ev, stead.ToolStarted):
            call: ToolCall = ev.call
            if call.id is not None:
                self.names[call.id] = call.name
            self.note(f"→ {call_summary(call)}")
        elif isinstance(ev, stead.ToolFinished):
            result: ToolResult = ev.result
            name = self.names.get(result.call_id, "tool")
            if result.is_error:
                self.note(f"✗ {name}: {one_line(result.output)}", "red")
            else:
                self.note(f"← {name}: {one_line(result.output)}")
        elif isinstance(ev, stead.Activated):
            if ev.restored:
                self.note("resuming work left unfinished by a previous process")
        elif isinstance(ev, stead.Done):
            if ev.reason == "error":
                self.failures.append(ev.error or "the model's response ended with an error")
            elif ev.reason == "length":
                self.note("[the response was cut off at the model's length limit]", "yellow")
        elif isinstance(ev, stead.Settled) and ev.error is not None:
            self.failures.append(ev.error)


class TeamProgress(stead.Hooks):
    """Shows the tool and sub-agent calls of sub-agents (the root's own are shown by `Printer`), indented
    by their depth in the delegation tree, on stderr as they start and finish."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self.root: str | None = None
        self.system: stead.AgentSystem | None = None
        self.names: dict[str, str] = {}

    def _who(self, agent_id: str) -> tuple[str, int]:
        agent = self.system.loaded(agent_id) if self.system is not None else None
        if agent is None:
            return agent_id, 1
        config = agent.config
        chain = config.extra.get("stead.chain")
        depth = len(chain) - 1 if isinstance(chain, list) and chain else 1
        return config.name or agent_id, max(depth, 1)

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        if agent_id == self.root or self.root is None:
            return
        if not isinstance(event, stead.ToolStarted | stead.ToolFinished | stead.Settled):
            return
        name, depth = self._who(agent_id)
        pad = "  " * depth
        if isinstance(event, stead.ToolStarted):
            call: ToolCall = event.call
            if call.id is not None:
                self.names[call.id] = call.name
            self.printer.note(f"{pad}{name} → {call_summary(call)}")
        elif isinstance(event, stead.ToolFinished):
            result: ToolResult = event.result
            tool_name = self.names.pop(result.call_id, "tool")
            if result.is_error:
                self.printer.note(f"{pad}{name} ✗ {tool_name}: {one_line(result.output)}", "red")
            else:
                self.printer.note(f"{pad}{name} ← {tool_name}: {one_line(result.output)}")
        elif event.error is not None:
            self.printer.note(f"{pad}{name} failed: {one_line(event.error)}", "red")
