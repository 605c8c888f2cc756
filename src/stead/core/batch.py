"""Tool batches (T1–T7): dispatch, concurrent execution, in-order result commits, resume and abort.

A batch is every executable call of one response. It is made durable (one entry per call, pending stage
`tools`) in the same transaction as the response's blocks, before any call runs (T1). Calls then run
concurrently under a bound, and results commit strictly in call order (T2), each in one transaction that
claims the call by deleting its entry, appends the result record and erases the call-bound KV (T3).

On resume after a crash (the entry exists but this process never dispatched it), a `durable` call runs
again with the same id; a `transactional` call had no effect (its transaction never committed) and runs
again; any other call is *in doubt* and gets an error result saying so — unless its tool has a `reconcile`
hook that decides from durable evidence (T5). Whatever a call raises, `BaseException`s included, is its
one error result; only what happens to the agent (a cancellation, a real Ctrl-C) goes on up (T8).

A layer above may gate calls at dispatch (`stead.core.gate`): a held call does not run until it is decided
and the agent makes no provider request meanwhile; a refused call gets its error result in call order
without running. In a batch with gated calls the calls that run still commit in call order among
themselves, but a held call's result commits with its decision, so results of such a batch may follow call
order only within each of those groups; the commit that answers the batch's last entry (whoever makes it)
moves the pending record back to `inference`.

A result longer than the tool's `max_result_chars` (or the agent's `max_tool_result_chars`, 100,000 by
default) is cut in the conversation with a marker saying how much was cut; `tool_result_tx` hooks (the run
record's tool step) get the full output. Before that, `tool_output` hooks may replace a result the tool
produced (a large output stored elsewhere, kept in the conversation as a reference).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import signal
from typing import Any

from stead._ids import new_id
from stead.core import records as R
from stead.core.consume import consumption_published, write_consumption
from stead.core.events import ApprovalDecided, ApprovalRequested, ToolFinished, ToolStarted
from stead.core.gate import Gate, decode_gates, encode_entry
from stead.core.hooks import (
    AwaitingInputInfo,
    BeforeToolCallInfo,
    BlockInfo,
    CallDecidedInfo,
    GateCallInfo,
    ToolDispatchedInfo,
    ToolOutputInfo,
    ToolResultInfo,
)
from stead.core.records import Pending
from stead.core.response import block_records, repaired, response_info
from stead.core.state import AgentState, Turn
from stead.messages import ToolCall, ToolResult, decode_block, dumps, encode_usage
from stead.providers.base import BlockEnd, Done
from stead.store.base import Tx
from stead.tools._tool import IN_DOUBT, RUN_AGAIN, Tool, ToolArgumentError, render_output
from stead.tools.context import CallKV, ToolContext

__all__ = [
    "IN_DOUBT_TEXT",
    "Batch",
    "abort_batch",
    "commit_result",
    "cut_output",
    "decode_batch",
    "dispatch",
    "run_batch",
]

log = logging.getLogger("stead.core")

Batch = list[tuple[str, ToolCall]]
"""The calls of a dispatched batch with their entry keys, in call order."""

CANCELLED_TEXT = "Cancelled: the run was aborted while this call waited for a decision; it never ran."

IN_DOUBT_TEXT = (
    "This call was interrupted (the process stopped while it ran) and was not retried, because the tool "
    "is not marked durable: whether its effect happened is unknown."
)


def decode_batch(entries: list[tuple[str, str]]) -> Batch:
    """The dispatched batch as stored (entry key → encoded call), decoded."""
    out: Batch = []
    for key, raw in entries:
        call = decode_block(json.loads(raw))
        assert isinstance(call, ToolCall) and call.id is not None
        out.append((key, call))
    return out


async def dispatch(st: AgentState, turn: Turn, reason: str) -> tuple[Batch, dict[str, Gate]]:
    """Commit the response's blocks and its batch in one transaction (T1); return the batch and the gates
    the `gate_call_tx` hooks put on its calls (`stead.core.gate`)."""
    blocks = list(turn.held)
    calls = list(turn.calls)
    batch: Batch = [(R.tool_key(i, call.id or ""), call) for i, call in enumerate(calls)]
    hooks = st.hooks
    gates: dict[str, Gate] = {}
    async with st.env.store.transaction() as tx:
        consumed = await write_consumption(st, tx, turn)
        recs = block_records(turn, blocks, turn.usage, reason)
        await tx.append(st.id, [dumps(r) for r in recs])
        pending = turn.pending.but(stage="tools", turn_id=turn.inference_id, inference_id=turn.inference_id)
        if hooks.wants("gate_call_tx"):
            gate_ctx = st.hook_ctx(tx, pending, inference_id=turn.inference_id)
            offered = st.offered_tools(pending)
            for _, call in batch:
                info = GateCallInfo(call, _allowed_tool(st, call.name, offered))
                gate = await hooks.gate_call_tx(gate_ctx, info)
                if gate is not None and call.id:
                    gates[call.id] = gate
        for key, call in batch:
            await tx.write(st.id, key, encode_entry(call, gates.get(call.id or "")))
        await tx.write(st.id, R.PENDING, pending.encode())
        if turn.usage is not None and not blocks:
            await tx.write(st.id, R.USAGE, dumps(encode_usage(turn.usage)))
        held = [c for c in calls if c.id in gates and gates[c.id].held]
        want_blocks = bool(blocks) and hooks.wants("block_tx")
        want_held = bool(held) and hooks.wants("awaiting_input_tx")
        want_response, want_dispatched = hooks.wants("response_tx"), hooks.wants("tool_dispatched_tx")
        if want_blocks or want_held or want_response or want_dispatched:
            ctx = st.hook_ctx(tx, pending, inference_id=turn.inference_id)
            if want_blocks:
                for b in blocks:
                    await hooks.block_tx(ctx, BlockInfo(b))
            if want_response:
                await hooks.response_tx(ctx, response_info(turn, reason, None))
            if want_dispatched:
                await hooks.tool_dispatched_tx(ctx, ToolDispatchedInfo(calls))
            if want_held:
                await hooks.awaiting_input_tx(ctx, AwaitingInputInfo(held))

        def published() -> None:
            consumption_published(st, turn)
            st.publish_records(consumed + recs)
            st.pending = pending
            turn.pending = pending
            st.dispatched_here.update(c.id for c in calls if c.id)
            turn.done_emitted = True
            if st.listening:
                for b in blocks:
                    st.emit(BlockEnd(b))
                st.emit(Done("tool_call", usage=turn.usage, inference_id=turn.inference_id))
                for c in held:
                    g = gates[c.id or ""]
                    st.emit(ApprovalRequested(c, g.ref, g.text, pending.run_id))

        tx.after_commit(published)
    turn.held.clear()
    turn.calls.clear()
    return batch, gates


def _allowed_tool(st: AgentState, name: str, offered: list[str]) -> Tool | None:
    if name not in offered:
        return None
    return st.env.tools.get(name)


async def run_batch(
    st: AgentState, pending: Pending, batch: Batch, gates: dict[str, Gate] | None = None
) -> None:
    """Run the unfinished calls of the dispatched batch and commit their results in call order. Held calls
    (`gates`) are skipped; refused ones get their error result in order without running; approved ones are
    claimed (one commit) and run once."""
    gates = gates or {}
    if gates:
        batch = [(k, c) for k, c in batch if not (c.id in gates and gates[c.id].held)]
        await _claim_approved(st, batch, gates)
    offered = st.offered_tools(pending)
    tools = [_allowed_tool(st, call.name, offered) for _, call in batch]
    for _, call in batch:
        gate = gates.get(call.id or "")
        if gate is not None and gate.state == "deny" and call.id not in st.outcomes:
            st.outcomes[call.id or ""] = ToolResult(call.id or "", gate.text, True)
    if len(batch) == 1:
        # a single call runs inline, without a task (an abort cancels the loop task and with it the call)
        (_, call), tool = batch[0], tools[0]
        cid = call.id or ""
        if cid not in st.outcomes and cid not in st.running and not (tool is not None and tool.transactional):
            resumed = cid not in st.dispatched_here
            st.outcomes[cid] = await _execute_now(st, pending, call, tool, resumed)
    else:
        sem = asyncio.Semaphore(max(1, st.config.max_tool_concurrency))
        loop = asyncio.get_running_loop()
        for (_, call), tool in zip(batch, tools, strict=True):
            cid = call.id or ""
            if cid in st.outcomes or cid in st.running or (tool is not None and tool.transactional):
                continue
            resumed = cid not in st.dispatched_here
            st.running[cid] = loop.create_task(_execute(st, pending, call, tool, resumed, sem))
    last_index = len(batch) - 1
    for index, ((key, call), tool) in enumerate(zip(batch, tools, strict=True)):
        cid = call.id or ""
        # with gated calls, whether this commit answers the batch's last entry is read in its transaction
        last: bool | None = None if gates else index == last_index
        note = gates[cid].note if cid in gates else None
        if tool is not None and tool.transactional and cid not in st.outcomes:
            await commit_result(st, pending, key, call, None, last, tool, note=note)
            continue
        result = st.outcomes.get(cid)
        if result is None:
            result = await st.running[cid]
            st.outcomes[cid] = result
        await commit_result(st, pending, key, call, result, last, tool, note=note)


async def _claim_approved(st: AgentState, batch: Batch, gates: dict[str, Gate]) -> None:
    """Approved calls that have not started (`go`) become ordinary unfinished calls of this process (`run`)
    in one commit before any of them runs, so a crash from here on finds them started (T5 applies)."""
    claim = [(k, c) for k, c in batch if c.id in gates and gates[c.id].state == "go"]
    if not claim:
        return
    async with st.env.store.transaction() as tx:
        for key, call in claim:
            await tx.write(st.id, key, encode_entry(call, gates[call.id or ""].but(state="run")))

        def published() -> None:
            for _, call in claim:
                cid = call.id or ""
                st.dispatched_here.add(cid)
                gates[cid] = gates[cid].but(state="run")

        tx.after_commit(published)


def _context(st: AgentState, pending: Pending, call: ToolCall, resumed: bool) -> ToolContext:
    assert call.id is not None
    kv = st.call_kvs.get(call.id)
    if kv is None:
        kv = st.call_kvs[call.id] = CallKV(st.env.store, st.id, call.id)
    return ToolContext(
        call_id=call.id,
        tool_name=call.name,
        agent_id=st.id,
        run_id=pending.run_id,
        permission_mode=str(st.settings.get("permission_mode", "auto")),
        kv=kv,
        store=st.env.store,
        resumed=resumed,
        extra=st.config.extra,
        user=pending.user,
        tenant=pending.tenant,
        on_awaiting_input=lambda waiting: st.call_awaits_input(call.id or "", waiting),
    )


async def _prepare(
    st: AgentState, pending: Pending, call: ToolCall, tool: Tool | None, resumed: bool
) -> tuple[ToolResult | None, dict[str, Any], ToolContext | None]:
    """Validation (T6), resume rules (T5) and the decision hook. A result means: do not run."""
    assert call.id is not None
    if tool is None:
        known = ", ".join(st.offered_tools(pending)) or "none"
        return ToolResult(call.id, f"Unknown tool {call.name!r}. Available tools: {known}.", True), {}, None
    try:
        args = tool.validate(call.arguments)
    except ToolArgumentError as e:
        return ToolResult(call.id, str(e), True), {}, None
    ctx = _context(st, pending, call, resumed)
    if resumed and not tool.durable and not tool.transactional:
        if tool.reconcile_fn is None:
            return ToolResult(call.id, IN_DOUBT_TEXT, True), args, ctx
        decision = await tool.reconcile_fn(ctx)
        if decision is IN_DOUBT:
            return ToolResult(call.id, IN_DOUBT_TEXT, True), args, ctx
        if decision is not RUN_AGAIN:
            return ToolResult(call.id, render_output(decision)), args, ctx
    if st.hooks.wants("before_tool_call"):
        answer = await st.hooks.before_tool_call(st.hook_ctx(None, pending), BeforeToolCallInfo(call))
        if answer is not None:
            return ToolResult(call.id, answer.output, answer.is_error), args, ctx
    return None, args, ctx


async def _invoke(
    st: AgentState, call: ToolCall, tool: Tool, ctx: ToolContext, args: dict[str, Any]
) -> ToolResult:
    assert call.id is not None
    if st.listening:
        st.emit(ToolStarted(call))
    task = asyncio.current_task()
    try:
        output = await tool.call(ctx, args)
    except BaseException as e:
        return _failed_result(st, call, e, task)
    return repaired(st, ToolResult(call.id, render_output(output)), f"tool {call.name!r}'s result")


def _failed_result(
    st: AgentState, call: ToolCall, e: BaseException, task: asyncio.Task[Any] | None, what: str = "failed"
) -> ToolResult:
    """T8: an exception raised out of a tool's code (or its `reconcile` or `prepare` step) running in
    `task`, of any kind — `CancelledError`, `GeneratorExit`, `KeyboardInterrupt`, `SystemExit` or another
    `BaseException` the tool raised itself — is the call's one error result: never a re-run, never the end
    of the process. Raised on instead is what happens to the agent rather than the tool: a real Ctrl-C (a
    `KeyboardInterrupt` raised by the process's SIGINT handler, such as `asyncio.run`'s second Ctrl-C),
    the coroutine being closed from outside its task (a `GeneratorExit` thrown in), the task being
    cancelled (an abort, a drain, a shutdown: `task.cancelling()`) — as a `CancelledError` whatever the
    tool turned the cancellation into, so that the abort (X1) still happens — and a `CancelledError` while
    this process stops the agent (drained, closed): the call stays unfinished for the next owner (T5; a
    delegation whose sub-agent stopped with the system says so)."""
    assert call.id is not None
    if isinstance(e, KeyboardInterrupt) and _from_sigint_handler(e):
        raise e
    if isinstance(e, GeneratorExit) and not _inside(task):
        raise e
    if task is not None and task.cancelling():
        if isinstance(e, asyncio.CancelledError):
            raise e
        raise asyncio.CancelledError() from e
    if isinstance(e, asyncio.CancelledError) and (st.draining or st.closed):
        raise e
    if not isinstance(e, Exception):
        log.warning("tool %r (call %s) raised %s: its error result", call.name, call.id, type(e).__name__)
    return ToolResult(call.id, f"Tool {call.name!r} {what}: {type(e).__name__}: {e}", True)


def _inside(task: asyncio.Task[Any] | None) -> bool:
    """Whether `task` is the one running now (not so for a coroutine closed from outside its task)."""
    try:
        return task is not None and asyncio.current_task() is task
    except RuntimeError:  # no running loop
        return False


def _from_sigint_handler(e: BaseException) -> bool:
    """Whether the SIGINT handler's own code raised `e` (a signal, not the tool: its frame is in the
    traceback). Python's default handler raises from C, so it cannot be told apart from the tool."""
    handler: Any = signal.getsignal(signal.SIGINT)
    while isinstance(handler, functools.partial):
        handler = handler.func
    code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    tb = e.__traceback__
    while code is not None and tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


async def _execute(
    st: AgentState,
    pending: Pending,
    call: ToolCall,
    tool: Tool | None,
    resumed: bool,
    sem: asyncio.Semaphore,
) -> ToolResult:
    """Run one call of a batch of several, under `sem` (the batch's concurrency bound)."""
    async with sem:
        return await _execute_now(st, pending, call, tool, resumed)


async def _execute_now(
    st: AgentState, pending: Pending, call: ToolCall, tool: Tool | None, resumed: bool
) -> ToolResult:
    """Run one call now (a batch's only call runs inline, without a task or a semaphore)."""
    task = asyncio.current_task()
    try:
        early, args, ctx = await _prepare(st, pending, call, tool, resumed)
    except BaseException as e:
        return _failed_result(st, call, e, task, "could not start")
    if early is not None:
        return early
    assert tool is not None and ctx is not None
    cid = call.id or ""
    st.executing.add(cid)
    try:
        return await _output(st, pending, call, await _invoke(st, call, tool, ctx, args))
    finally:
        st.executing.discard(cid)
        if cid in st.awaiting_calls:
            st.call_awaits_input(cid, False)


async def _output(st: AgentState, pending: Pending, call: ToolCall, result: ToolResult) -> ToolResult:
    """The `tool_output` hooks' version of a result the tool produced (the original when none is set, or
    when a hook fails: the call ran, and its outcome must not be lost)."""
    if not st.hooks.wants("tool_output"):
        return result
    try:
        return await st.hooks.tool_output(st.hook_ctx(None, pending), ToolOutputInfo(call, result))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception(
            "agent %s: a tool_output hook failed for call %s (the result is kept as is)", st.id, call.id
        )
        return result


def cut_output(result: ToolResult, limit: int) -> ToolResult:
    """The result as the conversation keeps it: at most `limit` characters of output, then a marker
    saying how much was cut (`…[cut: 12,403 of 112,403 characters]`)."""
    n = len(result.output)
    if n <= limit:
        return result
    kept = max(limit, 0)
    marker = f"…[cut: {n - kept:,} of {n:,} characters]"
    return ToolResult(result.call_id, result.output[:kept] + marker, result.is_error, result.repaired)


async def commit_result(
    st: AgentState,
    pending: Pending,
    key: str,
    call: ToolCall,
    result: ToolResult | None,
    last: bool | None,
    tool: Tool | None,
    *,
    note: str | None = None,
    track: bool = True,
) -> bool:
    """T3: claim the call (delete its entry), append its result, erase its KV — one transaction (the
    caller's, if it has one open). A transactional tool runs inside this transaction, in a savepoint that
    rolls back its writes if it fails. `last`: whether this answers the batch's last entry (None: read it
    here, for batches with gated calls). `note` starts the result (a reviewer's edit). `track=False`: this
    process does not run the agent (a decision made by a process that did not resume it), so the mirror's
    pending record is left alone. Returns whether this commit answered the call (False: it was answered
    before — the first committed result wins)."""
    assert call.id is not None
    cid = call.id
    prepared: Any = None
    if result is None and tool is not None and tool.prepare_fn is not None:
        # a transactional tool's slow part runs before its transaction opens (never inside one)
        prepared, result = await _run_prepare(st, pending, call, tool)
    st.committing = cid  # left set when the commit fails: the poison-input breaker names the call (C7)
    async with st.env.store.transaction() as tx:
        if result is None:
            assert tool is not None
            result = await _run_transactional(st, pending, call, tool, tx, prepared)
        if not await tx.delete(st.id, key):
            # already answered: the first committed result wins. Whoever committed it (another process
            # too), this process's history may lack it: the next stage reloads from the store (C4)
            st.committing = None
            st.drop_history()
            return False
        if note:
            result = ToolResult(result.call_id, f"{note}\n{result.output}", result.is_error, result.repaired)
        result = repaired(st, result, f"the result of call {cid}")  # S5: from a hook, a note, an error
        if last is None:
            last = await tx.last_key(st.id, R.TOOL) is None
        limit = tool.max_result_chars if tool is not None and tool.max_result_chars is not None else None
        kept = cut_output(result, limit if limit is not None else st.config.max_tool_result_chars)
        rec = R.result_record(kept)
        await tx.append(st.id, [dumps(rec)])
        kv = st.call_kvs.get(cid)
        if cid not in st.dispatched_here or (kv is not None and kv.touched):
            # erase the call-bound KV (T3); skipped only when this process ran the call and it never wrote
            await tx.delete_prefix(st.id, f"{R.CALL_KV}{cid}.")
        new_pending: Pending | None = None
        if last:
            inf = new_id()
            new_pending = pending.but(stage="inference", turn_id=inf, inference_id=inf)
            await tx.write(st.id, R.PENDING, new_pending.encode())
        if st.hooks.wants("tool_result_tx"):
            # the full output
            await st.hooks.tool_result_tx(st.hook_ctx(tx, pending), ToolResultInfo(call, result))

        def published() -> None:
            st.publish_records([rec])
            st.outcomes.pop(cid, None)
            st.running.pop(cid, None)
            st.dispatched_here.discard(cid)
            kv = st.call_kvs.pop(cid, None)
            if kv is not None:
                kv.closed = True
            if new_pending is not None and track:
                st.pending = new_pending
            if st.listening:
                st.emit(ToolFinished(kept))

        tx.after_commit(published)
    st.committing = None
    return True


async def _run_prepare(
    st: AgentState, pending: Pending, call: ToolCall, tool: Tool
) -> tuple[Any, ToolResult | None]:
    """A transactional tool's `prepare` step, outside any transaction: (its value, None), or (None, the
    error result) when it failed. Arguments that do not validate skip it (the body path reports them)."""
    assert call.id is not None and tool.prepare_fn is not None
    try:
        args = tool.validate(call.arguments)
    except ToolArgumentError:
        return None, None
    ctx = _context(st, pending, call, call.id not in st.dispatched_here)
    task = asyncio.current_task()
    try:
        return await tool.prepare_fn(ctx, args), None
    except BaseException as e:
        return None, _failed_result(st, call, e, task)


async def _run_transactional(
    st: AgentState, pending: Pending, call: ToolCall, tool: Tool, tx: Tx, prepared: Any = None
) -> ToolResult:
    assert call.id is not None
    resumed = call.id not in st.dispatched_here
    early, args, ctx = await _prepare(st, pending, call, tool, resumed)
    if early is not None:
        return early
    assert ctx is not None
    ctx.prepared = prepared
    try:
        async with tx.savepoint():
            result = await _invoke(st, call, tool, ctx, args)
            if result.is_error:
                raise _RollBack(result)
    except _RollBack as rb:
        return await _output(st, pending, call, rb.result)
    return await _output(st, pending, call, result)


class _RollBack(Exception):
    def __init__(self, result: ToolResult) -> None:
        self.result = result


async def abort_batch(st: AgentState, tx: Tx) -> list[dict[str, Any]]:
    """Inside `tx`: every unanswered call of the dispatched batch gets an aborted error result (X1)."""
    recs: list[dict[str, Any]] = []
    results: list[ToolResult] = []
    entries = await tx.read_prefix(st.id, R.TOOL)
    gates = decode_gates(entries)
    decided: list[tuple[str, Gate]] = []
    for key, call in decode_batch(entries):
        cid = call.id or ""
        await tx.delete(st.id, key)
        await tx.delete_prefix(st.id, f"{R.CALL_KV}{cid}.")
        gate = gates.get(cid)
        if gate is not None and gate.held:
            # X1: a call waiting for a decision is cancelled with the run (it never started)
            result = ToolResult(cid, CANCELLED_TEXT, True)
            if st.hooks.wants("call_decided_tx"):
                await st.hooks.call_decided_tx(st.hook_ctx(tx), CallDecidedInfo(call, "cancelled", None))
            decided.append((cid, gate))
        else:
            result = ToolResult(cid, "Aborted: the run was cancelled before this call finished.", True)
        results.append(result)
        recs.append(R.result_record(result))
    if recs:
        await tx.append(st.id, [dumps(r) for r in recs])

    def published() -> None:
        for r in results:
            st.outcomes.pop(r.call_id, None)
            st.running.pop(r.call_id, None)
            kv = st.call_kvs.pop(r.call_id, None)
            if kv is not None:
                kv.closed = True
            if st.listening:
                st.emit(ToolFinished(r))
        if st.listening:
            run_id = st.pending.run_id if st.pending is not None else ""
            for cid, gate in decided:
                st.emit(ApprovalDecided(cid, gate.ref, "cancelled", None, run_id))

    tx.after_commit(published)
    return recs
