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
from collections.abc import Sequence
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

__all__ = ["Inbound", "accept", "accept_many", "enqueue"]


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
    queued = _queued(item)
    await enqueue(st, tx, _prefix(item), queued.encode())
    activated: Pending | None = None
    if await tx.get(st.id, R.PENDING) is None:
        activated = _activation(item)
        await tx.write_if_absent(st.id, R.PENDING, activated.encode())
        await _activate(st, tx, item, queued, activated)
    await _accepted(st, tx, activated)
    return True


async def accept_many(tx: Tx, entries: Sequence[tuple[AgentState, Inbound]]) -> list[bool]:
    """`accept` of each `(agent, message)` inside `tx`, in order, with the same outcome and the same rows
    as one after another — in a fixed number of store round trips for the whole group instead of about
    three per message (PostgreSQL: one statement each for the identity claims, the queue entries, the
    pending reads and the pending writes). A message whose id was seen before (in the store or earlier in
    `entries`) gets False and writes nothing (A3)."""
    if len(entries) <= 1:
        return [await accept(st, tx, item) for st, item in entries]
    claimed = await tx.write_if_absent_many(
        [(st.id, R.msg_key(item.id), item.delivery) for st, item in entries]
    )
    accepted = [(st, item, _queued(item)) for (st, item), won in zip(entries, claimed, strict=True) if won]
    if not accepted:
        return claimed
    agents = list({st.id: st for st, _, _ in accepted}.values())
    await _enqueue_many(tx, [(st, _prefix(item), queued.encode()) for st, item, queued in accepted])
    pending = await tx.get_many([(st.id, R.PENDING) for st in agents])
    idle = {st.id for st, p in zip(agents, pending, strict=True) if p is None}
    activations: dict[str, tuple[AgentState, Inbound, Queued, Pending]] = {}
    for st, item, queued in accepted:  # an idle agent's first message in this group activates it
        if st.id in idle and st.id not in activations:
            activations[st.id] = (st, item, queued, _activation(item))
    if activations:
        await tx.write_if_absent_many([(aid, R.PENDING, a[3].encode()) for aid, a in activations.items()])
        for st, item, queued, activated in activations.values():
            await _activate(st, tx, item, queued, activated)
    for st, item, _ in accepted:
        first = activations.get(st.id)
        await _accepted(st, tx, first[3] if first is not None and first[1] is item else None)
    return claimed


def _prefix(item: Inbound) -> str:
    return R.STEER if item.delivery == "steer" else R.SEND


def _queued(item: Inbound) -> Queued:
    return Queued("", item.id, item.role, item.content, item.metadata, item.settings, item.user, item.tenant)


def _activation(item: Inbound) -> Pending:
    """The pending record an activating message creates: the run's first message names its user and
    tenant for the whole run (hooks, tools, restarts)."""
    schema = (item.metadata or {}).get(OUTPUT_SCHEMA_METADATA)
    return Pending(
        "inference",
        new_id(),
        activated_at=time.time(),
        user=item.user,
        tenant=item.tenant,
        structured=schema is not None,
    )


async def _activate(st: AgentState, tx: Tx, item: Inbound, queued: Queued, activated: Pending) -> None:
    """What an activation writes beside the pending record: the run's payload and output schema (from the
    activating message), then the activation hook (a failing hook refuses the message, A4)."""
    payload = (item.metadata or {}).get(R.PAYLOAD_METADATA)
    if payload is not None:  # the run starts with the activating message's payload
        await tx.write(st.id, R.PAYLOAD, dumps(payload))
    schema = (item.metadata or {}).get(OUTPUT_SCHEMA_METADATA)
    if schema is not None:  # ... and its output schema (typed result)
        await tx.write(st.id, R.OUTPUT_SCHEMA, dumps(schema))
    if st.hooks.wants("activated_tx"):
        ctx = st.hook_ctx(tx, activated)
        ctx.message = queued.message()
        await st.hooks.activated_tx(ctx)


async def _accepted(st: AgentState, tx: Tx, activated: Pending | None) -> None:
    """The owner's wake-up (W3) and the after-commit publication of one accepted message."""
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


async def enqueue(st: AgentState, tx: Tx, prefix: str, value: str) -> str:
    """Write `value` under the next queue key of `prefix` and return the key."""
    nxt = await _next_slot(st, tx, prefix)
    key = R.queue_key(prefix, *nxt)
    while not await tx.write_if_absent(st.id, key, value):  # claim; collisions bump the sequence
        nxt = (nxt[0], nxt[1] + 1)
        key = R.queue_key(prefix, *nxt)
    # the cache only speeds up the next key; a rolled-back claim just makes the next one skip a number
    st.qseq[prefix] = nxt
    return key


async def _next_slot(st: AgentState, tx: Tx, prefix: str) -> tuple[int, int]:
    """The (millisecond slot, sequence) after the queue's last key (read once, then cached)."""
    last = st.qseq.get(prefix)
    if last is None:
        raw = await tx.last_key(st.id, prefix)
        if raw is None:
            last = (0, 0)
        else:
            slot_s, seq_s = raw[len(prefix) :].split(".")
            last = (int(slot_s), int(seq_s))
    now = int(time.time() * 1000)
    return (now, 0) if now > last[0] else (last[0], last[1] + 1)


async def _enqueue_many(tx: Tx, entries: Sequence[tuple[AgentState, str, str]]) -> None:
    """`enqueue` of each `(agent, prefix, value)`, in order, with one claim statement for all: each key
    is the next of its agent's queue. An agent whose planned key was taken (its cached sequence was behind
    the store) has its claims of this group undone and its entries enqueued one by one, in order."""
    planned: list[tuple[AgentState, str, str, str]] = []
    for st, prefix, value in entries:
        nxt = await _next_slot(st, tx, prefix)
        st.qseq[prefix] = nxt
        planned.append((st, prefix, value, R.queue_key(prefix, *nxt)))
    won = await tx.write_if_absent_many([(st.id, key, value) for st, _, value, key in planned])
    behind = {st.id for (st, *_), ok in zip(planned, won, strict=True) if not ok}
    if not behind:
        return
    for (st, prefix, _, key), ok in zip(planned, won, strict=True):
        if st.id in behind:
            st.qseq.pop(prefix, None)  # read the queue's last key again
            if ok:
                await tx.delete(st.id, key)
    for st, prefix, value, _ in planned:
        if st.id in behind:
            await enqueue(st, tx, prefix, value)
