"""Settlement (X2, X3): the end of an active period, in one transaction.

Inside the transaction that ends the run: the pending record is deleted, run-scoped KV is cleared (the
run's payload, `kv.r.payload`, is kept in the end record first), the end-of-run history record
(`{"k":"e","run":…,"o":outcome}`, the durable link from the run to its outcome, see `stead.core.results`)
is appended and the `settled_tx` hooks run with `ctx.outcome`. Work accepted
inside this very transaction (by a hook) re-creates the pending record, which reopens the run instead of
stranding the work. After the commit: the mirror, the `Settled` event, and the observing `settled` hooks.
"""

from __future__ import annotations

import asyncio
import json

from stead.core import records as R
from stead.core.events import Settled
from stead.core.outcome import Outcome
from stead.core.records import Pending
from stead.core.state import AgentState
from stead.messages import dumps
from stead.store.base import Tx

__all__ = ["settle_in"]


async def settle_in(st: AgentState, tx: Tx, pending: Pending, outcome: Outcome, error: str | None) -> None:
    """Inside `tx`: end the run `pending` describes with `outcome` (and `error` when it did not complete)."""
    agent_id = st.id
    await tx.delete(agent_id, R.PENDING)
    payload = await tx.get(agent_id, R.PAYLOAD)  # the run's payload outlives its run KV in the end record
    await tx.delete_prefix(agent_id, R.RUN_KV)
    end = R.end_record(pending.run_id, outcome, error, None if payload is None else json.loads(payload))
    await tx.append(agent_id, [dumps(end)])
    hooks = st.hooks
    ctx = None
    reopened: Pending | None = None
    if hooks.wants("settled_tx") or hooks.wants("settled"):
        ctx = st.hook_ctx(tx, pending)
        ctx.outcome = outcome
        if hooks.wants("settled_tx"):
            await hooks.settled_tx(ctx, error)
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
        if ctx is not None and hooks.wants("settled"):
            ctx.tx = None
            task = asyncio.get_running_loop().create_task(hooks.settled(ctx, error))
            st.background.add(task)
            task.add_done_callback(st.background.discard)

    tx.after_commit(published)
