"""`stead talk DEFINITION`: a realtime co-agent in the terminal (text in, text out).

Each line typed is the user's turn; the agent's words stream to stdout; hand-offs, progress and results of
the durable agents it delegates to go to stderr. At the end of input the session waits (`--wait`, seconds)
for running hand-offs to finish and their results to be spoken, then closes; a hand-off still running then
is not lost: the next `stead talk` of the same agent (same `--db`) speaks its result first.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.text import Text as RichText

import stead
from stead.cli._common import DEFAULT_DB, DbOption, err, execute, fail, url
from stead.cli._options import RetryForOption, retry_policy
from stead.cli._printer import erase_sequence, is_terminal
from stead.definitions import load_definition, load_registry
from stead.errors import SteadError

if TYPE_CHECKING:
    from stead.realtime import RealtimeSession

__all__ = ["talk"]


async def _talk(
    name: str,
    own: Path,
    team: Path,
    session_id: str | None,
    model: str | None,
    wait: float,
    db: str,
    retry_for: float | None = None,
) -> None:
    from stead.realtime import RealtimePlugin

    console = err()
    registry = load_registry(team)
    plugin = RealtimePlugin(None if own == team else own)
    system = await stead.open(url(db), definitions=registry, plugins=[plugin], retry=retry_policy(retry_for))
    try:
        session = cast(
            "RealtimeSession",
            await system.realtime(
                definition=name, session_id=session_id, overrides={"model": model} if model else None
            ),
        )
        console.print(RichText(f"session {session.id} · {session.model.name} · Ctrl-D to end", style="dim"))
        printer = asyncio.get_running_loop().create_task(_print(session))
        loop = asyncio.get_running_loop()
        tty = sys.stdin.isatty()
        while True:
            if tty:
                sys.stdout.write("you> ")
                sys.stdout.flush()
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            text = line.strip()
            if text in ("/quit", "/exit"):
                break
            if text:
                await session.send_text(text)
        console.print(RichText(_closing(session, wait), style="dim"))  # what the wait below is for
        await _settle(session, wait)
        await session.close()
        await printer
    finally:
        await system.close()


def _closing(session: RealtimeSession, wait: float) -> str:
    running = len(session.running)
    if not running:
        return "end of input: closing the session once the agent has finished speaking"
    if wait > 0:
        return f"end of input: waiting up to {wait:g} s for {running} running hand-off(s), then closing"
    return (
        f"end of input: closing; {running} running hand-off(s) stop at their next safe point and stay "
        f"durable: `stead talk ... --session {session.id}` tells their results"
    )


async def _settle(session: RealtimeSession, wait: float) -> None:
    """Let the agent finish what it is saying (bounded), then wait up to `wait` seconds for running
    hand-offs to finish and be told."""
    await _until(lambda: session.sequencer.idle and not session.sequencer.queue, 30.0)
    await _until(lambda: not session.running and session.sequencer.idle and not session.sequencer.queue, wait)


async def _until(done: Callable[[], bool], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    quiet = 0
    while loop.time() < deadline:
        quiet = quiet + 1 if done() else 0
        if quiet >= 3:  # the same for a few polls: nothing in flight between events
            return
        await asyncio.sleep(0.05)


async def _print(session: RealtimeSession) -> None:
    """The session's events: the agent's words on stdout — streamed on a terminal, where a turn left
    unfinished (another one started) is erased; to a pipe or a file only whole turns (S6) — the rest on
    stderr."""
    console = err()
    out = sys.stdout
    tty = is_terminal(out)
    shown, item = "", None  # a terminal: the unfinished turn on the screen, and its item
    async for ev in session.events():
        if ev.type == "transcript" and ev.role == "assistant":
            text = ev.text or ""
            if shown and ev.item_id != item:
                out.write(erase_sequence(shown, shutil.get_terminal_size().columns))
                shown, item = "", None
            if not ev.final:
                if tty:
                    out.write(text)
                    shown, item = shown + text, ev.item_id
            else:
                out.write("\n" if shown else text + "\n")
                shown, item = "", None
            out.flush()
        elif (
            ev.type == "transcript"
            and ev.role == "user"
            and ev.item_id
            and not ev.item_id.startswith("user_")
        ):
            console.print(RichText(f"you (heard): {ev.text}", style="dim"))
        elif ev.type == "delegation_started":
            console.print(RichText(f"→ handed to {ev.agent}: {ev.text}", style="dim"))
        elif ev.type == "delegation_progress":
            console.print(RichText(f"  … {ev.text}", style="dim"))
        elif ev.type == "delegation_result":
            style = "dim" if ev.status == "completed" else "yellow"
            console.print(RichText(f"← {ev.agent} {ev.status}", style=style))
        elif ev.type == "error":
            console.print(RichText(f"[{ev.code}] {ev.text}", style="red" if ev.fatal else "dim"))


def talk(
    definition: Annotated[
        Path,
        typer.Argument(
            metavar="DEFINITION",
            help="A realtime definition file (type: realtime), or its name with --definitions.",
            show_default=False,
        ),
    ],
    definitions: Annotated[
        Path | None,
        typer.Option(
            "--definitions",
            help="The definitions directory of its target agents (default: the definition's directory).",
        ),
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Reopen this session (its undelivered results first).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="A realtime model instead of the definition's (openai:gpt-realtime, ...)."
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", help="At the end of input, wait up to this many seconds for running hand-offs."
        ),
    ] = 60.0,
    db: DbOption = DEFAULT_DB,
    retry_for: RetryForOption = None,
) -> None:
    """Talk with a realtime co-agent: each line is your turn; its answers stream to stdout, the work it
    hands to durable agents shows on stderr. A hand-off outlives the session: the next `stead talk` of the
    same agent tells its result first.

    `stead talk examples/voice/voice.yaml --definitions examples/team`"""
    try:
        if definition.is_file():
            name, own = load_definition(definition).name, definition.parent.resolve()
        elif definitions is None:
            fail("DEFINITION is a name: give --definitions DIR too (or the path of the definition file)", 2)
        else:
            name, own = str(definition), definitions.resolve()
    except SteadError as e:
        fail(str(e))
    team = definitions.resolve() if definitions is not None else own
    execute(lambda: _talk(name, own, team, session, model, wait, db, retry_for))
