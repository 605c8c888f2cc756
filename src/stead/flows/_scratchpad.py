"""The scratchpad: private per-run notes and a task list, for loop agents that opt in
(`builtin_tools: [scratchpad]`).

It lives in the run KV (`kv.r.stead.scratchpad`), so it is private to the run — a sub-agent never sees its
parent's, nor the parent its child's — and is erased when the run settles. Both tools are `transactional`:
the change commits in the very transaction that commits the call's result, so the scratchpad the model is
told about is always the one stored, across crashes too. The instructions template sees it as `scratchpad`
(`notes`, `tasks`, `summary`, `markdown`), re-rendered before every model request.

Tasks are upserted by id with a status (`pending`, `in_progress`, `completed`, `blocked`). Over
`MAX_TASKS` (50) tasks, the oldest completed ones are pruned (by the order they were completed in), so a long
run's list stays short; open tasks are never pruned.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stead.extend import InvalidInput, Tool, ToolContext, Tx, dumps, tool

__all__ = [
    "MAX_TASKS",
    "SCRATCHPAD_KEY",
    "TaskUpdate",
    "apply_tasks",
    "read_scratchpad",
    "scratchpad_tools",
    "view",
]

SCRATCHPAD_KEY = "kv.r.stead.scratchpad"
MAX_TASKS = 50
MAX_NOTES_CHARS = 20_000
STATUSES = ("pending", "in_progress", "completed", "blocked")
Status = Literal["pending", "in_progress", "completed", "blocked"]


class TaskUpdate(BaseModel):
    """One task to add or change (by `id`)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)
    title: str | None = Field(default=None, max_length=500)
    status: Status | None = None


def empty() -> dict[str, Any]:
    return {"notes": "", "tasks": [], "seq": 0}


async def read_scratchpad(tx: Tx, agent_id: str) -> dict[str, Any]:
    raw = await tx.get(agent_id, SCRATCHPAD_KEY)
    return json.loads(raw) if raw is not None else empty()


def apply_tasks(
    pad: dict[str, Any], upsert: list[TaskUpdate], remove: list[str]
) -> tuple[dict[str, Any], int]:
    """The scratchpad with the tasks upserted and removed, then pruned to `MAX_TASKS`; and how many completed
    tasks were pruned."""
    tasks: list[dict[str, Any]] = [dict(t) for t in pad.get("tasks", [])]
    seq = int(pad.get("seq", 0))
    by_id = {t["id"]: t for t in tasks}
    for u in upsert:
        task = by_id.get(u.id)
        if task is None:
            if u.title is None:
                raise InvalidInput(f"task {u.id!r} is new: give it a title")
            task = {"id": u.id, "title": u.title, "status": u.status or "pending"}
            tasks.append(task)
            by_id[u.id] = task
        else:
            if u.title is not None:
                task["title"] = u.title
            if u.status is not None:
                task["status"] = u.status
        if task["status"] == "completed" and "done" not in task:
            seq += 1
            task["done"] = seq  # the order tasks were completed in (what pruning goes by)
        elif task["status"] != "completed":
            task.pop("done", None)
    gone = set(remove)
    tasks = [t for t in tasks if t["id"] not in gone]
    pruned = 0
    if len(tasks) > MAX_TASKS:
        completed = sorted((t for t in tasks if t["status"] == "completed"), key=lambda t: t["done"])
        drop = {t["id"] for t in completed[: len(tasks) - MAX_TASKS]}
        pruned = len(drop)
        tasks = [t for t in tasks if t["id"] not in drop]
    return {**pad, "tasks": tasks, "seq": seq}, pruned


def view(pad: dict[str, Any]) -> dict[str, Any]:
    """What the instructions template sees as `scratchpad`."""
    tasks = [{k: t[k] for k in ("id", "title", "status")} for t in pad.get("tasks", [])]
    done = sum(1 for t in tasks if t["status"] == "completed")
    summary = f"{done} of {len(tasks)} tasks complete" if tasks else "no tasks"
    marks = {"pending": " ", "in_progress": "~", "completed": "x", "blocked": "!"}
    lines = [f"- [{marks[t['status']]}] {t['id']}: {t['title']} ({t['status']})" for t in tasks]
    return {"notes": pad.get("notes", ""), "tasks": tasks, "summary": summary, "markdown": "\n".join(lines)}


def _tx(ctx: ToolContext) -> Tx:
    tx = ctx.tx
    assert tx is not None, "scratchpad tools are transactional"
    return tx


def scratchpad_tools() -> list[Tool]:
    async def scratchpad_notes(ctx: ToolContext, notes: str) -> str:
        """Replace your private notes for this run (they are shown to you in your instructions).

        Args:
            notes: The whole new text of your notes.
        """
        if len(notes) > MAX_NOTES_CHARS:
            raise InvalidInput(f"notes are limited to {MAX_NOTES_CHARS:,} characters (got {len(notes):,})")
        tx = _tx(ctx)
        pad = await read_scratchpad(tx, ctx.agent_id)
        pad["notes"] = notes
        await tx.write(ctx.agent_id, SCRATCHPAD_KEY, dumps(pad))
        return f"Notes saved ({len(notes):,} characters)."

    async def scratchpad_tasks(
        ctx: ToolContext,
        upsert: list[TaskUpdate] | None = None,
        remove: list[str] | None = None,
    ) -> str:
        """Add, update or remove tasks of your private task list for this run.

        Args:
            upsert: Tasks to add (id, title, status) or change (id and the fields to change). Statuses:
                pending, in_progress, completed, blocked.
            remove: Ids of tasks to remove.
        """
        tx = _tx(ctx)
        pad = await read_scratchpad(tx, ctx.agent_id)
        pad, pruned = apply_tasks(pad, list(upsert or []), list(remove or []))
        await tx.write(ctx.agent_id, SCRATCHPAD_KEY, dumps(pad))
        shown = view(pad)
        note = (
            f" ({pruned} oldest completed task(s) pruned: the list keeps at most {MAX_TASKS})"
            if pruned
            else ""
        )
        return f"{shown['summary']}{note}.\n{shown['markdown']}".rstrip()

    return [
        tool(name="scratchpad_notes", transactional=True)(scratchpad_notes),
        tool(name="scratchpad_tasks", transactional=True)(scratchpad_tasks),
    ]
