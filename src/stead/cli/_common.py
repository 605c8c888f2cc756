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
from collections.abc import Callable, Collection, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType
from rich.table import Table
from rich.text import Text as RichText
from typer.core import TyperArgument, TyperCommand, TyperGroup

import stead
from stead.errors import InvalidInput, SteadError
from stead.store.sqlite import parse_sqlite_url
from stead.system import AgentSystem, Opening

__all__ = [
    "DEFAULT_DB",
    "DbOption",
    "Interrupted",
    "ReadDbOption",
    "Records",
    "SteadCommand",
    "SteadGroup",
    "WriteDbOption",
    "err",
    "execute",
    "fail",
    "inspect_db",
    "out",
    "owner_url",
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
        help="The database holding the agents: a SQLite file, created if missing (its directory must "
        "exist), or a store URL (postgresql://user@host/dbname).",
        envvar="STEAD_DB",
        show_default=True,
    ),
]
"""`--db` of the commands that create agents (`run`, `chat`, `talk`): they may create the SQLite file."""
ReadDbOption = Annotated[
    str,
    typer.Option(
        "--db",
        metavar="PATH",
        help="The database to read: a SQLite file or a store URL (postgresql://user@host/dbname). Never "
        "created or changed; works while another process runs agents in it.",
        envvar="STEAD_DB",
        show_default=True,
    ),
]
WriteDbOption = Annotated[
    str,
    typer.Option(
        "--db",
        metavar="PATH",
        help="The existing database to change: a SQLite file (never created; no other process may own it) "
        "or a store URL (postgresql://user@host/dbname).",
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
    """stdout; wide enough for tables and trees when it is not a terminal (pipes, tests) and COLUMNS does
    not say otherwise."""
    console = out()
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
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


def owner_url(db: str, command: str, *, create: bool) -> str:
    """The store URL of `--db` for a command that writes. A SQLite file must exist unless the command
    creates agents (`create=True`: `run`, `chat`), which may create the file but never its directory; a
    mistyped `--db` is one line and exit 1, and nothing is created."""
    store = url(db)
    if not store.startswith("sqlite:"):
        return store
    try:
        path, _ = parse_sqlite_url(store)
    except InvalidInput as e:
        fail(str(e), 2)
    file = Path(path)
    if path == ":memory:" or file.exists():
        return store  # the store itself names a directory or a foreign file
    if not create:
        fail(
            f"{path}: no such database file ({command} changes an existing database and never creates one; "
            "`stead run` or `stead chat` creates it)"
        )
    parent = file.parent
    if not parent.exists():
        fail(f"{path}: no such directory {str(parent)!r} (stead creates the file, never its directory)")
    if not parent.is_dir():
        fail(f"{path}: {str(parent)!r} is not a directory")
    return store


class Records:
    """Rows as a table whose id columns are never cut: the table when its id columns fit whole at the
    console's width (the other columns wrap), otherwise one block per row (ids first, then `column: value`
    lines), so that every id can be copied at any width."""

    def __init__(self, columns: Sequence[str], *, ids: Collection[str] = (), keep: Collection[str] = ()):
        """`ids` are never cut or wrapped; `keep` (short values: statuses, dates) are not wrapped in the
        table and stand on the first line of a row's block."""
        self.columns = list(columns)
        self.ids = set(ids)
        self.keep = set(keep)
        self.rows: list[list[RenderableType]] = []

    def add_row(self, *cells: str | RichText) -> None:
        self.rows.append(list(cells))

    def table(self) -> Table:
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for c in self.columns:
            whole = c in self.ids or c in self.keep
            table.add_column(c, no_wrap=whole, overflow="ellipsis" if whole else "fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def _width(self, index: int, *, word: bool = False) -> int:
        """The column's width unwrapped, or (`word`) its longest word's."""
        texts = [self.columns[index], *(_cell(r[index]) for r in self.rows)]
        return max(cell_len(w) for t in texts for w in (t.split() if word else [t]) or [""])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        need = 2 * (len(self.columns) - 1)  # two spaces between columns
        for i, c in enumerate(self.columns):
            whole = self._width(i)  # a wrapped column needs its longest word, and no less than 12
            need += (
                whole if c in self.ids or c in self.keep else min(whole, max(self._width(i, word=True), 12))
            )
        if need <= options.max_width:
            yield self.table()
            return
        for row in self.rows:  # too narrow for a table: a block per row
            head = RichText()
            for c, cell in zip(self.columns, row, strict=True):
                if c in self.ids or c in self.keep:
                    head.append_text(_text(cell, bold=c in self.ids))
                    head.append("  ")
            head.rstrip()
            yield head
            for c, cell in zip(self.columns, row, strict=True):
                if c not in self.ids and c not in self.keep and _cell(cell):
                    yield RichText(f"  {c}: ", style="dim") + _text(cell)


def _cell(cell: RenderableType) -> str:
    return cell.plain if isinstance(cell, RichText) else str(cell)


def _text(cell: RenderableType, *, bold: bool = False) -> RichText:
    text = cell.copy() if isinstance(cell, RichText) else RichText(str(cell))
    if bold:
        text.stylize("bold")
    return text


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


def inspect_db(db: str) -> Opening[AgentSystem]:
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
