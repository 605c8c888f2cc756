"""Admission: writing one accepted message into its agent's queue (A1–A7).

The transaction that accepts a message writes its identity (`msg.<id>`, absent-only: a repeated id is
ignored, A3), its queue entry and — if absent — the pending record; creating that record is the activation,
and the activation hook runs in the same transaction (a failing hook refuses the message, A4); an
activating message's payload (`metadata["stead.payload"]`) becomes the run's payload (`kv.r.payload`).
The queue and the loop change only after the commit, so accepting inside a caller's own transaction publishes
nothing until that caller commits (A6). Validation and copying happen before (in `stead.Agent`); grouping
concurrent acceptances into one commit happens above (in `stead._group_commit`).

Queue keys sort by (millisecond slot, sequence) and take `max(now, last slot)`: a clock moving backwards
only bumps the sequence, so order survives restarts and clock changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from stead._ids import new_id
from stead.core import records as R
from stead.core.events import Activated
from stead.core.records import Pending, Queued
from stead.core.state import AgentState
from stead.core.structured import OUTPUT_SCHEMA_METADATA
from stead.messages import Role, dumps
from stead.store.base import Tx

__all__ = ["Inbound", "accept", "enqueue"]


@dataclass(slots=True)
class Inbound:
    """A validated, copied message on its way into a queue."""

    id: str
    delivery: str  # "send" | "steer"
    role: Role
    content: list[dict[str, Any]]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]
    user: str | None = None
    tenant: str | None = None


async def accept(st: AgentState, tx: Tx, item: Inbound) -> bool:
    """Write one accepted message inside `tx`. Returns False when the id was seen before (A3)."""
    if not await tx.write_if_absent(st.id, R.msg_key(item.id), item.delivery):
        return False
    prefix = R.STEER if item.delivery == "steer" else R.SEND
    queued = Queued(
        "", item.id, item.role, item.content, item.metadata, item.settings, item.user, item.tenant
    )
    await enqueue(st, tx, prefix, queued.encode())
    activated: Pending | None = None
    if await tx.get(st.id, R.PENDING) is None:
        # the run's first message names its user and tenant for the whole run (hooks, tools, restarts)
        schema = (item.metadata or {}).get(OUTPUT_SCHEMA_METADATA)
        activated = Pending(
            "inference",
            new_id(),
            activated_at=time.time(),
            user=item.user,
            tenant=item.tenant,
            structured=schema is not None,
        )
        await tx.write_if_absent(st.id, R.PENDING, activated.encode())
        payload = (item.metadata or {}).get(R.PAYLOAD_METADATA)
        if payload is not None:  # the run starts with the activating message's payload
            await tx.write(st.id, R.PAYLOAD, dumps(payload))
        if schema is not None:  # ... and its output schema (typed result)
            await tx.write(st.id, R.OUTPUT_SCHEMA, dumps(schema))
        if st.hooks.wants("activated_tx"):
            ctx = st.hook_ctx(tx, activated)
            ctx.message = queued.message()
            await st.hooks.activated_tx(ctx)

    notify = tx.store.capabilities.owner_notify
    if notify is not None:
        # W3: PostgreSQL wakes the agent's owner (or a free worker) when, and only if, this commits
        await notify.notify_owner(tx, st.id)

    def published() -> None:
        if activated is not None:
            st.pending = activated
            if st.listening:
                st.emit(Activated(activated.run_id, restored=False))
        st.wake()

    tx.after_commit(published)
    return True


async def enqueue(st: AgentState, tx: Tx, prefix: str, value: str) -> str:
    """Write `value` under the next queue key of `prefix` and return the key."""
    last = st.qseq.get(prefix)
    if last is None:
        raw = await tx.last_key(st.id, prefix)
        if raw is None:
            last = (0, 0)
        else:
            slot_s, seq_s = raw[len(prefix) :].split(".")
            last = (int(slot_s), int(seq_s))
    now = int(time.time() * 1000)
    nxt = (now, 0) if now > last[0] else (last[0], last[1] + 1)
    key = R.queue_key(prefix, *nxt)
    while not await tx.write_if_absent(st.id, key, value):  # claim; collisions bump the sequence
        nxt = (nxt[0], nxt[1] + 1)
        key = R.queue_key(prefix, *nxt)
    # the cache only speeds up the next key; a rolled-back claim just makes the next one skip a number
    st.qseq[prefix] = nxt
    return key
