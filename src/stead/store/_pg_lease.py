"""Ownership of agents by workers on PostgreSQL: the registry, heartbeats, sweeps and claims.

Each worker process registers a fresh uuid in `stead_workers`; every agent is owned by at most one live
worker through `agents.owner` and `agents.epoch` (the fencing token: it moves on every change of owner).
All times are the database's clock (`now()`), never a worker's. Every statement here is one short
autocommit transaction; agents are picked with `FOR NO KEY UPDATE SKIP LOCKED`, so a sweep or a claim
never waits on an agent another transaction holds (it skips it; the next round gets it).

The fence itself (`stead_fence`, `_pg_schema`) runs inside the transactions of `PostgresStore`; this
module only moves leases.
"""

from __future__ import annotations

import uuid
from typing import Any

__all__ = [
    "CLAIM",
    "FORGET_WORKERS",
    "HEARTBEAT",
    "NOTIFY_CLAIM",
    "OWNED",
    "REGISTER",
    "RELEASE",
    "SWEEP_AGENTS",
    "SWEEP_WORKERS",
    "channel_of",
]

REGISTER = b"INSERT INTO stead_workers(id, host, pid, capacity) VALUES(%s, %s, %s, %s) RETURNING id"

HEARTBEAT = (
    b"UPDATE stead_workers SET heartbeat_at = now() WHERE id = %s AND state <> 'evicted' RETURNING state"
)


# never the sweeping worker itself: running the sweep shows it is alive, even when a starved event loop
# ran its heartbeat late (evicting itself would stop all its agents and end its own sessions)
SWEEP_WORKERS = (
    b"UPDATE stead_workers SET state = 'evicted' WHERE state <> 'evicted' "
    b"AND heartbeat_at < now() - make_interval(secs => %s) AND id IS DISTINCT FROM %s::uuid RETURNING id"
)

# agents of evicted (or vanished) workers: released with epoch + 1, skipping rows a transaction holds
SWEEP_AGENTS = (
    b"UPDATE agents a SET owner = NULL, epoch = a.epoch + 1, owned_since = NULL "
    b"FROM (SELECT a2.id FROM agents a2 LEFT JOIN stead_workers w ON w.id = a2.owner "
    b"      WHERE a2.owner IS NOT NULL AND (w.id IS NULL OR w.state = 'evicted') "
    b"      FOR NO KEY UPDATE OF a2 SKIP LOCKED) s "
    b"WHERE a.id = s.id RETURNING a.id"
)

# owed work: a `pending` record, or an unconsumed queue entry (`q.` keys); unowned; up to n
# evicted workers that own nothing and went silent over an hour ago (kept that long for audits and logs)
FORGET_WORKERS = (
    b"DELETE FROM stead_workers w WHERE w.state = 'evicted' AND w.heartbeat_at < now() - interval '1 hour' "
    b"AND NOT EXISTS (SELECT 1 FROM agents a WHERE a.owner = w.id)"
)

CLAIM = (
    b"UPDATE agents a SET owner = %s, epoch = a.epoch + 1, owned_since = now() "
    b"FROM (SELECT a2.id FROM agents a2 WHERE a2.owner IS NULL AND EXISTS ("
    b"        SELECT 1 FROM kv k WHERE k.agent_id = a2.id AND (k.key = 'pending' "
    b"        OR (k.key >= 'q.' AND k.key < 'q/'))) "
    b"      ORDER BY a2.created_at, a2.id LIMIT %s FOR NO KEY UPDATE OF a2 SKIP LOCKED) c "
    b"WHERE a.id = c.id RETURNING a.id, a.epoch"
)

RELEASE = (
    b"UPDATE agents SET owner = NULL, epoch = epoch + 1, owned_since = NULL "
    b"WHERE id = %s AND owner = %s AND epoch = %s RETURNING epoch"
)

NOTIFY_CLAIM = b"SELECT pg_notify('stead_claim', %s)"

OWNED = b"SELECT id, epoch FROM agents WHERE owner = %s"


def channel_of(worker_id: str | uuid.UUID) -> str:
    """The NOTIFY channel of one worker: `stead_w_<uuid hex>`."""
    return "stead_w_" + (worker_id.hex if isinstance(worker_id, uuid.UUID) else uuid.UUID(worker_id).hex)


def as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
