"""Abort (X1): the cancelled turn settles in one transaction.

`agent.abort()` cancels the agent's loop task; the loop then commits, in one transaction, the turn's
staged consumption, its finished blocks (the streaming block is dropped), aborted error results for its
unanswered calls and for every unanswered call of a dispatched batch, a `response_tx(cancelled)` for the
inference in flight, and the settlement with outcome `cancelled`. Exactly one `done: cancelled` is emitted.
Already-queued messages stay queued (and reopen nothing: the abort ends the run).
"""

from __future__ import annotations

import asyncio
from typing import Any

from stead.core import records as R
from stead.core.batch import abort_batch
from stead.core.compaction import reject_waiters
from stead.core.consume import consumption_published, write_consumption
from stead.core.events import BlockReset
from stead.core.outcome import Outcome
from stead.core.records import Pending
from stead.core.response import block_records, response_info
from stead.core.settle import settle_in
from stead.core.state import AgentState, Turn
from stead.errors import LeaseLost, StoreCrashed, StoreError
from stead.messages import ToolResult, dumps
from stead.providers.base import Done

__all__ = ["ABORTED", "after_abort", "commit_abort"]

ABORTED = "aborted"
"""The error text of an aborted run (its outcome is `Outcome.CANCELLED`)."""


async def after_abort(st: AgentState) -> bool:
    """X1: settle an aborted turn (retried on transient store errors; a dead store stops here). Returns
    whether the loop goes on (never: the abort ends the run)."""
    turn = st.turn
    for t in list(st.running.values()):
        t.cancel()
    try:
        while True:
            try:
                await commit_abort(st, turn)
                return False
            except StoreCrashed:
                st.draining = True
                return False
            except LeaseLost:
                raise  # W2: never retried; the loop stops this agent here
            except StoreError:
                await asyncio.sleep(st.env.store_retry_delay)
    finally:
        st.turn = None


async def commit_abort(st: AgentState, turn: Turn | None) -> None:
    """One transaction: the aborted turn's input, finished blocks and error results, then settlement."""
    async with st.env.store.transaction() as tx:
        pending = Pending.decode(await tx.get(st.id, R.PENDING))
        if pending is None:
            return
        recs: list[dict[str, Any]] = []
        consumed: list[dict[str, Any]] = []
        if turn is not None:
            consumed = await write_consumption(st, tx, turn)
            recs += block_records(turn, list(turn.held), None)  # S4: cancelled: no measurement
            recs += [
                R.result_record(ToolResult(c.id or "", "Aborted before it ran.", True)) for c in turn.calls
            ]
            if recs:
                await tx.append(st.id, [dumps(r) for r in recs])
            if not turn.done_emitted and st.hooks.wants("response_tx"):
                # the inference in flight ends here, cancelled: records see its end like any other
                ctx = st.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
                await st.hooks.response_tx(ctx, response_info(turn, "cancelled", ABORTED))
        aborted_calls = await abort_batch(st, tx)
        recs += aborted_calls
        await tx.delete(st.id, R.COMPACT)  # K1: a requested compaction nobody will run is rejected
        # one `done: cancelled` for the cancelled turn, also when it was running its tool batch (X1)
        done_needed = turn is None or not turn.done_emitted or bool(aborted_calls)
        partial = turn is not None and turn.partial
        inf_id = turn.inference_id if turn is not None else None

        def published() -> None:
            if turn is not None:
                consumption_published(st, turn)
            st.publish_records(consumed + recs)
            reject_waiters(st, f"agent {st.id} was aborted before its compaction ran")
            if st.listening:
                if partial:
                    st.emit(BlockReset())
                if done_needed:
                    st.emit(Done("cancelled", inference_id=inf_id))

        tx.after_commit(published)
        # after `published`: Done precedes Settled
        reset = turn is not None and turn.reset and bool(consumed)
        await settle_in(st, tx, pending, Outcome.CANCELLED, ABORTED, written=consumed + recs, reset=reset)
