"""`stead runs` and `stead runs show`: recorded runs as a table and as a tree."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text as RichText
from rich.tree import Tree

import stead
from stead.cli._common import (
    DEFAULT_DB,
    ReadDbOption,
    Records,
    SteadCommand,
    SteadGroup,
    err,
    execute,
    inspect_db,
    wide,
)
from stead.cli._render import one_line
from stead.extend import run_json, step_json

__all__ = ["runs_app", "runs_table"]

# ---------------------------------------------------------------------------------------------------- runs
runs_app = typer.Typer(
    help="Recorded runs: list them, or show one as a tree (`stead runs show RUN_ID`).",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=SteadGroup,
)


async def _list_runs(db: str, agent_id: str | None, limit: int) -> list[stead.Run]:
    async with inspect_db(db) as system:
        return await system.runs(agent_id=agent_id, limit=limit)


async def _show_run(db: str, run_id: str) -> stead.Run:
    async with inspect_db(db) as system:
        return await system.run(run_id)


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _tokens(r: stead.Run) -> str:
    """`in/out` tokens; `~1,234/~56` when stead estimated them (the server reported none); `?/?` when
    nothing is known — never a false 0."""
    if r.usage_unknown:
        return "?/?"
    if r.usage_estimated:
        return f"~{r.input_tokens:,}/~{r.output_tokens:,}"
    return f"{r.input_tokens}/{r.output_tokens}"


def _cost(value: float) -> str:
    return f"${value:.4f}" if value else "—"


def cost_json(value: float) -> float | None:
    """A run's cost in JSON: None (null) where the table prints `—` (no priced usage), never a false 0."""
    return value if value else None


def shown_model(target: str) -> str:
    """A step's model as shown: a scripted model file by its path relative to the working directory (its
    name alone when it lies outside), not an absolute path of a hundred characters."""
    if not target.startswith("scripted:"):
        return target
    path = target.removeprefix("scripted:")
    if not os.path.isabs(path):
        return target
    try:
        relative = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive (Windows)
        relative = path
    return f"scripted:{Path(path).name if relative.startswith('..') else relative}"


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "awaiting_input": "magenta",
}


_RUN_FIELDS = (
    "id",
    "agent_id",
    "agent_name",
    "parent_run_id",
    "status",
    "started_at",
    "completed_at",
    "duration",
    "error",
    "final_message",
    "input_tokens",
    "output_tokens",
    "usage_estimated",
    "usage_unknown",
    "cost",
)
_STEP_FIELDS = ("id", "number", "type", "name", "status", "target", "target_run_id", "duration", "error")


def _run_json(r: stead.Run) -> dict[str, Any]:
    """What `--json` prints of a run: fields of its one JSON form (`run_json`), `cost` null where the table
    prints `—`, with its steps and child runs."""
    full = run_json(r)
    out = {k: full[k] for k in _RUN_FIELDS}
    out["cost"] = cost_json(r.cost)
    steps = [step_json(st) for st in r.steps]
    out["steps"] = [{k: st[k] for k in _STEP_FIELDS} for st in steps]
    out["children"] = [_run_json(c) for c in r.children]
    return out


@runs_app.callback(invoke_without_command=True, cls=SteadGroup)
def runs(
    ctx: typer.Context,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="ID", help="Only the runs of this agent id.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", help="At most this many runs (newest first).", min=1)
    ] = 20,
    db: ReadDbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List recent runs: agent, status, duration, tokens and cost (sub-agent runs included).

    Reads the database without owning it, also while another process runs agents in it."""
    if ctx.invoked_subcommand is not None:
        return
    found = execute(lambda: _list_runs(db, agent, limit))
    if as_json:
        typer.echo(json.dumps([_run_json(r) for r in found], indent=2, ensure_ascii=False))
        return
    if not found:
        err().print(RichText(f"no runs in {db}", style="dim"))
        return
    wide().print(runs_table(found))


def runs_table(found: list[stead.Run]) -> Records:
    """Runs as `stead runs` shows them (also `/runs` in `stead chat`): run ids whole at any width."""
    table = Records(
        ("run", "agent", "status", "started", "duration", "tokens in/out", "cost"),
        ids=("run",),
        keep=("status",),
    )
    for r in found:
        started = datetime.datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M:%S")
        status = RichText(r.status, style=_STATUS_STYLE.get(r.status, ""))
        table.add_row(
            r.id,
            r.breadcrumb or r.agent_name or r.agent_id,
            status,
            started,
            _seconds(r.duration),
            _tokens(r),
            _cost(r.cost),
        )
    return table


def _run_label(r: stead.Run) -> RichText:
    label = RichText()
    label.append(r.agent_name or r.agent_id, style="bold")
    label.append(f"  run {r.id}  ", style="dim")
    label.append(r.status, style=_STATUS_STYLE.get(r.status, ""))
    label.append(f"  {_seconds(r.duration)}  tokens {_tokens(r)}  {_cost(r.cost)}")
    if r.restarts:
        label.append(f"  resumed ×{r.restarts}", style="yellow")
    if r.error:
        label.append(f"\nerror: {one_line(r.error)}", style="red")
    return label


def _step_label(st: stead.Step) -> RichText:
    label = RichText()
    label.append(f"{st.number}. ", style="dim")
    label.append(
        st.type, style="magenta" if st.type == "sub_agent" else ("red" if st.type == "guardrail" else "cyan")
    )
    name = st.name or (shown_model(st.target) if st.target else "")
    label.append(f" {name}")
    if st.target and st.type == "prompt":
        label.append(f" ({shown_model(st.target)})", style="dim")
    label.append("  ")
    label.append(st.status, style=_STATUS_STYLE.get(st.status, ""))
    label.append(f"  {_seconds(st.duration)}")
    usage = st.output.get("usage") if isinstance(st.output, dict) else None
    if isinstance(usage, dict):
        mark = "~" if usage.get("estimated") else ""
        label.append(f"  tokens {mark}{usage.get('input_tokens', 0)}/{mark}{usage.get('output_tokens', 0)}")
        if usage.get("cost"):
            label.append(f"  {_cost(float(usage['cost']))}")
    elif st.type == "prompt" and st.status != "running":
        label.append("  tokens ?")
    out = st.output
    if st.type == "prompt" and isinstance(out, dict) and out.get("reason") == "length":
        label.append("  cut off at the output cap", style="yellow")  # MR2
    if st.type == "compaction" and isinstance(out, dict):
        label.append(f"  ~{out.get('tokens_before', 0):,} → ~{out.get('tokens_after', 0):,} tokens")
    if st.error:
        label.append(f"  {one_line(st.error)}", style="red")
    return label


def _tree(r: stead.Run, tree: Tree | None = None) -> Tree:
    node = Tree(_run_label(r)) if tree is None else tree.add(_run_label(r))
    children = {c.id: c for c in r.children}
    for st in r.steps:
        step_node = node.add(_step_label(st))
        child = children.pop(st.target_run_id, None) if st.target_run_id else None
        if child is not None:
            _tree(child, step_node)
    for c in children.values():  # child runs not linked to a step
        _tree(c, node)
    return node


@runs_app.command("show", cls=SteadCommand, short_help="Print a run as a tree of steps and sub-agent runs.")
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run's id.", show_default=False)],
    db: ReadDbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run tree as JSON.")] = False,
) -> None:
    """Print a run as a tree: its steps with timings, tokens and cost, sub-agent runs indented under the
    step that delegated to them."""
    found = execute(lambda: _show_run(db, run_id))
    if as_json:
        typer.echo(json.dumps(_run_json(found), indent=2, ensure_ascii=False))
        return
    wide().print(_tree(found))
    if found.final_message:
        wide().print(RichText("final message: ", style="bold") + RichText(one_line(found.final_message, 300)))


# ---------------------------------------------------------------------------------------------------- history
