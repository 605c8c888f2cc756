"""The queries that read run records back into `stead.Run` / `stead.Step` trees (defined in `stead._runs`)."""

from __future__ import annotations

import json
from typing import Any

from stead.extend import Run, RunNotFound, Step, Store, Tx
from stead.observability.records import TOTALS

__all__ = ["Run", "Step", "get_run", "list_runs", "page_runs"]


_RUN_COLS = (
    "id, agent_id, agent_name, parent_run_id, parent_step_id, session_id, conversation_id, status, "
    "started_at, completed_at, error, final_message, input_tokens, output_tokens, cached_tokens, cost, "
    "child_input_tokens, child_output_tokens, child_cached_tokens, child_cost, iterations, restarts, "
    "breadcrumb, "
    "(SELECT COALESCE(MAX(s.estimated), 0) FROM run_steps s WHERE s.run_id = runs.id AND s.type = 'prompt'), "
    "(SELECT COUNT(s.input_tokens) FROM run_steps s WHERE s.run_id = runs.id AND s.type = 'prompt')"
)
_STEP_COLS = (
    "id, run_id, number, type, name, status, started_at, completed_at, target, target_run_id, "
    "target_log_id, parent_step_id, error, input_json, output_json, reason, input_tokens, output_tokens, "
    "cached_tokens, cost, estimated"
)


def _run(row: tuple[Any, ...], steps: list[Step] | None = None, children: list[Run] | None = None) -> Run:
    (rid, aid, name, prun, pstep, session, conv, status, started, completed, error, final) = row[:12]
    inp, out, cached, cost, cinp, cout, ccached, ccost, iterations, restarts, breadcrumb = row[12:23]
    estimated, measured = (row[23], row[24]) if len(row) > 24 else (0, 1)
    return Run(
        id=rid,
        agent_id=aid,
        agent_name=name,
        parent_run_id=prun,
        parent_step_id=pstep,
        session_id=session,
        conversation_id=conv,
        status=status,
        started_at=started,
        completed_at=completed,
        error=error,
        final_message=final,
        input_tokens=int(inp) + int(cinp),
        output_tokens=int(out) + int(cout),
        cached_tokens=int(cached) + int(ccached),
        cost=float(cost) + float(ccost),
        own_input_tokens=int(inp),
        own_output_tokens=int(out),
        own_cached_tokens=int(cached),
        own_cost=float(cost),
        iterations=int(iterations),
        restarts=int(restarts),
        breadcrumb=breadcrumb,
        usage_estimated=bool(estimated),
        usage_unknown=int(iterations) > 0 and not measured,
        steps=steps if steps is not None else [],
        children=children if children is not None else [],
    )


def _loads(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _prompt_output(row: tuple[Any, ...]) -> Any:
    """A prompt step's output — its finish reason and usage — from its prompt-run columns (the recorder
    writes `output_json` only for a retried inference, whose columns hold the sums of all attempts)."""
    reason, inp, out, cached, cost = row[15:20]
    output: dict[str, Any] = {"reason": reason}
    if inp is not None:  # NULL tokens: a response without usage
        output["usage"] = {
            "input_tokens": int(inp),
            "output_tokens": int(out),
            "cached_tokens": int(cached),
            "cost": cost,
        }
        if len(row) > 20 and row[20]:
            output["usage"]["estimated"] = True
    return output


def _step(row: tuple[Any, ...]) -> Step:
    prompt = row[3] == "prompt"
    return Step(
        id=row[0],
        run_id=row[1],
        number=int(row[2]),
        type=row[3],
        name=row[4],
        status=row[5],
        started_at=row[6],
        completed_at=row[7],
        target=row[8],
        target_run_id=row[9],
        target_log_id=row[0] if prompt and row[10] is None else row[10],
        parent_step_id=row[11],
        error=row[12],
        input=_loads(row[13]),
        output=_prompt_output(row) if prompt and row[14] is None and row[15] is not None else _loads(row[14]),
    )


async def _live(tx: Tx, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A running run's totals are summed from its prompt steps (they are stored at settlement)."""
    out = []
    for r in rows:
        if r[7] == "running":
            (totals,) = await tx.fetch(TOTALS, (r[0],))
            r = (*r[:12], *totals[:4], *r[16:20], totals[4], *r[21:])
        out.append(r)
    return out


async def list_runs(store: Store, agent_id: str | None = None, limit: int = 50) -> list[Run]:
    """Runs, newest first (optionally of one agent), without steps or children."""
    limit = max(0, int(limit))
    async with store.transaction() as tx:
        if agent_id is None:
            rows = await tx.fetch(
                f"SELECT {_RUN_COLS} FROM runs ORDER BY started_at DESC, id DESC LIMIT ?", (limit,)
            )
        else:
            rows = await tx.fetch(
                f"SELECT {_RUN_COLS} FROM runs WHERE agent_id = ? ORDER BY started_at DESC, id DESC LIMIT ?",
                (agent_id, limit),
            )
        rows = await _live(tx, rows)
    return [_run(r) for r in rows]


async def page_runs(store: Store, where: str, params: list[Any], limit: int) -> list[Run]:
    """`RunReader.runs_page`: the runs a `page_query` selects (live totals for running ones)."""
    async with store.transaction() as tx:
        rows = await tx.fetch(f"SELECT {_RUN_COLS} FROM runs{where} LIMIT ?", (*params, max(0, int(limit))))
        rows = await _live(tx, rows)
    return [_run(r) for r in rows]


_TREE = (
    "WITH RECURSIVE tree(id) AS (SELECT id FROM runs WHERE id = ? "
    "UNION SELECT r.id FROM runs r JOIN tree t ON r.parent_run_id = t.id) "
)


async def get_run(store: Store, run_id: str) -> Run:
    """The run with its steps and its descendant runs (each with theirs); raises `RunNotFound`."""
    async with store.transaction() as tx:
        rows = await tx.fetch(
            f"{_TREE}SELECT {_RUN_COLS} FROM runs WHERE id IN (SELECT id FROM tree)", (run_id,)
        )
        rows = await _live(tx, rows)
        step_rows = (
            await tx.fetch(
                f"{_TREE}SELECT {_STEP_COLS} FROM run_steps WHERE run_id IN (SELECT id FROM tree) "
                "ORDER BY run_id, number",
                (run_id,),
            )
            if rows
            else []
        )
    if not any(r[0] == run_id for r in rows):
        raise RunNotFound(f"no run with id {run_id!r}")
    steps: dict[str, list[Step]] = {}
    for sr in step_rows:
        steps.setdefault(sr[1], []).append(_step(sr))
    by_parent: dict[str | None, list[tuple[Any, ...]]] = {}
    for r in rows:
        by_parent.setdefault(r[3], []).append(r)

    def build(row: tuple[Any, ...]) -> Run:
        kids = sorted(by_parent.get(row[0], []), key=lambda c: (c[8], c[0]))
        return _run(row, steps.get(row[0], []), [build(k) for k in kids if k[0] != row[0]])

    root = next(r for r in rows if r[0] == run_id)
    return build(root)
