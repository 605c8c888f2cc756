"""The commits of a turn: staged consumption, held blocks, the response's end, failure, settlement, abort.

Each function here is one transaction (or one step inside the caller's transaction) of the plan described
in `stead.core.runtime`: durable state changes in the transaction; the runtime's mirrors and the events
observers see change only in its after-commit callbacks.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, cast

from stead.core import records as R
from stead.core.events import BlockReset, MessageConsumed, Settled
from stead.core.hooks import ResponseInfo
from stead.core.records import Pending
from stead.errors import StoreCrashed, StoreError
from stead.messages import Block, Message, ToolResult, Usage, decode_block, dumps, encode_block, encode_usage
from stead.providers.base import BlockEnd, Done, DoneReason
from stead.store.base import Tx

if TYPE_CHECKING:
    from stead.core.runtime import AgentRuntime, _Turn

__all__ = [
    "after_abort",
    "block_records",
    "commit_abort",
    "commit_end",
    "commit_held",
    "commit_partial",
    "consumption_published",
    "fail",
    "finish",
    "response_info",
    "settle_in",
    "write_consumption",
]


async def write_consumption(rt: AgentRuntime, tx: Tx, turn: _Turn) -> list[dict[str, Any]]:
    """Stage C1 inside `tx`: delete the queue entries, append them to history (after a reset if the
    settings demand one), persist changed settings, run the consumption hooks."""
    if turn.consumed:
        return []
    recs: list[dict[str, Any]] = []
    hooks = rt.env.hooks
    old_mode = str(rt.settings.get("permission_mode", "auto"))
    for q in turn.take:
        await tx.delete(rt.id, q.key)
        recs.append(q.history_record())
    if turn.reset:
        await tx.clear(rt.id)
        await tx.delete_prefix(rt.id, "kv.h.")
        if turn.handoff is not None:
            recs.insert(0, {"k": "s", "x": turn.handoff})  # K2: the handoff opens the new conversation
    if recs:
        await tx.append(rt.id, [dumps(r) for r in recs])
    if turn.settings is not rt.settings:
        await tx.write(rt.id, R.SETTINGS, dumps(turn.settings))
    if hooks:
        ctx = rt.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
        ctx.settings = dict(turn.settings)
        new_mode = str(turn.settings.get("permission_mode", "auto"))
        if new_mode != old_mode:
            await hooks.permission_mode_changed_tx(ctx, old_mode, new_mode)
        for q in turn.take:
            await hooks.message_consumed_tx(
                ctx,
                Message(
                    q.role,
                    [decode_block(b) for b in q.content],
                    id=q.id,
                    metadata=q.metadata,
                ),
            )
    return recs


def consumption_published(rt: AgentRuntime, turn: _Turn, recs: list[dict[str, Any]]) -> None:
    if turn.consumed:
        return
    turn.consumed = True
    rt._settings = turn.settings
    if turn.reset:
        rt._publish_records([], reset=True)
    for q in turn.take:
        rt.emit(
            MessageConsumed(
                Message(
                    q.role,
                    [decode_block(b) for b in q.content],
                    id=q.id,
                    metadata=q.metadata,
                )
            )
        )


def block_records(
    rt: AgentRuntime, turn: _Turn, blocks: list[Block], usage: Usage | None
) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [{"k": "b", "i": turn.inference_id, "b": encode_block(b)} for b in blocks]
    if recs and usage is not None:
        recs[-1]["u"] = encode_usage(usage)
    return recs


async def commit_held(rt: AgentRuntime, turn: _Turn) -> None:
    """Commit completed blocks mid-response (the next block started streaming)."""
    blocks = list(turn.held)
    async with rt.env.store.transaction() as tx:
        consumed = await write_consumption(rt, tx, turn)
        recs = block_records(rt, turn, blocks, None)
        await tx.append(rt.id, [dumps(r) for r in recs])
        if rt.env.hooks:
            for b in blocks:
                await rt.env.hooks.block_tx(rt.hook_ctx(tx, turn.pending, inference_id=turn.inference_id), b)
        pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
        await tx.write(rt.id, R.PENDING, pending.encode())

        def published() -> None:
            consumption_published(rt, turn, consumed)
            rt._publish_records(consumed + recs)
            turn.pending = pending
            rt.pending = pending
            for b in blocks:
                rt.emit(BlockEnd(b))

        tx.after_commit(published)
    turn.held.clear()


async def commit_partial(rt: AgentRuntime, turn: _Turn) -> None:
    """A response was cut off or failed retryably: keep its completed blocks; calls it emitted get
    error results (T4) so the conversation never keeps a call without one."""
    if not turn.held and (turn.consumed or not turn.take):
        return
    results = [
        ToolResult(c.id or "", "The response was cut off before this call could run; it was not run.", True)
        for c in turn.calls
    ]
    await commit_end(rt, turn, results=results, note=None, settle=False, owe=True, reason="error")


async def finish(rt: AgentRuntime, turn: _Turn, reason: str) -> bool:
    if turn.calls:
        from stead.core.batch import dispatch, run_batch

        entries = await dispatch(rt, turn, reason)
        # The batch is part of this turn, whose durable state was read at its start and has been
        # written by this task since: run it now instead of re-reading what was just committed.
        await run_batch(rt, turn.pending, entries)
        return True
    return await commit_end(rt, turn, results=[], note=None, settle=True, owe=False, reason=reason)


async def fail(rt: AgentRuntime, turn: _Turn, error: str, *, end_run: bool = False) -> bool:
    """C6/T4: the turn failed. Its input counts as consumed, its calls get error results, and a system
    note tells the next inference; queued work is still answered — unless `end_run` (a guardrail
    refused the inference), which settles the run with queued messages left queued, like an abort."""
    rt._attempt = 0
    rt.last_error = error
    results = [ToolResult(c.id or "", f"Not run: the turn failed ({error}).", True) for c in turn.calls]
    return await commit_end(
        rt,
        turn,
        results=results,
        note=f"The last turn failed: {error}",
        settle=True,
        owe=False,
        reason="error",
        error=error,
        force_settle=end_run,
    )


async def commit_end(
    rt: AgentRuntime,
    turn: _Turn,
    *,
    results: list[ToolResult],
    note: str | None,
    settle: bool,
    owe: bool,
    reason: str,
    error: str | None = None,
    force_settle: bool = False,
) -> bool:
    """The last commit of a response without a tool batch: consumption, blocks, usage, error results,
    a note; then settlement (if nothing is queued), or the pending record for what comes next."""
    blocks = list(turn.held)
    more = True
    async with rt.env.store.transaction() as tx:
        consumed = await write_consumption(rt, tx, turn)
        # S4: a failed or cut-off response keeps the previous usage measurement
        usage = turn.usage if reason not in ("error", "cancelled") else None
        recs = block_records(rt, turn, blocks, usage)
        recs += [R.result_record(r) for r in results]
        if note is not None:
            recs.append({"k": "s", "x": note})
        if recs:
            await tx.append(rt.id, [dumps(r) for r in recs])
        hooks = rt.env.hooks
        if hooks:
            ctx = rt.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
            for b in blocks:
                await hooks.block_tx(ctx, b)
            await hooks.response_tx(ctx, response_info(rt, turn, reason, error))
        if usage is not None and not blocks:
            # S4: the usage rides on the response's last block record; without blocks it gets a key
            await tx.write(rt.id, R.USAGE, dumps(encode_usage(usage)))
        pending: Pending | None
        if owe:
            pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
            await tx.write(rt.id, R.PENDING, pending.encode())
        else:
            queued = await tx.read_prefix(rt.id, R.QUEUE)
            if settle and (force_settle or not any(v for _, v in queued)):
                pending = None
                more = False  # settled below, after `published`: the response's Done precedes Settled
            else:
                pending = turn.pending.but(turn_id=None, inference_id=None)
                await tx.write(rt.id, R.PENDING, pending.encode())

        def published() -> None:
            consumption_published(rt, turn, consumed)
            rt._publish_records(consumed + recs)
            turn.pending = pending or turn.pending
            if pending is not None:
                rt.pending = pending
            for b in blocks:
                rt.emit(BlockEnd(b))
            if not owe:
                turn.done_emitted = True
                rt.emit(
                    Done(
                        cast(DoneReason, reason),
                        error=error,
                        usage=turn.usage,
                        inference_id=turn.inference_id,
                    )
                )

        tx.after_commit(published)
        if not more:
            await settle_in(rt, tx, turn.pending, error)
    turn.held.clear()
    turn.calls.clear()
    return more


def response_info(rt: AgentRuntime, turn: _Turn, reason: str, error: str | None) -> ResponseInfo:
    return ResponseInfo(
        inference_id=turn.inference_id,
        provider=str(turn.settings.get("provider")),
        model=str(turn.settings.get("model")),
        reason=reason,
        usage=turn.usage,
        started_at=turn.started_at,
        first_token_at=turn.first_token_at,
        ended_at=time.time(),
        error=error,
    )


async def settle_in(rt: AgentRuntime, tx: Tx, pending: Pending, error: str | None) -> None:
    """Inside `tx`: delete the pending record, run the settle hook, clear run-scoped KV."""
    await tx.delete(rt.id, R.PENDING)
    await tx.delete_prefix(rt.id, R.RUN_KV)
    hooks = rt.env.hooks
    ctx = rt.hook_ctx(tx, pending) if hooks else None
    reopened: Pending | None = None
    if ctx is not None:
        await hooks.settled_tx(ctx, error)
        # X2: work accepted inside this very transaction (by the hook) re-created the pending record;
        # it was published first by its own after-commit callback and must not be overwritten here
        reopened = Pending.decode(await tx.get(rt.id, R.PENDING))
    rt.last_error = None

    def published() -> None:
        rt.pending = reopened
        rt._restored = False  # X3: a restored period that ended unannounced (aborted) is over
        rt.emit(Settled(pending.run_id, error))
        if ctx is not None:
            ctx.tx = None
            task = asyncio.get_running_loop().create_task(hooks.settled(ctx, error))
            rt._background.add(task)
            task.add_done_callback(rt._background.discard)

    tx.after_commit(published)


async def after_abort(rt: AgentRuntime) -> bool:
    """X1: settle an aborted turn (retried on transient store errors; a dead store stops here)."""
    turn = rt._turn
    for t in list(rt.running.values()):
        t.cancel()
    try:
        while True:
            try:
                await commit_abort(rt, turn)
                return False
            except StoreCrashed:
                rt._draining = True
                return False
            except StoreError:
                await asyncio.sleep(rt.env.store_retry_delay)
    finally:
        rt._turn = None


async def commit_abort(rt: AgentRuntime, turn: _Turn | None) -> None:
    """One transaction: the aborted turn's input, finished blocks and error results, then settlement."""
    from stead.core.batch import abort_batch

    async with rt.env.store.transaction() as tx:
        pending = Pending.decode(await tx.get(rt.id, R.PENDING))
        if pending is None:
            return
        recs: list[dict[str, Any]] = []
        consumed: list[dict[str, Any]] = []
        if turn is not None:
            consumed = await write_consumption(rt, tx, turn)
            recs += block_records(rt, turn, list(turn.held), None)  # S4: cancelled: no measurement
            recs += [
                R.result_record(ToolResult(c.id or "", "Aborted before it ran.", True)) for c in turn.calls
            ]
            if recs:
                await tx.append(rt.id, [dumps(r) for r in recs])
            if not turn.done_emitted and rt.env.hooks:
                # the inference in flight ends here, cancelled: records see its end like any other
                ctx = rt.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
                await rt.env.hooks.response_tx(ctx, response_info(rt, turn, "cancelled", "aborted"))
        aborted_calls = await abort_batch(rt, tx)
        recs += aborted_calls
        # one `done: cancelled` for the cancelled turn, also when it was running its tool batch (X1)
        done_needed = turn is None or not turn.done_emitted or bool(aborted_calls)
        partial = turn is not None and turn.partial
        inf_id = turn.inference_id if turn is not None else None

        def published() -> None:
            if turn is not None:
                consumption_published(rt, turn, consumed)
            rt._publish_records(consumed + recs)
            if partial:
                rt.emit(BlockReset())
            if done_needed:
                rt.emit(Done("cancelled", inference_id=inf_id))

        tx.after_commit(published)
        await settle_in(rt, tx, pending, "aborted")  # after `published`: Done precedes Settled
