"""Run records (docs/observability.md): `runs` and `run_steps` (with the `prompt_runs` view over its prompt
steps), written by `RunRecorder` hooks.

Every row is written inside the kernel's own transaction for the change it describes (the hook's `ctx.tx`),
so a record commits exactly when its state change does and a rollback or crash leaves no stray row. The
recorder adds no commits; per response it adds two statements and never reads on that path (step numbers
and step-name breadcrumbs are computed inside the INSERT).

Linking a child run to its parent: the message that activates the child carries
`metadata["stead.parent"] = {"run_id", "step_id", "agent_id", "session_id"?, "breadcrumb"?, "traceparent"?}`
(see docs/observability.md). The recorder stores the link on the child's run row, points the parent's step
at the child run (`target_run_id`), and at the child's settlement adds its tokens and cost to every
ancestor's `child_*` columns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stead.extend import (
    SESSION_KEY,
    AwaitingInputInfo,
    BlockInfo,
    CallDecidedInfo,
    CompactionInfo,
    HookContext,
    Hooks,
    ResponseInfo,
    SettledInfo,
    Text,
    ToolDispatchedInfo,
    ToolResultInfo,
    Tx,
    Usage,
    new_id,
    parent_link,
    record_step,
)

__all__ = ["MIGRATIONS", "PG_MIGRATIONS", "RECORDS_MODULE", "RecordsWriter", "RunRecorder"]

SEPARATOR = " → "
_NO_USAGE = (None, None, None, None)

RECORDS_MODULE = "observability"
"""The schema module of the run-record tables."""

# Migration scripts are split on ';' by the store: no semicolons inside statements.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        agent_name TEXT,
        breadcrumb TEXT,
        parent_run_id TEXT,
        parent_step_id TEXT,
        session_id TEXT,
        conversation_id TEXT,
        message_id TEXT,
        status TEXT NOT NULL,
        started_at REAL NOT NULL,
        completed_at REAL,
        final_message TEXT,
        error TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        child_input_tokens INTEGER NOT NULL DEFAULT 0,
        child_output_tokens INTEGER NOT NULL DEFAULT 0,
        child_cached_tokens INTEGER NOT NULL DEFAULT 0,
        child_cost REAL NOT NULL DEFAULT 0,
        iterations INTEGER NOT NULL DEFAULT 0,
        restarts INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_by_agent ON runs(agent_id, started_at);
    CREATE INDEX runs_by_start ON runs(started_at);
    CREATE INDEX runs_by_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;
    CREATE TABLE run_steps (
        run_id TEXT NOT NULL,
        number INTEGER NOT NULL,
        id TEXT NOT NULL,
        parent_step_id TEXT,
        type TEXT NOT NULL,
        name TEXT,
        target TEXT,
        target_run_id TEXT,
        target_log_id TEXT,
        status TEXT NOT NULL,
        started_at REAL NOT NULL,
        completed_at REAL,
        input_json TEXT,
        output_json TEXT,
        error TEXT,
        provider TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        cached_tokens INTEGER,
        cost REAL,
        latency_ms REAL,
        ttft_ms REAL,
        reason TEXT,
        attempts INTEGER,
        PRIMARY KEY (run_id, number)
    ) WITHOUT ROWID;
    CREATE VIEW prompt_runs AS SELECT
        run_id,
        id,
        (SELECT agent_id FROM runs WHERE runs.id = run_steps.run_id) AS agent_id,
        target AS model,
        provider,
        COALESCE(input_tokens, 0) AS input_tokens,
        COALESCE(output_tokens, 0) AS output_tokens,
        COALESCE(cached_tokens, 0) AS cached_tokens,
        cost,
        latency_ms,
        ttft_ms,
        reason,
        error,
        started_at,
        completed_at,
        attempts
    FROM run_steps WHERE type = 'prompt'
    """,
    # 2: a prompt step whose usage stead estimated (the server reported none): shown as `~1,234`
    """
    ALTER TABLE run_steps ADD COLUMN estimated INTEGER
    """,
]


def _postgres(script: str) -> str:
    """The PostgreSQL form of a records migration: floating-point columns, no `WITHOUT ROWID`."""
    return script.replace(" REAL", " DOUBLE PRECISION").replace(") WITHOUT ROWID", ")")


PG_MIGRATIONS: list[str] = [_postgres(script) for script in MIGRATIONS]
"""The same migrations in PostgreSQL's dialect (append to both lists together)."""


def _dumps(value: Any) -> str:
    return _encode(value)


# built once (`json.dumps` with options builds an encoder per call); see `stead.messages.dumps`
_encode = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, default=str, check_circular=False
).encode


def _label(ctx: HookContext) -> str:
    return ctx.agent_name or ctx.agent_id


_STEP_VALUES = (
    "SELECT ?, ?, ?, COALESCE(MAX(number), 0) + 1, ?, "
    "COALESCE((SELECT breadcrumb || ': ' FROM runs WHERE id = ?), '') || ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
    "FROM run_steps WHERE run_id = ?"
)
_STEP_COLS = (
    "INSERT INTO run_steps(id, run_id, parent_step_id, number, type, name, target, target_run_id, "
    "target_log_id, status, started_at, completed_at, input_json, output_json, error) "
)
_INSERT_STEP = _STEP_COLS + _STEP_VALUES
# The hot path's inserts (a named step of a run this process activated) take the next number from a scalar
# subquery, which SQLite answers with one seek to the run's last step (the max optimization); an aggregate
# in `INSERT ... SELECT` reads every step of the run. Parameters: id, run_id, run_id (the subquery's), ...
_NEXT_NUMBER = "COALESCE((SELECT MAX(number) FROM run_steps WHERE run_id = ?), 0) + 1"
_INSERT_NAMED_STEP = _STEP_COLS + f"VALUES (?, ?, ?, {_NEXT_NUMBER}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# A prompt step is also the inference's prompt run (the `prompt_runs` view): its id is the inference id, its
# target the model; `target_log_id` and `output_json` stay NULL (both are derived from the columns on read).
_PROMPT_COLS = (
    "INSERT INTO run_steps(id, run_id, number, type, name, target, status, started_at, completed_at, error, "
    "provider, input_tokens, output_tokens, cached_tokens, cost, latency_ms, ttft_ms, reason, attempts) "
)
_PROMPT_TAIL = "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1 FROM run_steps WHERE run_id = ?"
_INSERT_NAMED_PROMPT = (
    _PROMPT_COLS + f"VALUES (?, ?, {_NEXT_NUMBER}, 'prompt', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"
)
# A retried inference keeps its id: its prompt step is inserted once, later attempts update it.
_INSERT_PROMPT = (
    _PROMPT_COLS + "SELECT * FROM (SELECT ?, ?, COALESCE(MAX(number), 0) + 1, 'prompt', "
    "COALESCE((SELECT breadcrumb || ': ' FROM runs WHERE id = ?), '') || 'prompt', " + _PROMPT_TAIL + ") "
    "WHERE NOT EXISTS (SELECT 1 FROM run_steps WHERE run_id = ? AND id = ?)"
)
# PostgreSQL: a subquery's untyped parameters resolve to text (and need an alias); the same row through
# HAVING on the aggregate, whose parameters take the inserted columns' types.
_INSERT_PROMPT_PG = (
    _PROMPT_COLS + "SELECT ?, ?, COALESCE(MAX(number), 0) + 1, 'prompt', "
    "COALESCE((SELECT breadcrumb || ': ' FROM runs WHERE id = ?), '') || 'prompt', " + _PROMPT_TAIL + " "
    "HAVING NOT EXISTS (SELECT 1 FROM run_steps WHERE run_id = ? AND id = ?)"
)
# Later attempts add their tokens and cost; the step's output keeps the last attempt's reason and usage
# (written out only here: the columns hold the sums).
_UPDATE_PROMPT = (
    "UPDATE run_steps SET status = ?, completed_at = ?, output_json = ?, error = ?, "
    "input_tokens = COALESCE(input_tokens, 0) + ?, output_tokens = COALESCE(output_tokens, 0) + ?, "
    "cached_tokens = COALESCE(cached_tokens, 0) + ?, "
    "cost = CASE WHEN CAST(? AS DOUBLE PRECISION) IS NULL THEN cost ELSE COALESCE(cost, 0) + ? END, "
    "latency_ms = ?, ttft_ms = ?, reason = ?, attempts = COALESCE(attempts, 0) + 1 "
    "WHERE run_id = ? AND id = ?"
)
# Totals are summed from the run's prompt steps at settlement (the hot path never touches the runs row);
# `stead.observability.queries` sums them live for a run still running.
TOTALS = (
    "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
    "COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(cost), 0), COALESCE(SUM(attempts), 0) "
    "FROM run_steps WHERE run_id = ? AND type = 'prompt'"
)
_SETTLE_RUN = (
    "UPDATE runs SET status = ?, completed_at = ?, error = ?, "
    f"(input_tokens, output_tokens, cached_tokens, cost, iterations) = ({TOTALS}) WHERE id = ?"
)
_ROLL_UP = (
    "WITH RECURSIVE anc(id) AS ("
    "SELECT parent_run_id FROM runs WHERE id = ? AND parent_run_id IS NOT NULL "
    "UNION SELECT r.parent_run_id FROM runs r JOIN anc ON r.id = anc.id WHERE r.parent_run_id IS NOT NULL) "
    "UPDATE runs SET "
    "child_input_tokens = child_input_tokens + (SELECT input_tokens FROM runs WHERE id = ?), "
    "child_output_tokens = child_output_tokens + (SELECT output_tokens FROM runs WHERE id = ?), "
    "child_cached_tokens = child_cached_tokens + (SELECT cached_tokens FROM runs WHERE id = ?), "
    "child_cost = child_cost + (SELECT cost FROM runs WHERE id = ?) "
    "WHERE id IN (SELECT id FROM anc)"
)


class RecordsWriter:
    """The `StepWriter` of the run-record tables (`stead.extend.record_step` and the others hand their writes
    here when this plugin keeps the store's records): every statement runs inside the caller's `tx`."""

    async def write_step(self, tx: Tx, run_id: str, sid: str, type: str, name: str, **fields: Any) -> None:
        status: str = fields.get("status", "completed")
        started_at = fields.get("started_at")
        completed_at = fields.get("completed_at")
        inp, out = fields.get("input"), fields.get("output")
        now = time.time()
        done = completed_at if completed_at is not None else (None if status == "running" else now)
        await tx.write_sql(
            _INSERT_STEP,
            (
                sid,
                run_id,
                fields.get("parent_step_id"),
                type,
                run_id,
                name,
                fields.get("target"),
                fields.get("target_run_id"),
                fields.get("target_log_id"),
                status,
                started_at if started_at is not None else now,
                done,
                None if inp is None else _dumps(inp),
                None if out is None else _dumps(out),
                fields.get("error"),
                run_id,
            ),
        )

    async def rename_step(self, tx: Tx, run_id: str, step_id: str, name: str) -> None:
        await tx.write_sql(
            "UPDATE run_steps SET name = COALESCE((SELECT breadcrumb || ': ' FROM runs WHERE id = ?), '') "
            "|| ? WHERE run_id = ? AND id = ?",
            (run_id, name, run_id, step_id),
        )

    async def record_run(self, tx: Tx, run_id: str, agent_id: str, **fields: Any) -> None:
        agent_name: str | None = fields.get("agent_name")
        started_at = fields.get("started_at")
        await tx.write_sql(
            "INSERT INTO runs(id, agent_id, agent_name, breadcrumb, session_id, conversation_id, status, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?, 'running', ?) ON CONFLICT(id) DO NOTHING",
            (
                run_id,
                agent_id,
                agent_name,
                agent_name or agent_id,
                fields.get("session_id"),
                agent_id,
                started_at if started_at is not None else time.time(),
            ),
        )

    async def update_step(self, tx: Tx, run_id: str, step_id: str, **fields: Any) -> None:
        sets: list[str] = []
        params: list[Any] = []
        status = fields.get("status")
        if status is not None:
            sets.append("status = ?")
            params.append(status)
            if status != "running":
                completed_at = fields.get("completed_at")
                sets.append("completed_at = ?")
                params.append(completed_at if completed_at is not None else time.time())
        if fields.get("input") is not None:
            sets.append("input_json = ?")
            params.append(_dumps(fields["input"]))
        if fields.get("output") is not None:
            sets.append("output_json = ?")
            params.append(_dumps(fields["output"]))
        if fields.get("error") is not None:
            sets.append("error = ?")
            params.append(fields["error"])
        if fields.get("provider") is not None:
            sets.append("provider = ?")
            params.append(fields["provider"])
        if fields.get("target_run_id") is not None:
            sets.append("target_run_id = ?")
            params.append(fields["target_run_id"])
        usage: Usage | None = fields.get("usage")
        if usage is not None:
            sets.append("input_tokens = ?, output_tokens = ?, cached_tokens = ?, cost = ?, attempts = 1")
            params.extend((usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.cost))
        if not sets:
            return
        await tx.write_sql(
            f"UPDATE run_steps SET {', '.join(sets)} WHERE run_id = ? AND id = ?", (*params, run_id, step_id)
        )

    async def end_run(
        self, tx: Tx, run_id: str, *, status: str, error: str | None, final_message: str | None
    ) -> None:
        now = time.time()
        if final_message is not None:
            await tx.write_sql("UPDATE runs SET final_message = ? WHERE id = ?", (final_message, run_id))
        await tx.write_sql(_SETTLE_RUN, (status, now, error, run_id, run_id))
        await tx.write_sql(
            "UPDATE run_steps SET status = ?, completed_at = ?, error = COALESCE(error, ?) "
            "WHERE run_id = ? AND status = 'running'",
            ("completed" if status == "completed" else "failed", now, error, run_id),
        )
        await tx.write_sql(_ROLL_UP, (run_id, run_id, run_id, run_id, run_id))


@dataclass(slots=True)
class _Live:
    """What this process knows about a run it records (published after commits): its breadcrumb, so step
    names need no lookup, and the inferences already recorded, so a prompt step needs no existence check
    unless its inference is retried. A run resumed after a restart is `guarded`: every prompt step checks."""

    breadcrumb: str | None
    guarded: bool
    root: bool = False
    """The run row was inserted by this process without a parent (the roll-up at settlement is a no-op)."""
    prompts: set[str] = field(default_factory=set)


class RunRecorder(Hooks):
    """Hooks that write run records; installed by `RecordsPlugin` (`stead.open(..., records=True)`, the
    default), which also creates their tables.

    `is_sub_agent(tool_name)` tells which tools delegate to a sub-agent; their steps get type `sub_agent`
    (by default: tools whose `metadata["stead.step_type"]` is `"sub_agent"`).
    """

    def __init__(self, is_sub_agent: Callable[[str], bool] | None = None) -> None:
        self.is_sub_agent = is_sub_agent
        self._live: dict[str, _Live] = {}

    def _publish(self, tx: Tx, run_id: str, live: _Live) -> None:
        tx.after_commit(lambda: self._live.__setitem__(run_id, live))

    # -- activation ------------------------------------------------------------------------------
    async def activated_tx(self, ctx: HookContext) -> None:
        tx, run_id = ctx.tx, ctx.run_id
        if tx is None or run_id is None:
            return
        now = time.time()
        if ctx.restored:
            # The run row was written at acceptance; count the restart. (If records were switched on while
            # the run was in flight, the row is created here without the parent link.)
            await tx.write_sql(
                "INSERT INTO runs(id, agent_id, agent_name, breadcrumb, conversation_id, status, started_at, "
                "restarts) VALUES (?, ?, ?, ?, ?, 'running', ?, 1) "
                "ON CONFLICT(id) DO UPDATE SET restarts = runs.restarts + 1",
                (run_id, ctx.agent_id, ctx.agent_name, _label(ctx), ctx.agent_id, now),
            )
            rows = await tx.fetch("SELECT breadcrumb FROM runs WHERE id = ?", (run_id,))
            self._publish(tx, run_id, _Live(rows[0][0] if rows else None, guarded=True))
            return
        message = ctx.message
        metadata = message.metadata if message is not None else None
        link = parent_link(metadata)
        parent_run_id = parent_step_id = session_id = None
        breadcrumb = _label(ctx)
        if link is not None:
            parent_run_id = link["run_id"]
            parent_step_id = link.get("step_id") if isinstance(link.get("step_id"), str) else None
            session_id = link.get("session_id") if isinstance(link.get("session_id"), str) else None
            crumbs = link.get("breadcrumb")
            prefix: str | None = None
            if isinstance(crumbs, list) and crumbs and all(isinstance(c, str) for c in crumbs):
                prefix = SEPARATOR.join(crumbs)
            elif isinstance(crumbs, str) and crumbs:
                prefix = crumbs
            if prefix is None or session_id is None:
                # read what the link leaves out from the parent run (on delegation only, not the hot path)
                rows = await tx.fetch(
                    "SELECT breadcrumb, session_id FROM runs WHERE id = ?", (parent_run_id,)
                )
                if rows:
                    if prefix is None and rows[0][0]:
                        prefix = str(rows[0][0])
                    if session_id is None and rows[0][1] is not None:
                        session_id = str(rows[0][1])
            if prefix is not None:
                breadcrumb = prefix + SEPARATOR + breadcrumb
        elif metadata and isinstance(metadata.get(SESSION_KEY), str):
            session_id = metadata[SESSION_KEY]
        inserted = await tx.execute(
            "INSERT INTO runs(id, agent_id, agent_name, breadcrumb, parent_run_id, parent_step_id, "
            "session_id, conversation_id, message_id, status, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?) ON CONFLICT(id) DO NOTHING",
            (
                run_id,
                ctx.agent_id,
                ctx.agent_name,
                breadcrumb,
                parent_run_id,
                parent_step_id,
                session_id,
                ctx.agent_id,
                message.id if message is not None else None,
                now,
            ),
        )
        # a run this insert created without a parent has no ancestors to roll its totals up to
        root = inserted == 1 and parent_run_id is None
        self._publish(tx, run_id, _Live(breadcrumb, guarded=False, root=root))
        if parent_step_id is not None:
            await tx.write_sql(
                "UPDATE run_steps SET target_run_id = ? WHERE id = ? AND run_id = ?",
                (run_id, parent_step_id, parent_run_id),
            )

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        """SEC2: the agent's runs and their steps go with it (a re-created id starts with none)."""
        tx = ctx.tx
        if tx is None:
            return
        await tx.write_sql(
            "DELETE FROM run_steps WHERE run_id IN (SELECT id FROM runs WHERE agent_id = ?)", (ctx.agent_id,)
        )
        await tx.write_sql("DELETE FROM runs WHERE agent_id = ?", (ctx.agent_id,))

    # -- responses -------------------------------------------------------------------------------
    async def block_tx(self, ctx: HookContext, info: BlockInfo) -> None:
        block = info.block
        if ctx.tx is not None and ctx.run_id is not None and isinstance(block, Text) and block.text:
            await ctx.tx.write_sql("UPDATE runs SET final_message = ? WHERE id = ?", (block.text, ctx.run_id))

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        await self._prompt(ctx, info)
        if ctx.tx is not None and ctx.run_id is not None and info.usage is not None and info.usage.estimated:
            # the server reported no usage: stead's estimate, shown as `~1,234` (one more statement, only
            # for such servers)
            await ctx.tx.write_sql(
                "UPDATE run_steps SET estimated = 1 WHERE run_id = ? AND id = ?",
                (ctx.run_id, info.inference_id),
            )

    async def _prompt(self, ctx: HookContext, info: ResponseInfo) -> None:
        tx, run_id = ctx.tx, ctx.run_id
        if tx is None or run_id is None or not info.model_call:
            return  # no model was called (a flow engine's navigation): no prompt step
        u = info.usage
        latency = round((info.ended_at - info.started_at) * 1000, 3)
        ttft = (
            round((info.first_token_at - info.started_at) * 1000, 3)
            if info.first_token_at is not None
            else None
        )
        failed = info.error is not None or info.reason in ("error", "cancelled")
        status = ("cancelled" if info.reason == "cancelled" else "failed") if failed else "completed"
        inf = info.inference_id
        # the prompt run's fields: tokens stay NULL for a response without usage
        tail = (
            status,
            info.started_at,
            info.ended_at,
            info.error,
            info.provider,
            *((u.input_tokens, u.output_tokens, u.cached_tokens, u.cost) if u is not None else _NO_USAGE),
            latency,
            ttft,
            info.reason,
            run_id,
        )
        live = self._live.get(run_id)
        if live is not None and live.breadcrumb is not None and not live.guarded and inf not in live.prompts:
            # the common case: a fresh inference of a run this process activated — one plain INSERT
            await tx.write_sql(
                _INSERT_NAMED_PROMPT,
                (inf, run_id, run_id, f"{live.breadcrumb}: prompt", info.model, *tail[:-1]),
            )
            prompts = live.prompts
            tx.after_commit(lambda: prompts.add(inf))
            return
        insert = _INSERT_PROMPT_PG if tx.store.dialect == "postgresql" else _INSERT_PROMPT
        if not await tx.execute(insert, (inf, run_id, run_id, info.model, *tail, run_id, inf)):
            output: dict[str, Any] = {"reason": info.reason}
            inp, out, cached, cost = (0, 0, 0, None)
            if u is not None:
                inp, out, cached, cost = u.input_tokens, u.output_tokens, u.cached_tokens, u.cost
                output["usage"] = {
                    "input_tokens": inp,
                    "output_tokens": out,
                    "cached_tokens": cached,
                    "cost": cost,
                }
            await tx.write_sql(
                _UPDATE_PROMPT,
                (
                    status,
                    info.ended_at,
                    _dumps(output),
                    info.error,
                    inp,
                    out,
                    cached,
                    cost,
                    cost,
                    latency,
                    ttft,
                    info.reason,
                    run_id,
                    inf,
                ),
            )

    # -- tools -----------------------------------------------------------------------------------
    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        tx, run_id, calls = ctx.tx, ctx.run_id, info.calls
        if tx is None or run_id is None:
            return
        now = time.time()
        sub = self.is_sub_agent
        live = self._live.get(run_id)
        crumb = live.breadcrumb if live is not None else None
        for call in calls:
            kind = "sub_agent" if sub is not None and sub(call.name) else "tool"
            sid = call.id or new_id()
            # target, target_run_id, target_log_id, status, started_at, completed_at, input, output, error
            rest = (call.name, None, None, "running", now, None, _dumps(call.arguments), None, None)
            if crumb is not None:
                await tx.write_sql(
                    _INSERT_NAMED_STEP, (sid, run_id, None, run_id, kind, f"{crumb}: {call.name}", *rest)
                )
            else:
                await tx.write_sql(_INSERT_STEP, (sid, run_id, None, kind, run_id, call.name, *rest, run_id))

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        call, result = info.call, info.result
        if ctx.tx is None or call.id is None or ctx.run_id is None:
            return
        await ctx.tx.write_sql(
            "UPDATE run_steps SET status = ?, completed_at = ?, output_json = ?, error = ? "
            "WHERE run_id = ? AND id = ?",
            (
                "failed" if result.is_error else "completed",
                time.time(),
                _dumps(result.output),
                result.output if result.is_error else None,
                ctx.run_id,
                call.id,
            ),
        )

    # -- held calls (approvals) ------------------------------------------------------------------
    async def awaiting_input_tx(self, ctx: HookContext, info: AwaitingInputInfo) -> None:
        """The waiting step: held calls' steps and their run show `awaiting_input` until decided."""
        if ctx.tx is None or ctx.run_id is None:
            return
        for call in info.calls:
            await ctx.tx.write_sql(
                "UPDATE run_steps SET status = 'awaiting_input' WHERE run_id = ? AND id = ?",
                (ctx.run_id, call.id),
            )
        await ctx.tx.write_sql("UPDATE runs SET status = 'awaiting_input' WHERE id = ?", (ctx.run_id,))

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        if ctx.tx is None or ctx.run_id is None:
            return
        call, decision = info.call, info.decision
        status = (
            "running" if decision == "approved" else ("cancelled" if decision == "cancelled" else "failed")
        )
        await ctx.tx.write_sql(
            "UPDATE run_steps SET status = ? WHERE run_id = ? AND id = ? AND status = 'awaiting_input'",
            (status, ctx.run_id, call.id),
        )
        await ctx.tx.write_sql(
            "UPDATE runs SET status = 'running' WHERE id = ? AND status = 'awaiting_input' AND NOT EXISTS "
            "(SELECT 1 FROM run_steps WHERE run_id = ? AND status = 'awaiting_input')",
            (ctx.run_id, ctx.run_id),
        )

    # -- compaction (K1) -------------------------------------------------------------------------
    async def compaction_tx(self, ctx: HookContext, info: CompactionInfo) -> None:
        """A `compaction` step: tokens before and after, what was done; its `target_log_id` is the (last)
        summary request's prompt step, whose tokens and cost roll up like any other prompt's."""
        tx, run_id = ctx.tx, ctx.run_id
        if tx is None or run_id is None:
            return
        c = info
        await record_step(
            tx,
            run_id,
            "compaction",
            "compaction",
            status="failed" if c.error else "completed",
            target=c.reason,
            target_log_id=c.summary_inference_ids[-1] if c.summary_inference_ids else None,
            input={"reason": c.reason, "tokens_before": c.tokens_before, "records_before": c.records_before},
            output={
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "records_after": c.records_after,
                "passes": list(c.passes),
                "evicted_messages": len(c.evicted),
                "summary_chars": len(c.summary or ""),
                "estimated": True,
            },
            error=c.error,
            started_at=c.started_at,
            completed_at=c.ended_at,
            step_id=c.id,
        )

    # -- settlement ------------------------------------------------------------------------------
    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        tx, run_id = ctx.tx, ctx.run_id
        if tx is None or run_id is None:
            return
        now = time.time()
        error = info.error
        status = info.outcome.value
        await tx.write_sql(_SETTLE_RUN, (status, now, error, run_id, run_id))
        # steps still open (calls cut off by an abort) end with the run
        await tx.write_sql(
            "UPDATE run_steps SET status = ?, completed_at = ?, error = COALESCE(error, ?) "
            "WHERE run_id = ? AND status = 'running'",
            ("cancelled" if status == "cancelled" else "failed", now, error or "the run ended", run_id),
        )
        live = self._live.get(run_id)
        if live is None or not live.root:
            await tx.write_sql(_ROLL_UP, (run_id, run_id, run_id, run_id, run_id))
        tx.after_commit(lambda: self._live.pop(run_id, None))
