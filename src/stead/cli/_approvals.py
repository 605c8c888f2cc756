"""`stead approvals list|approve|reject`: human decisions on held tool calls, from the command line.

`list` reads the database without owning it (also while another process runs agents in it). `approve` and
`reject` write the decision as the database's owner without running any agent (`restore=False`): the
decision is durable at once, and the agent continues when its owner runs it (`stead run ... --agent ID`).
A rejected call's error result commits with the decision; an approved call runs once, there.
"""

from __future__ import annotations

import datetime
import json
from typing import Annotated, Any, cast

import typer
from rich.text import Text as RichText

import stead
from stead._approvals import ApprovalStatus
from stead.cli._common import (
    DEFAULT_DB,
    ReadDbOption,
    Records,
    SteadCommand,
    SteadGroup,
    WriteDbOption,
    err,
    execute,
    fail,
    out,
    owner_url,
    url,
)

__all__ = ["approvals_app", "print_waiting"]

approvals_app = typer.Typer(
    help="Human approvals of held tool calls: list them, approve or reject one.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=SteadGroup,
)

STATUSES = ("pending", "approved", "rejected", "expired", "cancelled", "all")


def _json(a: stead.Approval) -> dict[str, Any]:
    return {
        "id": a.id,
        "agent_id": a.agent_id,
        "run_id": a.run_id,
        "root_run_id": a.root_run_id,
        "call_id": a.call_id,
        "tool": a.tool,
        "arguments": a.arguments,
        "effects": a.effects,
        "destructive": a.destructive,
        "mode": a.mode,
        "reason": a.reason,
        "status": a.status,
        "note": a.note,
        "edited_arguments": a.edited_arguments,
        "decided_by": a.decided_by,
        "created_at": a.created_at,
        "decided_at": a.decided_at,
        "expires_at": a.expires_at,
    }


def _call(a: stead.Approval) -> str:
    args = json.dumps(a.arguments, ensure_ascii=False)
    return f"{a.tool}({args if len(args) <= 80 else args[:77] + '...'})"


async def _list(db: str, status: str, agent: str | None, run: str | None) -> list[stead.Approval]:
    chosen = None if status == "all" else cast(ApprovalStatus, status)
    # as `inspect_db`: read-only, no lock, never creates or migrates — with the approvals plugin to read them
    async with stead.open(url(db), readonly=True, approvals=True) as system:
        try:
            return await system.approvals(chosen, agent_id=agent, root_run_id=run)
        except stead.StoreError as e:
            if "no such table" in str(e):
                return []  # no approval was ever requested in this database
            raise


@approvals_app.command(name="list", cls=SteadCommand, short_help="List approvals (pending ones by default).")
def list_(
    db: ReadDbOption = DEFAULT_DB,
    status: Annotated[
        str, typer.Option("--status", help=f"One of {', '.join(STATUSES)}.", show_default=True)
    ] = "pending",
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's.", show_default=False)
    ] = None,
    run: Annotated[
        str | None,
        typer.Option(
            "--run", help="Only what this root run waits on (its sub-agents' included).", show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List approvals, oldest first: id, agent, the call, why the policy asked, status.

    Reads the database without owning it, also while another process runs agents in it."""
    if status not in STATUSES:
        fail(f"--status must be one of {', '.join(STATUSES)}, not {status!r}", 2)
    found = execute(lambda: _list(db, status, agent, run))
    if as_json:
        typer.echo(json.dumps([_json(a) for a in found], indent=2, ensure_ascii=False))
        return
    if not found:
        err().print(RichText(f"no {'' if status == 'all' else status + ' '}approvals in {db}", style="dim"))
        return
    columns = ("id", "agent", "call", "why", "status", "requested")
    table = Records(columns, ids=("id", "agent"), keep=("status", "requested"))
    for a in found:
        when = datetime.datetime.fromtimestamp(a.created_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(a.id, a.agent_id, _call(a), a.reason, a.status, when)
    out().print(table)


async def _decide(
    db: str, approval_id: str, approve: bool, note: str | None, arguments: Any, by: str | None
) -> stead.Decision:
    store = owner_url(db, f"stead approvals {'approve' if approve else 'reject'}", create=False)
    async with stead.open(store, approvals=True, restore=False) as system:
        if approve:
            return await system.approve(approval_id, note=note, arguments=arguments, decided_by=by)
        return await system.reject(approval_id, note=note, decided_by=by)


def _report(decision: stead.Decision, verb: str) -> None:
    a = decision.approval
    if not decision.decided:
        who = f" by {a.decided_by}" if a.decided_by else ""
        why = f": {a.note}" if a.note else ""
        fail(f"approval {a.id} was already decided ({a.status}{who}{why}); the first decision stands")
    out().print(RichText(f"{verb} {a.id}: ", style="bold") + RichText(_call(a)))
    err().print(
        RichText(
            f"agent {a.agent_id} continues when its owner runs it "
            f"(e.g. stead run DEFINITION --agent {a.agent_id})",
            style="dim",
        )
    )


NoteOption = Annotated[
    str | None, typer.Option("--note", help="Why (kept with the decision).", show_default=False)
]
ByOption = Annotated[
    str | None, typer.Option("--by", help="Who decides (kept with the decision).", show_default=False)
]
IdArgument = Annotated[
    str, typer.Argument(metavar="APPROVAL_ID", help="The approval's id.", show_default=False)
]


@approvals_app.command(cls=SteadCommand, short_help="Approve a held call: it runs once.")
def approve(
    approval_id: IdArgument,
    db: WriteDbOption = DEFAULT_DB,
    note: NoteOption = None,
    arguments: Annotated[
        str | None,
        typer.Option(
            "--arguments", help="Run it with these arguments instead (a JSON object).", show_default=False
        ),
    ] = None,
    by: ByOption = None,
) -> None:
    """Approve APPROVAL_ID: the held call runs once, under its tool's own flags, when the agent's owner runs
    it. The first decision wins: a decided approval is reported, not changed (exit 1)."""
    edited: Any = None
    if arguments is not None:
        try:
            edited = json.loads(arguments)
        except json.JSONDecodeError as e:
            fail(f"--arguments is not JSON: {e.msg} at position {e.pos}", 2)
        if not isinstance(edited, dict):
            fail("--arguments must be a JSON object", 2)
    _report(execute(lambda: _decide(db, approval_id, True, note, edited, by)), "approved")


@approvals_app.command(cls=SteadCommand, short_help="Reject a held call: it never runs.")
def reject(
    approval_id: IdArgument, db: WriteDbOption = DEFAULT_DB, note: NoteOption = None, by: ByOption = None
) -> None:
    """Reject APPROVAL_ID: the call never runs; its error result "rejected by reviewer: NOTE" commits with
    the decision. The first decision wins (exit 1 when it was decided before)."""
    _report(execute(lambda: _decide(db, approval_id, False, note, None, by)), "rejected")


def print_waiting(approvals: list[stead.Approval], db: str) -> None:
    """What `stead run` prints when its agent stops to wait for decisions."""
    console = err()
    for a in approvals:
        console.print(
            RichText("waiting for approval: ", style="bold magenta") + RichText(f"{_call(a)} — {a.reason}")
        )
        console.print(RichText(f"  stead approvals approve {a.id} --db {db}   (or reject)", style="dim"))
