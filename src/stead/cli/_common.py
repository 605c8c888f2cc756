"""What every `stead` command shares: the --db option, consoles, one-line failures, running a coroutine."""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text as RichText

from stead.errors import SteadError

__all__ = ["DEFAULT_DB", "DbOption", "err", "execute", "fail", "out", "url", "wide"]

T = TypeVar("T")

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        help="SQLite database file holding the agents (created if missing).",
        envvar="STEAD_DB",
        show_default=True,
    ),
]
DEFAULT_DB = Path("stead.db")


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


def url(db: Path) -> str:
    return f"sqlite:///{db}"


def execute(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine; turn stead errors and interrupts into one-line messages and exit codes."""
    try:
        return asyncio.run(make())
    except typer.Exit:
        raise
    except SteadError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted (accepted work is durable: continue it with --agent ID)", 130)
    except Exception as e:
        if os.environ.get("STEAD_DEBUG"):
            traceback.print_exc()
        fail(f"unexpected {type(e).__name__}: {e} (set STEAD_DEBUG=1 for a traceback)")
