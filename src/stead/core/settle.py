"""Settlement (X2, X3): the end of an active period, in one transaction.

Inside the transaction that ends the run: the pending record is deleted, run-scoped KV is cleared (the
run's payload, `kv.r.payload`, is kept in the end record first), the end-of-run history record
(`{"k":"e","run":…,"o":outcome}`, the durable link from the run to its outcome, see `stead.core.results`)
is appended and the `settled_tx` hooks run with a `SettledInfo` (and `ctx.outcome`). Work accepted
inside this very transaction (by a hook) re-creates the pending record, which reopens the run instead of
stranding the work. After the commit: the mirror, the `Settled` event, and the observing `settled` hooks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from contextlib import aclosing
from typing import Any

from stead.core import records as R
from stead.core.events import Settled
from stead.core.hooks import SettledInfo
from stead.core.outcome import Outcome
from stead.core.records import Pending
from stead.core.results import history_from_end
from stead.core.state import AgentState
from stead.messages import dumps
from stead.store.base import Tx

__all__ = ["settle_in"]


async def settle_in(
    st: AgentState,
    tx: Tx,
    pending: Pending,
    outcome: Outcome,
    error: str | None,
    *,
    written: Sequence[dict[str, Any]] = (),
    reset: bool = False,
) -> None:
    """Inside `tx`: end the run `pending` describes with `outcome` (and `error` when it did not complete).
    `written` are the history records this transaction appended before (not in the mirror yet), `reset`
    whether it replaced the history with them: the settle hooks' `SettledInfo` computes the run's result from
    the mirror and these, on first use (no read)."""
    agent_id = st.id
    hooks = st.hooks
    want_tx, want_after = hooks.wants("settled_tx"), hooks.wants("settled")
    tail: list[dict[str, Any]] | None = None
    if (want_tx or want_after) and not reset and st.records is None:
        tail = await _tail(tx, agent_id)  # the history is not in memory here (an abort before any stage)
    await tx.delete(agent_id, R.PENDING)
    payload = await tx.get(agent_id, R.PAYLOAD)  # the run's payload outlives its run KV in the end record
    await tx.delete_prefix(agent_id, R.RUN_KV)
    run_payload = None if payload is None else json.loads(payload)
    end = R.end_record(pending.run_id, outcome, error, run_payload)
    await tx.append(agent_id, [dumps(end)])
    ctx = None
    info: SettledInfo | None = None
    reopened: Pending | None = None
    if want_tx or want_after:
        ctx = st.hook_ctx(tx, pending)
        ctx.outcome = outcome
        if reset:
            source = _run_records([], list(written))
        elif tail is not None:
            source = _run_records(tail, [])
        else:
            source = _run_records(st.records or [], list(written))
        info = SettledInfo(outcome, error, pending.run_id, run_payload, source)
        if want_tx:
            await hooks.settled_tx(ctx, info)
            # X2: work accepted inside this very transaction (by the hook) re-created the pending record;
            # it was published first by its own after-commit callback and must not be overwritten here
            reopened = Pending.decode(await tx.get(agent_id, R.PENDING))
    st.last_error = None

    def published() -> None:
        st.publish_records([end])
        st.pending = reopened
        st.restored = False  # X3: a restored period that ended unannounced (aborted) is over
        if st.listening:
            st.emit(Settled(pending.run_id, error, outcome))
        if ctx is not None and info is not None and want_after:
            ctx.tx = None
            task = asyncio.get_running_loop().create_task(hooks.settled(ctx, info))
            st.background.add(task)
            task.add_done_callback(st.background.discard)

    tx.after_commit(published)


def _run_records(
    history: list[dict[str, Any]], written: list[dict[str, Any]]
) -> Callable[[], list[dict[str, Any]]]:
    """The run's records before its end record, computed when asked: `history` up to its length now (the
    mirror only grows by appends; a reset replaces the list), back to the previous run's end record, then
    `written`."""
    n = len(history)

    def run() -> list[dict[str, Any]]:
        start = n
        while start > 0 and history[start - 1].get("k") != "e":
            start -= 1
        return [*history[start:n], *written]

    return run


async def _tail(tx: Tx, agent_id: str) -> list[dict[str, Any]]:
    """The history records after the last end record, read from the end (O(the run))."""
    out: list[dict[str, Any]] = []  # newest first
    async with aclosing(history_from_end(tx, agent_id)) as records:
        async for rec in records:
            if rec.get("k") == "e":
                break
            out.append(rec)
    out.reverse()
    return out
