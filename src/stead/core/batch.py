"""Tool batches (T1–T7): dispatch, concurrent execution, in-order result commits, resume and abort.

A batch is every executable call of one response. It is made durable (one entry per call, pending stage
`tools`) in the same transaction as the response's blocks, before any call runs (T1). Calls then run
concurrently under a bound, and results commit strictly in call order (T2), each in one transaction that
claims the call by deleting its entry, appends the result record and erases the call-bound KV (T3).

On resume after a crash (the entry exists but this process never dispatched it), a `durable` call runs
again with the same id; a `transactional` call had no effect (its transaction never committed) and runs
again; any other call is *in doubt* and gets an error result saying so — unless its tool has a `reconcile`
hook that decides from durable evidence (T5).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from stead._ids import new_id
from stead.core import records as R
from stead.core.events import ToolFinished, ToolStarted
from stead.core.records import Pending
from stead.core.turns import block_records, consumption_published, response_info, write_consumption
from stead.messages import ToolCall, ToolResult, decode_block, dumps, encode_block, encode_usage
from stead.providers.base import BlockEnd, Done
from stead.store.base import Tx
from stead.tools._tool import IN_DOUBT, RUN_AGAIN, Tool, ToolArgumentError, render_output
from stead.tools.context import CallKV, ToolContext

if TYPE_CHECKING:
    from stead.core.runtime import AgentRuntime, _Turn

__all__ = ["IN_DOUBT_TEXT", "abort_batch", "dispatch", "run_batch"]

IN_DOUBT_TEXT = (
    "This call was interrupted (the process stopped while it ran) and was not retried, because the tool "
    "is not marked durable: whether its effect happened is unknown."
)


async def dispatch(rt: AgentRuntime, turn: _Turn, reason: str) -> list[tuple[str, str]]:
    """Commit the response's blocks and its batch in one transaction (T1); return the batch entries."""
    blocks = list(turn.held)
    calls = list(turn.calls)
    entries = [(R.tool_key(i, call.id or ""), dumps(encode_block(call))) for i, call in enumerate(calls)]
    async with rt.env.store.transaction() as tx:
        consumed = await write_consumption(rt, tx, turn)
        recs = block_records(rt, turn, blocks, turn.usage)
        await tx.append(rt.id, [dumps(r) for r in recs])
        for key, value in entries:
            await tx.write(rt.id, key, value)
        pending = turn.pending.but(stage="tools", turn_id=turn.inference_id, inference_id=turn.inference_id)
        await tx.write(rt.id, R.PENDING, pending.encode())
        if turn.usage is not None and not blocks:
            await tx.write(rt.id, R.USAGE, dumps(encode_usage(turn.usage)))
        hooks = rt.env.hooks
        if hooks:
            ctx = rt.hook_ctx(tx, pending, inference_id=turn.inference_id)
            for b in blocks:
                await hooks.block_tx(ctx, b)
            await hooks.response_tx(ctx, response_info(rt, turn, reason, None))
            await hooks.tool_dispatched_tx(ctx, calls)

        def published() -> None:
            consumption_published(rt, turn, consumed)
            rt._publish_records(consumed + recs)
            rt.pending = pending
            turn.pending = pending
            rt.dispatched_here.update(c.id for c in calls if c.id)
            for b in blocks:
                rt.emit(BlockEnd(b))
            turn.done_emitted = True
            rt.emit(Done("tool_call", usage=turn.usage, inference_id=turn.inference_id))

        tx.after_commit(published)
    turn.held.clear()
    turn.calls.clear()
    return entries


def _allowed_tool(rt: AgentRuntime, name: str, offered: list[str]) -> Tool | None:
    if name not in offered:
        return None
    return rt.env.tools.get(name)


async def run_batch(rt: AgentRuntime, pending: Pending, entries: list[tuple[str, str]]) -> None:
    """Run the unfinished calls of the dispatched batch and commit their results in call order."""
    calls = [(key, decode_block(json.loads(raw))) for key, raw in entries]
    sem = asyncio.Semaphore(max(1, rt.config.max_tool_concurrency))
    offered = rt.offered_tools(pending)
    loop = asyncio.get_running_loop()
    if len(calls) == 1:
        # a single call runs inline, without a task (an abort cancels the loop task and with it the call)
        key, call = calls[0]
        assert isinstance(call, ToolCall) and call.id is not None
        tool = _allowed_tool(rt, call.name, offered)
        if (
            call.id not in rt.outcomes
            and call.id not in rt.running
            and not (tool is not None and tool.transactional)
        ):
            resumed = call.id not in rt.dispatched_here
            rt.outcomes[call.id] = await _execute(rt, pending, call, tool, resumed, sem)
    for _, call in calls:
        assert isinstance(call, ToolCall) and call.id is not None
        tool = _allowed_tool(rt, call.name, offered)
        if call.id in rt.outcomes or call.id in rt.running or (tool is not None and tool.transactional):
            continue
        resumed = call.id not in rt.dispatched_here
        rt.running[call.id] = loop.create_task(_execute(rt, pending, call, tool, resumed, sem))
    for index, (key, call) in enumerate(calls):
        assert isinstance(call, ToolCall) and call.id is not None
        tool = _allowed_tool(rt, call.name, offered)
        last = index == len(calls) - 1
        if tool is not None and tool.transactional and call.id not in rt.outcomes:
            await _commit_result(rt, pending, key, call, None, last, tool)
            continue
        result = rt.outcomes.get(call.id)
        if result is None:
            result = await rt.running[call.id]
            rt.outcomes[call.id] = result
        await _commit_result(rt, pending, key, call, result, last, tool)


def _context(rt: AgentRuntime, pending: Pending, call: ToolCall, resumed: bool) -> ToolContext:
    assert call.id is not None
    kv = rt.call_kvs.get(call.id)
    if kv is None:
        kv = rt.call_kvs[call.id] = CallKV(rt.env.store, rt.id, call.id)
    return ToolContext(
        call_id=call.id,
        tool_name=call.name,
        agent_id=rt.id,
        run_id=pending.run_id,
        permission_mode=str(rt.settings.get("permission_mode", "auto")),
        kv=kv,
        store=rt.env.store,
        resumed=resumed,
    )


async def _prepare(
    rt: AgentRuntime, pending: Pending, call: ToolCall, tool: Tool | None, resumed: bool
) -> tuple[ToolResult | None, dict[str, Any], ToolContext | None]:
    """Validation (T6), resume rules (T5) and the decision hook. A result means: do not run."""
    assert call.id is not None
    if tool is None:
        known = ", ".join(rt.offered_tools(pending)) or "none"
        return ToolResult(call.id, f"Unknown tool {call.name!r}. Available tools: {known}.", True), {}, None
    try:
        args = tool.validate(call.arguments)
    except ToolArgumentError as e:
        return ToolResult(call.id, str(e), True), {}, None
    ctx = _context(rt, pending, call, resumed)
    if resumed and not tool.durable and not tool.transactional:
        if tool.reconcile_fn is None:
            return ToolResult(call.id, IN_DOUBT_TEXT, True), args, ctx
        decision = await tool.reconcile_fn(ctx)
        if decision is IN_DOUBT:
            return ToolResult(call.id, IN_DOUBT_TEXT, True), args, ctx
        if decision is not RUN_AGAIN:
            return ToolResult(call.id, render_output(decision)), args, ctx
    if rt.env.hooks:
        answer = await rt.env.hooks.before_tool_call(rt.hook_ctx(None, pending), call)
        if answer is not None:
            return ToolResult(call.id, answer.output, answer.is_error), args, ctx
    return None, args, ctx


async def _invoke(
    rt: AgentRuntime, call: ToolCall, tool: Tool, ctx: ToolContext, args: dict[str, Any]
) -> ToolResult:
    assert call.id is not None
    rt.emit(ToolStarted(call))
    try:
        output = await tool.call(ctx, args)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        return ToolResult(call.id, f"Tool {call.name!r} failed: {type(e).__name__}: {e}", True)
    return ToolResult(call.id, render_output(output))


async def _execute(
    rt: AgentRuntime,
    pending: Pending,
    call: ToolCall,
    tool: Tool | None,
    resumed: bool,
    sem: asyncio.Semaphore,
) -> ToolResult:
    async with sem:
        try:
            early, args, ctx = await _prepare(rt, pending, call, tool, resumed)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            assert call.id is not None
            return ToolResult(call.id, f"Tool {call.name!r} could not start: {type(e).__name__}: {e}", True)
        if early is not None:
            return early
        assert tool is not None and ctx is not None
        return await _invoke(rt, call, tool, ctx, args)


async def _commit_result(
    rt: AgentRuntime,
    pending: Pending,
    key: str,
    call: ToolCall,
    result: ToolResult | None,
    last: bool,
    tool: Tool | None,
) -> None:
    """T3: claim the call (delete its entry), append its result, erase its KV — one transaction. A
    transactional tool runs inside this transaction, in a savepoint that rolls back its writes if it fails."""
    assert call.id is not None
    async with rt.env.store.transaction() as tx:
        if result is None:
            assert tool is not None
            result = await _run_transactional(rt, pending, call, tool, tx)
        if not await tx.delete(rt.id, key):
            return  # already answered: the first committed result wins
        rec = R.result_record(result)
        await tx.append(rt.id, [dumps(rec)])
        kv = rt.call_kvs.get(call.id)
        if call.id not in rt.dispatched_here or (kv is not None and kv.touched):
            # erase the call-bound KV (T3); skipped only when this process ran the call and it never wrote
            await tx.delete_prefix(rt.id, f"{R.CALL_KV}{call.id}.")
        new_pending: Pending | None = None
        if last:
            inf = new_id()
            new_pending = pending.but(stage="inference", turn_id=inf, inference_id=inf)
            await tx.write(rt.id, R.PENDING, new_pending.encode())
        if rt.env.hooks:
            await rt.env.hooks.tool_result_tx(rt.hook_ctx(tx, pending), call, result)
        final = result

        def published() -> None:
            rt._publish_records([rec])
            rt.outcomes.pop(call.id or "", None)
            rt.running.pop(call.id or "", None)
            rt.dispatched_here.discard(call.id or "")
            kv = rt.call_kvs.pop(call.id or "", None)
            if kv is not None:
                kv.closed = True
            if new_pending is not None:
                rt.pending = new_pending
            rt.emit(ToolFinished(final))

        tx.after_commit(published)


async def _run_transactional(
    rt: AgentRuntime, pending: Pending, call: ToolCall, tool: Tool, tx: Tx
) -> ToolResult:
    assert call.id is not None
    resumed = call.id not in rt.dispatched_here
    early, args, ctx = await _prepare(rt, pending, call, tool, resumed)
    if early is not None:
        return early
    assert ctx is not None
    try:
        async with tx.savepoint():
            result = await _invoke(rt, call, tool, ctx, args)
            if result.is_error:
                raise _RollBack(result)
    except _RollBack as rb:
        return rb.result
    return result


class _RollBack(Exception):
    def __init__(self, result: ToolResult) -> None:
        self.result = result


async def abort_batch(rt: AgentRuntime, tx: Tx) -> list[dict[str, Any]]:
    """Inside `tx`: every unanswered call of the dispatched batch gets an aborted error result (X1)."""
    recs: list[dict[str, Any]] = []
    results: list[ToolResult] = []
    for key, raw in await tx.read_prefix(rt.id, R.TOOL):
        call = decode_block(json.loads(raw))
        assert isinstance(call, ToolCall) and call.id is not None
        await tx.delete(rt.id, key)
        await tx.delete_prefix(rt.id, f"{R.CALL_KV}{call.id}.")
        result = ToolResult(call.id, "Aborted: the run was cancelled before this call finished.", True)
        results.append(result)
        recs.append(R.result_record(result))
    if recs:
        await tx.append(rt.id, [dumps(r) for r in recs])

    def published() -> None:
        for r in results:
            rt.outcomes.pop(r.call_id, None)
            rt.running.pop(r.call_id, None)
            kv = rt.call_kvs.pop(r.call_id, None)
            if kv is not None:
                kv.closed = True
            rt.emit(ToolFinished(r))

    tx.after_commit(published)
    return recs
