"""How `stead run` and `stead chat` show a working agent: the model's committed text on stdout (streamed
on a terminal, whole blocks to a pipe or file), tool activity (dimmed) on stderr, sub-agents' calls
indented by their depth in the delegation tree."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from typing import TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text as RichText

import stead
from stead.cli._common import quiet_broken_pipe
from stead.cli._render import CUT_NOTE, call_summary, one_line
from stead.messages import Reasoning, Text, ToolCall, ToolResult

__all__ = ["RETRY_NOTE", "Printer", "TeamProgress", "erase_sequence", "is_terminal"]


def erase_sequence(written: str, width: int) -> str:
    """The terminal control sequence that erases `written` — text written from the start of a line, the
    cursor left at its end — on a terminal `width` columns wide: back to the first row it took, cleared to
    the end of the screen. Wrapped rows count (wide characters by their cells)."""
    if not written:
        return ""
    width = max(width, 1)
    lines = written.split("\n")
    up = sum(max(1, -(-cell_len(line) // width)) for line in lines[:-1])
    last = cell_len(lines[-1])
    if last:
        up += (last - 1) // width  # a row filled exactly keeps the cursor on it (pending wrap)
    return "\r" + (f"\x1b[{up}A" if up else "") + "\x1b[J"


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


RETRY_NOTE = "(retrying: the partial answer was dropped; the model is asked again)"


@dataclass
class Printer:
    """Streams an agent's events: committed text to stdout, tool activity dimmed on stderr (S6).

    stdout holds only text the agent committed. On a terminal the text streams as it arrives, and a block
    dropped by a retry (`block_reset`) is erased from the screen; to a pipe or a file a text block is held
    until it completes and written whole, so a dropped block never reaches it, and notes (Ctrl-C, tool
    calls) never write to it. `line_buffered` (chat) writes streamed text a whole line at a time, so a
    prompt redrawn below the output never splits a line. A stdout closed by its reader is dropped quietly:
    the agent's turn still completes. `tty` overrides whether stdout counts as a terminal."""

    err: Console
    line_buffered: bool = False
    stream: TextIO | None = None
    tty: bool | None = None
    at_line_start: bool = True
    streamed: bool = False
    failures: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    _pending: str = ""
    _held: str = ""
    """To a pipe or file: the text of the block in progress, not written yet."""
    _shown: str = ""
    """On a terminal: what of the block in progress is on the screen (erased if the block is dropped)."""
    _noted: bool = False
    """On a terminal: a note was printed inside the block in progress (it can no longer be erased)."""
    _closed: bool = False

    @property
    def _out_stream(self) -> TextIO:
        return self.stream or sys.stdout

    @property
    def terminal(self) -> bool:
        if self.tty is None:
            self.tty = is_terminal(self._out_stream)
        return self.tty

    def _write(self, text: str) -> None:
        if self._closed or not text:
            return
        try:
            stream = self._out_stream
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            self._closed = True
            quiet_broken_pipe()

    def _out(self, text: str) -> None:
        """Stream text of the block in progress to the terminal."""
        if not text:
            return
        if self.line_buffered:
            self._pending += text
            head, sep, tail = self._pending.rpartition("\n")
            if sep:
                self._write(head + "\n")
                self._shown += head + "\n"
                self._pending = tail
        else:
            self._write(text)
            self._shown += text
        self.at_line_start = text.endswith("\n")

    def newline(self) -> None:
        """End the line in progress on stdout (nothing is held back: a held block is not committed)."""
        if self._pending:
            self._write(self._pending + "\n")
            self._pending = ""
        elif not self.at_line_start:
            self._write("\n")
        self.at_line_start = True

    def note(self, text: str, style: str = "dim") -> None:
        if self.terminal:
            # one screen: the note goes below the text in progress, which can no longer be erased exactly
            self._noted = self._noted or bool(self._shown or self._pending)
            self.newline()
        self.err.print(RichText(text, style=style))

    def _commit(self, text: str) -> None:
        """A text block completed: it is committed."""
        if self.terminal:
            if not self.streamed:
                self._out(text)
        elif text:
            self._write(text if text.endswith("\n") else text + "\n")
        self.newline()
        self._held = self._shown = ""
        self._noted = False

    def _drop(self) -> None:
        """The block in progress will not be committed: it never reaches stdout, or leaves the screen."""
        if self.terminal and self._shown and not self._noted:
            self._write(erase_sequence(self._shown, shutil.get_terminal_size().columns))
        elif self.terminal and self._noted:
            self.newline()
            self.err.print(RichText("[the partial response above was dropped]", style="yellow"))
        self._pending = self._held = self._shown = ""
        self._noted = False
        self.streamed = False
        self.at_line_start = True  # a block starts on a new line: what is left of it is gone

    def handle(self, ev: stead.Event) -> None:
        if isinstance(ev, stead.TextDelta):
            if self.terminal:
                self._out(ev.text)
            else:
                self._held += ev.text
            self.streamed = True
        elif isinstance(ev, stead.BlockEnd):
            block = ev.block
            if isinstance(block, Text):
                self._commit(block.text)
            elif isinstance(block, ToolCall) and block.id is not None:
                self.names[block.id] = block.name
            elif isinstance(block, Reasoning) and block.text and not block.redacted:
                self.note(f"(thinking) {one_line(block.text)}", "dim italic")
            self.streamed = False
        elif isinstance(ev, stead.BlockReset):
            self._drop()
            self.note(RETRY_NOTE, "yellow")
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
            if self._held and not self.terminal:
                self._drop()  # a half-streamed block of an aborted or failed response is not committed
            if ev.reason == "error":
                self.failures.append(ev.error or "the model's response ended with an error")
            elif ev.reason == "length":
                self.note(CUT_NOTE, "yellow")
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
