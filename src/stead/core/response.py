"""The commits of one response without a tool batch: held blocks mid-stream, the response's end, a
cut-off response, a failed turn (S1, S3, S4, C6, T4).

Completed blocks are held and committed at the next block boundary (`commit_held`, when the next block
starts streaming) or at the end of the response (`commit_end`), and observers get their `BlockEnd` only
after that commit: the conversation in memory always equals what a reload rebuilds, and a half-streamed
block is never stored. The first of these commits also carries the turn's staged consumption (C1). A
response that ends a run settles it in the same transaction (`stead.core.settle`); a response with tool
calls goes to `stead.core.batch` instead.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar, cast

from stead.core import records as R
from stead.core.consume import consumption_published, write_consumption
from stead.core.hooks import BlockInfo, ResponseInfo
from stead.core.outcome import Outcome
from stead.core.records import Pending
from stead.core.settle import settle_in
from stead.core.state import AgentState, Turn
from stead.messages import (
    Block,
    ToolResult,
    Usage,
    dumps,
    encode_block,
    encode_usage,
    repair_block,
    repair_text,
)
from stead.providers.base import BlockEnd, Done, DoneReason

__all__ = [
    "block_records",
    "commit_end",
    "commit_held",
    "commit_partial",
    "fail",
    "repaired",
    "response_info",
]

log = logging.getLogger("stead.core")

B = TypeVar("B", bound=Block)


def repaired(st: AgentState, block: B, what: str) -> B:
    """S5: `block` as it may be stored — text that cannot be encoded (a lone surrogate) replaced with U+FFFD
    and the block marked `repaired` — where it comes in from outside (`what`: "model output", "a tool
    result")."""
    fixed = repair_block(block)
    if fixed is not block:
        log.warning(
            "agent %s: %s held text that cannot be stored (a lone surrogate): replaced with U+FFFD",
            st.id,
            what,
        )
    return cast(B, fixed)


def block_records(
    turn: Turn, blocks: list[Block], usage: Usage | None, reason: str | None = None
) -> list[dict[str, Any]]:
    """History records of a response's completed blocks; the usage rides on the last one (S4), and so does
    `"f": "length"` for a response cut by its output cap (MR2; the history shows it)."""
    inf = turn.inference_id
    recs: list[dict[str, Any]] = [{"k": "b", "i": inf, "b": encode_block(b)} for b in blocks]
    if recs and usage is not None:
        recs[-1]["u"] = encode_usage(usage)
    if recs and reason == "length":
        recs[-1]["f"] = reason
    return recs


def response_info(turn: Turn, reason: str, error: str | None) -> ResponseInfo:
    """What `response_tx` hooks are told about the inference that just ended."""
    return ResponseInfo(
        inference_id=turn.inference_id,
        provider=str(turn.settings.get("provider")),
        model=str(turn.settings.get("model")),
        reason=reason,
        usage=turn.usage,
        started_at=turn.started_at,
        first_token_at=turn.first_token_at,
        ended_at=time.time(),
        error=error if error is None else repair_text(error),
        model_call=turn.model_call,
        context=turn.context,
    )


async def commit_held(st: AgentState, turn: Turn) -> None:
    """Commit completed blocks mid-response (the next block started streaming)."""
    blocks = list(turn.held)
    async with st.env.store.transaction() as tx:
        consumed = await write_consumption(st, tx, turn)
        recs = block_records(turn, blocks, None)
        await tx.append(st.id, [dumps(r) for r in recs])
        if st.hooks.wants("block_tx"):
            ctx = st.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
            for b in blocks:
                await st.hooks.block_tx(ctx, BlockInfo(b))
        pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
        await tx.write(st.id, R.PENDING, pending.encode())

        def published() -> None:
            consumption_published(st, turn)
            st.publish_records(consumed + recs)
            turn.pending = pending
            st.pending = pending
            if st.listening:
                for b in blocks:
                    st.emit(BlockEnd(b))

        tx.after_commit(published)
    turn.held.clear()


async def commit_partial(st: AgentState, turn: Turn) -> None:
    """A response was cut off or failed retryably: keep its completed blocks; calls it emitted get error
    results (T4) so the conversation never keeps a call without one."""
    if not turn.held and (turn.consumed or not turn.take):
        return
    results = [
        ToolResult(c.id or "", "The response was cut off before this call could run; it was not run.", True)
        for c in turn.calls
    ]
    await commit_end(st, turn, results=results, note=None, settle=False, owe=True, reason="error")


async def fail(st: AgentState, turn: Turn, error: str, *, end_run: bool = False) -> bool:
    """C6/T4: the turn failed. Its input counts as consumed, its calls get error results, and a system
    note tells the next inference; queued work is still answered — unless `end_run` (a guardrail
    refused the inference), which settles the run with queued messages left queued, like an abort."""
    st.attempt = 0
    error = repair_text(error)  # S5: a provider's error text is model output too
    st.last_error = error
    results = [ToolResult(c.id or "", f"Not run: the turn failed ({error}).", True) for c in turn.calls]
    return await commit_end(
        st,
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
    st: AgentState,
    turn: Turn,
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
    a note; then settlement (if nothing is queued), or the pending record for what comes next. Returns
    whether the loop goes on."""
    blocks = list(turn.held)
    more = True
    hooks = st.hooks
    async with st.env.store.transaction() as tx:
        consumed = await write_consumption(st, tx, turn)
        # S4: a failed or cut-off response keeps the previous usage measurement
        usage = turn.usage if reason not in ("error", "cancelled") else None
        recs = block_records(turn, blocks, usage, reason)
        recs += [R.result_record(r) for r in results]
        if note is not None:
            recs.append({"k": "s", "x": note})
        if recs:
            await tx.append(st.id, [dumps(r) for r in recs])
        want_blocks = bool(blocks) and hooks.wants("block_tx")
        if want_blocks or hooks.wants("response_tx"):
            ctx = st.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
            if want_blocks:
                for b in blocks:
                    await hooks.block_tx(ctx, BlockInfo(b))
            await hooks.response_tx(ctx, response_info(turn, reason, error))
        if usage is not None and not blocks:
            # S4: the usage rides on the response's last block record; without blocks it gets a key
            await tx.write(st.id, R.USAGE, dumps(encode_usage(usage)))
        pending: Pending | None
        if owe:
            pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
            await tx.write(st.id, R.PENDING, pending.encode())
        else:
            queued = await tx.read_prefix(st.id, R.QUEUE)
            if settle and (force_settle or not any(v for _, v in queued)):
                pending = None
                more = False  # settled below, after `published`: the response's Done precedes Settled
            else:
                pending = turn.pending.but(turn_id=None, inference_id=None)
                await tx.write(st.id, R.PENDING, pending.encode())

        def published() -> None:
            consumption_published(st, turn)
            st.publish_records(consumed + recs)
            turn.pending = pending or turn.pending
            if pending is not None:
                st.pending = pending
            if not owe:
                turn.done_emitted = True
            if st.listening:
                for b in blocks:
                    st.emit(BlockEnd(b))
                if not owe:
                    st.emit(
                        Done(
                            cast(DoneReason, reason),
                            error=error,
                            usage=turn.usage,
                            inference_id=turn.inference_id,
                        )
                    )

        tx.after_commit(published)
        if not more:
            outcome = Outcome.COMPLETED if error is None else Outcome.FAILED
            await settle_in(
                st,
                tx,
                turn.pending,
                outcome,
                error,
                written=consumed + recs,
                reset=turn.reset and bool(consumed),
            )
    turn.held.clear()
    turn.calls.clear()
    return more
