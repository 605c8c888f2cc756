"""`stead memory list|search|add|promote|delete`: agents' long-term notes from the command line.

`list` and `search` read the database without owning it (also while another process runs agents in it);
`add`, `promote` and `delete` open it as its owner without resuming any agent, so they fail at once with
one line if another process owns it.
"""

from __future__ import annotations

import datetime
import json
from typing import Annotated, Any

import typer
from rich.text import Text as RichText

import stead
from stead.cli._common import (
    DEFAULT_DB,
    ReadDbOption,
    Records,
    SteadCommand,
    SteadGroup,
    WriteDbOption,
    err,
    execute,
    owner_url,
    url,
    wide,
)
from stead.cli._render import one_line
from stead.errors import StoreError
from stead.memory import Note

__all__ = ["memory_app"]

memory_app = typer.Typer(
    help="Agents' long-term memory: list, search, add, promote (confirm) and delete notes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=SteadGroup,
)

AgentOpt = Annotated[
    str | None, typer.Option("--agent", metavar="ID", help="An agent id (notes of that agent).")
]
UserOpt = Annotated[str | None, typer.Option("--user", metavar="ID", help="A user id (notes of that user).")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", metavar="ID", help="A tenant id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _no_memory(e: StoreError) -> bool:
    return "no such table" in str(e) or "memory_notes" in str(e)


async def _read(db: str, what: str, **kw: Any) -> list[Note]:
    try:
        async with stead.open(url(db), readonly=True, memory=True) as system:
            memory = system.memory
            if what == "list":
                return list(await memory.notes(**kw))
            return list(await memory.search(**kw))
    except StoreError as e:
        if _no_memory(e):
            return []
        raise


async def _write(db: str, action: str, **kw: Any) -> Any:
    store = owner_url(db, f"stead memory {action}", create=False)
    async with stead.open(store, memory=True, restore=False) as system:
        memory = system.memory
        if action == "add":
            return await memory.add(**kw)
        if action == "promote":
            return await memory.promote(kw["note_id"])
        await memory.delete(kw["note_id"])
        return None


def _date(ts: float | None) -> str:
    return "—" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _table(notes: list[Note], *, scores: bool = False) -> Records:
    cols = [
        "note",
        "type",
        "status",
        "trust",
        "user",
        "agent",
        "created",
        *(["score"] if scores else []),
        "text",
    ]
    table = Records(cols, ids=("note", "user", "agent"), keep=("type", "status", "trust"))
    for n in notes:
        status = RichText(n.status, style="yellow" if n.status == "provisional" else "")
        trust = RichText(n.trust, style="red" if n.trust == "tainted" else "")
        row: list[Any] = [n.id, n.type, status, trust, n.user or "—", n.agent or "—", _date(n.created_at)]
        if scores:
            row.append(f"{n.score:.4f}" if n.score is not None else "—")
        row.append(one_line(n.text, 120))
        table.add_row(*row)
    return table


def _print(notes: list[Note], as_json: bool, db: str, *, scores: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps([n.to_json() for n in notes], indent=2, ensure_ascii=False))
        return
    if not notes:
        err().print(RichText(f"no memory notes found in {db}", style="dim"))
        return
    wide().print(_table(notes, scores=scores))


@memory_app.command("list", cls=SteadCommand, short_help="List stored notes, newest first.")
def memory_list(
    db: ReadDbOption = DEFAULT_DB,
    agent: AgentOpt = None,
    user: UserOpt = None,
    tenant: TenantOpt = None,
    status: Annotated[
        str | None, typer.Option("--status", metavar="STATUS", help="active, provisional or archived.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, help="At most N notes.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List stored notes (exact --agent/--user/--tenant/--status filters), provisional and tainted ones
    marked. Reads the database without owning it."""
    found = execute(
        lambda: _read(db, "list", agent=agent, user=user, tenant=tenant, status=status, limit=limit)
    )
    _print(found, as_json, db)


@memory_app.command("search", cls=SteadCommand, short_help="Search notes as an agent would see them.")
def memory_search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for.", show_default=False)],
    db: ReadDbOption = DEFAULT_DB,
    agent: AgentOpt = None,
    user: UserOpt = None,
    tenant: TenantOpt = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, help="At most N notes.")] = 5,
    tainted: Annotated[bool, typer.Option("--tainted", help="Include tainted notes.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The notes agent --agent would get for --user: lexical and (with the local model) semantic search,
    fused, best first with their scores. Reads the database without owning it."""
    found = execute(
        lambda: _read(
            db, "search", query=query, agent=agent, user=user, tenant=tenant, limit=limit, tainted=tainted
        )
    )
    _print(found, as_json, db, scores=True)


@memory_app.command("add", cls=SteadCommand, short_help="Add a note (a person's: trusted, active).")
def memory_add(
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The note.", show_default=False)],
    db: WriteDbOption = DEFAULT_DB,
    agent: AgentOpt = None,
    user: UserOpt = None,
    tenant: TenantOpt = None,
    type: Annotated[
        str, typer.Option("--type", metavar="TYPE", help="preference, context, constraint or issue.")
    ] = "context",
    as_json: JsonOpt = False,
) -> None:
    """Add a note for --user (and/or --agent, --tenant; none of them: a global note)."""
    note = execute(lambda: _write(db, "add", text=text, type=type, agent=agent, user=user, tenant=tenant))
    if as_json:
        typer.echo(json.dumps(note.to_json(), indent=2, ensure_ascii=False))
        return
    typer.echo(note.id)


@memory_app.command("promote", cls=SteadCommand, short_help="Confirm a note: active and trusted.")
def memory_promote(
    note_id: Annotated[str, typer.Argument(metavar="NOTE_ID", help="The note's id.", show_default=False)],
    db: WriteDbOption = DEFAULT_DB,
) -> None:
    """Confirm an agent's provisional (or tainted) note: it becomes active and trusted, with no expiry, and
    is injected from the next run on."""
    note = execute(lambda: _write(db, "promote", note_id=note_id))
    typer.echo(f"{note.id} {note.status} {note.trust}")


@memory_app.command("delete", cls=SteadCommand, short_help="Delete a note (its audit trail stays).")
def memory_delete(
    note_id: Annotated[str, typer.Argument(metavar="NOTE_ID", help="The note's id.", show_default=False)],
    db: WriteDbOption = DEFAULT_DB,
) -> None:
    """Delete a note with its index rows and vector; the audit events stay."""
    execute(lambda: _write(db, "delete", note_id=note_id))
    typer.echo(f"deleted {note_id}")
