"""`stead chat`: an interactive session with one agent.

A line typed while the agent is idle is sent; a line typed while it works *steers* it (`agent.steer`): it
reaches the model at the next boundary between responses, and the session shows when it does. The answer
streams above the input line, so typing never waits for the agent.

Line input is prompt_toolkit: it keeps an editable input line at the bottom while output streams above it
(`patch_stdout`), which is exactly "type while the agent works". Plain `input()`/readline cannot: it owns
the terminal line while it waits, and output printed meanwhile lands in the middle of what is being typed.
When standard input is not a terminal (a pipe), lines are read plainly, one message each.

Ctrl-C aborts the current turn (`agent.abort()`); a second Ctrl-C within 2 seconds exits. SIGTERM, `/exit`
and Ctrl-D exit after the agent reaches its next safe point; queued work stays durable either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text as RichText

import stead
from stead.agent import check_message
from stead.cli._common import DEFAULT_DB, DbOption, execute, fail, out, url
from stead.cli._options import (
    AgentOption,
    DefinitionArgument,
    MaxPayloadOption,
    ModelOption,
    RetryForOption,
)
from stead.cli._printer import Printer, TeamProgress, is_terminal
from stead.cli._render import one_line, print_history
from stead.cli._runs import runs_table
from stead.cli._signals import SIGINT_EXIT, SIGTERM_EXIT
from stead.cli._source import (
    PAYLOAD_HINT,
    Source,
    check_exists,
    create_or_get,
    load_source,
    message_switch,
    open_owner,
)
from stead.errors import InvalidInput

__all__ = ["chat"]

DOUBLE_CTRL_C = 2.0
"""Seconds within which a second Ctrl-C exits."""

HELP = (
    "type a message and press Enter; while the agent works, a line steers it. "
    "/abort stops the current turn, /history and /runs show what happened, /exit (or Ctrl-D) leaves; "
    "/approve [ID] [NOTE] and /reject [ID] [NOTE] decide held tool calls (all pending ones without ID; "
    "typing a message instead rejects them); "
    "Ctrl-C aborts a turn, twice within 2 s exits."
)


class _Lines:
    """Input lines: prompt_toolkit on a terminal, plain lines from a pipe."""

    def __init__(self) -> None:
        self.tty = sys.stdin is not None and sys.stdin.isatty()
        self._session: object | None = None
        self._queue: asyncio.Queue[str | None] | None = None

    async def read(self) -> str | None:
        """The next line; None at end of input. Raises KeyboardInterrupt for Ctrl-C at the prompt."""
        if self.tty:
            from prompt_toolkit import PromptSession

            if self._session is None:
                self._session = PromptSession()
            session: PromptSession[str] = self._session  # type: ignore[assignment]
            try:
                return await session.prompt_async("> ")
            except EOFError:
                return None
        if self._queue is None:
            self._queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            queue = self._queue

            def feed() -> None:  # a daemon thread: a blocked read never holds the process at exit
                for line in sys.stdin:
                    loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n"))
                loop.call_soon_threadsafe(queue.put_nowait, None)

            threading.Thread(target=feed, name="stead-chat-stdin", daemon=True).start()
        return await self._queue.get()

    def interrupt(self) -> None:
        """End the current prompt as if Ctrl-D was pressed (SIGTERM)."""
        session = self._session
        app = getattr(session, "app", None)
        if app is not None and app.is_running:
            app.exit(exception=EOFError())
        elif self._queue is not None:
            self._queue.put_nowait(None)


class _Chat:
    def __init__(
        self,
        system: stead.AgentSystem,
        agent: stead.Agent,
        printer: Printer,
        model: str | None,
        max_payload: int,
    ) -> None:
        self.system = system
        self.max_payload = max_payload
        self.agent = agent
        self.printer = printer
        self.model = model
        self.steers: dict[str, str] = {}
        self.held: list[stead.Event] = []
        self.aborted = False
        self.last_ctrl_c = 0.0
        self.terminated = False
        self.interrupted = False  # left by a double Ctrl-C: exit 130
        self.lines = _Lines()

    def note(self, text: str, style: str = "dim") -> None:
        self.printer.note(text, style)

    def on_event(self, ev: stead.Event) -> None:
        """Show an event. While a steer is queued, a response's text is held until the kernel reports the
        steer consumed (it commits with the response's first block), so the screen shows the steer
        reaching the model before the answer it produced."""
        if isinstance(ev, stead.MessageConsumed) and ev.message.id in self.steers:
            text = self.steers.pop(ev.message.id)
            self.note(f"↳ steer reached the model: {one_line(text, 120)}", "magenta")
            self._release()
        elif self.steers and isinstance(
            ev, stead.TextDelta | stead.ReasoningDelta | stead.BlockEnd | stead.UsageEvent
        ):
            self.held.append(ev)
            return
        else:
            self._release()
        self._show(ev)

    def _release(self) -> None:
        held, self.held = self.held, []
        for ev in held:
            self._show(ev)

    def _show(self, ev: stead.Event) -> None:
        self.printer.handle(ev)
        if isinstance(ev, stead.ApprovalRequested):
            self.note(
                f"waiting for approval {ev.approval_id}: {ev.call.name} — {ev.reason} (/approve or /reject)",
                "magenta",
            )
        if isinstance(ev, stead.Done) and ev.reason == "cancelled":
            self.aborted = True
            self.note("(turn aborted)", "yellow")
        elif isinstance(ev, stead.Settled):
            if self.printer.failures and not self.aborted:
                self.note(f"the turn failed: {one_line(self.printer.failures[-1], 300)}", "red")
            self.printer.failures.clear()
            self.aborted = False

    async def submit(self, line: str) -> None:
        """Send when idle, steer while working."""
        try:
            check_message(line, max_payload_bytes=self.max_payload, limit_hint=PAYLOAD_HINT)
            if self.agent.active:
                acc = await self.agent.steer(line)
                self.steers[acc.id] = line
                self.note("(steer queued: it reaches the model at the next step)", "magenta")
            else:
                await self.agent.send(line, model=message_switch(self.agent, self.model))
                self.model = None  # a switch happens once
        except InvalidInput as e:
            self.note(f"not sent: {e}", "red")

    async def command(self, line: str) -> bool:
        """Run a /command; True to leave the session."""
        name = line.split()[0].lower()
        if name in ("/exit", "/quit"):
            return True
        if name == "/abort":
            if self.agent.active:
                await self.agent.abort()
            else:
                self.note("nothing to abort: the agent is idle")
        elif name == "/history":
            print_history(out(), await self.agent.history())
        elif name == "/runs":
            found = await self.system.runs(agent_id=self.agent.id, limit=10)
            if found:
                Console(highlight=False, soft_wrap=True).print(runs_table(found))
            else:
                self.note("no runs yet")
        elif name in ("/approve", "/reject"):
            await self.decide(name == "/approve", line.split(maxsplit=1)[1:])
        elif name == "/help":
            self.note(HELP)
        else:
            self.note(f"unknown command {name}; /help lists them", "yellow")
        return False

    async def decide(self, approve: bool, rest: list[str]) -> None:
        """/approve or /reject: once the agent has nothing to do but wait, decide the named pending
        approval (the first word of `rest`), or every pending one; the remaining text is the note."""
        await self.agent.wait_idle()
        pending = await self.agent.approvals()
        words = rest[0].split(maxsplit=1) if rest else []
        chosen = [a for a in pending if words and a.id == words[0]]
        note = (words[1] if len(words) > 1 else None) if chosen else (rest[0] if rest else None)
        for a in chosen or pending:
            d = await (
                self.system.approve(a.id, note=note) if approve else self.system.reject(a.id, note=note)
            )
            self.note(f"{d.status} {a.id}: {a.tool}" + ("" if d.decided else " (decided before)"), "magenta")
        if not pending:
            self.note("nothing waits for approval")

    def ctrl_c(self) -> bool:
        """Ctrl-C: abort a working turn; a second one within 2 s exits (True)."""
        now = time.monotonic()
        if now - self.last_ctrl_c < DOUBLE_CTRL_C:
            return True
        self.last_ctrl_c = now
        if self.agent.active:
            self.note("Ctrl-C: aborting the current turn (Ctrl-C again within 2 s exits)", "yellow")
            asyncio.get_running_loop().create_task(self.agent.abort())
        else:
            self.note("(Ctrl-C again within 2 s exits; /exit does too)", "yellow")
        return False

    def sigterm(self) -> None:
        self.terminated = True
        self.note("SIGTERM: stopping at the agent's next safe point; queued work stays durable", "yellow")
        self.lines.interrupt()

    async def loop(self) -> None:
        while not self.terminated:
            try:
                line = await self.lines.read()
            except KeyboardInterrupt:
                if self.ctrl_c():
                    self.interrupted = True
                    return
                continue
            if line is None:
                if not self.lines.tty and not self.terminated:
                    await self.agent.wait_idle()  # piped input: answer what was sent before leaving
                return
            line = line.strip()
            if not line:
                continue
            if line.startswith("/") and not line.startswith("//"):
                if await self.command(line):
                    return
                continue
            await self.submit(line[1:] if line.startswith("//") else line)


async def _chat(
    source: Source,
    agent_id: str | None,
    db: str,
    model: str | None,
    max_payload: int,
    retry_for: float | None = None,
) -> int:
    # on a terminal, notes go to stdout too: one stream keeps them in order with the answer above the prompt;
    # a stdout redirected to a file or a pipe gets the committed answers only (S6)
    tty = sys.stdin is not None and sys.stdin.isatty() and is_terminal(sys.stdout)
    printer = Printer(Console(stderr=not tty, highlight=False, soft_wrap=True), line_buffered=True)
    progress = TeamProgress(printer)
    system = await open_owner(
        source,
        db,
        agent_id,
        model=model,
        hooks=[progress],
        max_payload_bytes=max_payload,
        retry_for=retry_for,
    )
    progress.system = system
    loop = asyncio.get_running_loop()
    consumer: asyncio.Task[None] | None = None
    session: _Chat | None = None
    try:
        agent = await create_or_get(system, source, agent_id)
        progress.root = agent.id
        session = _Chat(system, agent, printer, model, max_payload)
        stream = agent.events()

        async def consume() -> None:
            assert session is not None
            async for ev in stream:
                session.on_event(ev)

        consumer = loop.create_task(consume())
        who = f"{agent.name} " if agent.name else ""
        printer.err.print(RichText(f"chatting with {who}(agent {agent.id}); {HELP}", style="dim"))
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, session.sigterm)
        if session.lines.tty:
            from prompt_toolkit.patch_stdout import patch_stdout

            with patch_stdout(raw=True):
                await session.loop()
        else:
            await session.loop()
        if agent.active:
            printer.note(
                f"stopping agent {agent.id} at its next safe point; continue it with --agent {agent.id}"
            )
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGTERM)
        await system.close()
        if consumer is not None:
            await consumer
    printer.newline()
    printer.err.print(RichText(f"agent: {agent.id}", style="dim"))
    if session is not None and session.terminated:
        return SIGTERM_EXIT
    return SIGINT_EXIT if session is not None and session.interrupted else 0  # a double Ctrl-C


def chat(
    definition: DefinitionArgument,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[AGENT_NAME]",
            help="With a definitions directory: the definition to chat with (not needed with --agent).",
            show_default=False,
        ),
    ] = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    db: DbOption = DEFAULT_DB,
    max_payload_bytes: MaxPayloadOption = 1_000_000,
    retry_for: RetryForOption = None,
) -> None:
    """Talk with an agent built from a definition (a file, or a directory and AGENT_NAME), or continue one
    with --agent ID.

    The answer streams as it is written. A line typed while the agent works steers it: it reaches the model
    at the next step, and the session says when it does. A line typed while the agent is idle is sent.
    Commands: /abort (stop the current turn), /history, /runs, /exit. Ctrl-C aborts the current turn; a
    second Ctrl-C within 2 seconds exits. Everything is durable: continue later with --agent ID."""
    check_exists(definition)  # a mistyped path is named as such
    if definition.is_dir():
        if name is None and agent is None:
            fail("AGENT_NAME is required with a definitions directory", 2)
    elif name is not None:
        fail(f"unexpected argument {name!r}: a definition file names its agent (chat takes no message)", 2)
    url(db)
    source = load_source(definition, name, agent)
    code = execute(lambda: _chat(source, agent, db, model, max_payload_bytes, retry_for))
    if code:
        raise typer.Exit(code)
