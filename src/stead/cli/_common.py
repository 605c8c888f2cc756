"""What every `stead` command shares: the --db option, consoles, one-line failures, running a coroutine,
opening a database for inspection, and the help format.

Failures are one line on stderr (`error: ...`) and an exit status: 1 for errors, 2 for usage errors, 130
(Ctrl-C) or 143 (SIGTERM) when interrupted. A closed stdout (`stead history ID | head`) ends the output
quietly instead of printing a BrokenPipeError.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text as RichText
from typer.core import TyperArgument, TyperCommand, TyperGroup

import stead
from stead.errors import SteadError
from stead.system import Opening

__all__ = [
    "DEFAULT_DB",
    "DbOption",
    "Interrupted",
    "SteadCommand",
    "SteadGroup",
    "err",
    "execute",
    "fail",
    "inspect_db",
    "out",
    "quiet_broken_pipe",
    "url",
    "wide",
]

T = TypeVar("T")

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        metavar="PATH",
        help="The SQLite database file holding the agents. `run` and `chat` create it; the other commands "
        "only read it (also while another process runs agents in it).",
        envvar="STEAD_DB",
        show_default=True,
    ),
]
DEFAULT_DB = "stead.db"


def err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def wide() -> Console:
    """stdout; wide enough for tables and trees when it is not a terminal (pipes, tests)."""
    console = out()
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=200)
    return console


def fail(message: str, code: int = 1) -> NoReturn:
    err().print(RichText("error: ", style="bold red") + RichText(message))
    raise typer.Exit(code)


def url(db: str) -> str:
    """The store URL of `--db`; an empty value is a usage error."""
    if not db.strip():
        fail("--db is empty: name a database file (e.g. --db stead.db)", 2)
    if db.startswith(("postgresql://", "postgres://", "sqlite:")):
        return db  # a store URL (PostgreSQL needs the postgres extra)
    return f"sqlite:///{db}"


class Interrupted(Exception):
    """A command stopped by Ctrl-C or SIGTERM after draining; `agent_id` names the agent to continue."""

    def __init__(self, code: int, agent_id: str | None) -> None:
        super().__init__(f"interrupted ({code})")
        self.code = code
        self.agent_id = agent_id


def quiet_broken_pipe() -> None:
    """stdout was closed by its reader (`| head`): send the rest of the output nowhere, without an error
    at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - no real stdout (tests)
        pass


def execute(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine; turn stead errors and interrupts into one-line messages and exit codes."""
    try:
        return asyncio.run(make())
    except typer.Exit:
        raise
    except Interrupted as e:
        what = f"continue it with --agent {e.agent_id}" if e.agent_id else "nothing was started"
        fail(f"interrupted (accepted work is durable: {what})", e.code)
    except SteadError as e:
        fail(str(e))
    except sqlite3.Error as e:  # the store names its file in its own errors; this is a last resort
        fail(f"database error: {e}")
    except BrokenPipeError:
        quiet_broken_pipe()
        raise typer.Exit(0) from None
    except KeyboardInterrupt:
        fail("interrupted (accepted work is durable: continue it with --agent ID)", 130)
    except Exception as e:
        if os.environ.get("STEAD_DEBUG"):
            traceback.print_exc()
        fail(f"unexpected {type(e).__name__}: {e} (set STEAD_DEBUG=1 for a traceback)")


def inspect_db(db: str) -> Opening:
    """Open `--db` for inspection: read-only, no lock (works while another process owns it), never creates
    or migrates a file, never runs an agent."""
    return stead.open(url(db), readonly=True)


# ------------------------------------------------------------------------------------------ help format
class _PlainArgument(TyperArgument):
    """An argument shown by its metavar alone (no `<str>`/`<path>` type, no `{}` around required ones)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        if self.metavar is not None:
            return self.metavar
        name = self.display_name_raw
        return name if self.required else f"[{name}]"


def _plain(params: list[Any]) -> list[Any]:
    for p in params:
        if type(p) is TyperArgument:
            p.__class__ = _PlainArgument
    return params


class SteadCommand(TyperCommand):
    """Help without type placeholders; paragraphs are rewrapped to the terminal (click's plain format)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))


class SteadGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))
