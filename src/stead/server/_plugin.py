"""`ServerPlugin`: the HTTP service's durable state, kept in the kernel's own transactions.

Its tables (module `server`, per-dialect migrations):

- `stead_server_agents` — one row per agent the service knows: its tenant, the fingerprint of the request
  that created it (the same id with the same body → 200, another body → 409), the last event `seq`
  (`head_seq`) and the highest pruned one (`pruned_through`).
- `stead_events` — the durable events of every agent, `(agent_id, seq)` with `seq` 1, 2, 3… per agent:
  `activated`, `message_consumed`, `block_end`, `tool_started` (at dispatch), `tool_finished`, `usage`,
  `approval_requested` (a call of the dispatched batch is held for a decision), `approval_decided` (in the
  deciding transaction: approved, rejected, expired or cancelled), `settled`. Each is written by a `*_tx`
  hook, in the transaction that makes the change it describes, so an event exists exactly when its change
  does (a rollback or a crash leaves neither); `seq` is allocated by an upsert on the agent's row, which
  serializes writers of one agent on every dialect.
- `stead_server_messages` — the fingerprint of each message accepted through the service, written in the
  acceptance's transaction, so a reused id with another body is told apart from a retry (422).

Live subscribers are fed from after-commit callbacks (durable events) and `on_event` (token deltas and
`block_reset`, never stored) through the `Hub`. Events older than the retention (`retention_seconds` AND
beyond the last `retention_events` of the agent) are pruned in the background; a stream cursor from before
the pruned range gets `event: reset`.

Agents created outside the service (the Python API, `stead run`) have no tenant row: they belong to the
default tenant, if the service has one. A sub-agent started by a delegation joins its parent's tenant in
the transaction that activates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stead.extend import (
    ApprovalSource,
    AwaitingInputInfo,
    BlockInfo,
    BlockReset,
    CallDecidedInfo,
    Event,
    HookContext,
    Hooks,
    MessageConsumedInfo,
    Migrations,
    Plugin,
    ReasoningDelta,
    ResponseInfo,
    SettledInfo,
    TextDelta,
    ToolDispatchedInfo,
    ToolResultInfo,
    Tx,
    call_gates,
    parent_link,
)
from stead.server._hub import Hub, Live, StoredEvent
from stead.server._redact import public_model, public_text
from stead.server._wire import block_json, dumps, message_json, usage_json

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = ["DURABLE_EVENTS", "LIVE_EVENTS", "MODULE", "EventWriter", "ServerPlugin"]

log = logging.getLogger("stead.server")

MODULE = "server"
DURABLE_EVENTS = (
    "activated",
    "message_consumed",
    "block_end",
    "tool_started",
    "tool_finished",
    "usage",
    "approval_requested",
    "approval_decided",
    "settled",
)
_DECISIONS = ("approved", "rejected", "expired", "cancelled")
LIVE_EVENTS = ("block_reset", "text_delta", "reasoning_delta")

# Migration scripts are split on ';' by the store: no semicolons inside statements.
_SQLITE = [
    """
    CREATE TABLE stead_server_agents (
        agent_id TEXT PRIMARY KEY,
        tenant TEXT,
        fingerprint TEXT,
        head_seq INTEGER NOT NULL DEFAULT 0,
        pruned_through INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE INDEX stead_server_agents_by_tenant ON stead_server_agents(tenant);
    CREATE TABLE stead_events (
        agent_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        run_id TEXT,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (agent_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE stead_server_messages (
        agent_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        events_after INTEGER NOT NULL,
        PRIMARY KEY (agent_id, message_id)
    ) WITHOUT ROWID
    """
]
_POSTGRES = [
    """
    CREATE TABLE stead_server_agents (
        agent_id TEXT PRIMARY KEY,
        tenant TEXT,
        fingerprint TEXT,
        head_seq BIGINT NOT NULL DEFAULT 0,
        pruned_through BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX stead_server_agents_by_tenant ON stead_server_agents(tenant);
    CREATE TABLE stead_events (
        agent_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        run_id TEXT,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (agent_id, seq)
    );
    CREATE TABLE stead_server_messages (
        agent_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        events_after BIGINT NOT NULL,
        PRIMARY KEY (agent_id, message_id)
    )
    """
]

# The same statements run on both dialects (upserts, COALESCE, `?` parameters).
_NEXT_SEQ = (
    "INSERT INTO stead_server_agents(agent_id, head_seq) VALUES (?, 1) "
    "ON CONFLICT(agent_id) DO UPDATE SET head_seq = stead_server_agents.head_seq + 1"
)
_HEAD = "SELECT head_seq FROM stead_server_agents WHERE agent_id = ?"
_INSERT_EVENT = "INSERT INTO stead_events(agent_id, seq, run_id, type, data, at) VALUES (?, ?, ?, ?, ?, ?)"
_ADOPT = (
    "INSERT INTO stead_server_agents(agent_id, tenant) "
    "SELECT ?, tenant FROM stead_server_agents WHERE agent_id = ? AND tenant IS NOT NULL "
    "ON CONFLICT(agent_id) DO UPDATE SET tenant = COALESCE(stead_server_agents.tenant, excluded.tenant)"
)


class ServerPlugin(Plugin):
    """The HTTP service's tables, durable events and live fan-out (see the module docstring).

    `retention_seconds` / `retention_events`: an event is pruned only when it is older than the first AND
    not among the agent's last `retention_events` (defaults: 24 hours, 10,000 events). `max_queue` bounds
    each stream subscriber's queue; `prune_interval` is how often retention runs (None: only when asked,
    `await plugin.prune()`)."""

    name: ClassVar[str] = "server"
    migrations: ClassVar[Migrations] = {"sqlite": {MODULE: _SQLITE}, "postgresql": {MODULE: _POSTGRES}}

    def __init__(
        self,
        *,
        retention_seconds: float = 24 * 3600,
        retention_events: int = 10_000,
        max_queue: int = 1000,
        prune_interval: float | None = 300.0,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.retention_events = retention_events
        self.prune_interval = prune_interval
        self.hub = Hub(max_queue)
        self.events = EventWriter(self.hub)
        self.system: AgentSystem | None = None
        self._pruner: asyncio.Task[None] | None = None

    def hooks(self) -> list[Hooks]:
        return [self.events]

    # ------------------------------------------------------------------ lifecycle
    async def start(self, system: AgentSystem) -> None:
        self.system = system
        self.events.approvals = next((p for p in system.plugins if isinstance(p, ApprovalSource)), None)
        if self.prune_interval is not None:
            self._pruner = asyncio.get_running_loop().create_task(self._prune_forever(self.prune_interval))

    async def close(self, system: AgentSystem) -> None:
        self.hub.close()
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
            self._pruner = None

    async def _prune_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.prune()
            except Exception:
                log.exception("pruning old events failed (will retry)")

    async def prune(self, now: float | None = None) -> int:
        """Delete events past the retention; return how many. One short transaction per agent."""
        assert self.system is not None
        store = self.system.store
        cutoff = (time.time() if now is None else now) - self.retention_seconds
        keep = self.retention_events
        async with store.transaction() as tx:
            candidates = await tx.fetch(
                "SELECT agent_id, head_seq FROM stead_server_agents WHERE head_seq - ? > pruned_through",
                (keep,),
            )
        total = 0
        for agent_id, head in candidates:
            async with store.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT MAX(seq), COUNT(*) FROM stead_events WHERE agent_id = ? AND seq <= ? AND at < ?",
                    (agent_id, int(head) - keep, cutoff),
                )
                bound = rows[0][0] if rows else None
                if bound is None:
                    continue
                total += await tx.execute(
                    "DELETE FROM stead_events WHERE agent_id = ? AND seq <= ?", (agent_id, int(bound))
                )
                await tx.execute(
                    "UPDATE stead_server_agents SET pruned_through = ? WHERE agent_id = ? "
                    "AND pruned_through < ?",
                    (int(bound), agent_id, int(bound)),
                )
        return total


class EventWriter(Hooks):
    """The plugin's hooks: each durable event is written in the kernel's transaction of its change and
    published to the hub after that transaction commits; deltas and `block_reset` go to the hub live."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.approvals: ApprovalSource | None = None
        """The system's approvals (the policy plugin), asked for an aborted call's approval id, whose batch
        entry is gone by the time the abort decides it; None when the system keeps none."""

    async def _event(self, ctx: HookContext, type: str, body: dict[str, Any]) -> None:
        tx = ctx.tx
        if tx is None:
            return
        await self._write(tx, ctx.agent_id, ctx.run_id, type, body)

    async def _write(
        self, tx: Tx, agent_id: str, run_id: str | None, type: str, body: dict[str, Any]
    ) -> StoredEvent:
        # one round trip an event on PostgreSQL: the two writes are pipelined (a failure surfaces at the
        # next wait and fails the transaction), only the head's read waits
        await tx.write_sql(_NEXT_SEQ, (agent_id,))
        (row,) = await tx.fetch(_HEAD, (agent_id,))
        seq = int(row[0])
        at = time.time()
        data = dumps({"seq": seq, "type": type, "agent_id": agent_id, "run_id": run_id, "at": at, **body})
        await tx.write_sql(_INSERT_EVENT, (agent_id, seq, run_id, type, data, at))
        event = StoredEvent(agent_id, seq, run_id, type, data)
        hub = self.hub
        tx.after_commit(lambda: hub.publish(event))
        return event

    async def activated_tx(self, ctx: HookContext) -> None:
        tx = ctx.tx
        if tx is None:
            return
        if not ctx.restored and ctx.message is not None:
            link = parent_link(ctx.message.metadata)
            parent = link.get("agent_id") if link is not None else None
            if isinstance(parent, str):
                # a delegated sub-agent joins its parent's tenant, atomically with its activation
                await tx.execute(_ADOPT, (ctx.agent_id, parent))
        body: dict[str, Any] = {"restored": ctx.restored}
        if ctx.message is not None:
            body["message_id"] = ctx.message.id
        await self._event(ctx, "activated", body)

    async def message_consumed_tx(self, ctx: HookContext, info: MessageConsumedInfo) -> None:
        await self._event(ctx, "message_consumed", {"message": message_json(info.message)})

    async def block_tx(self, ctx: HookContext, info: BlockInfo) -> None:
        body = {"inference_id": ctx.inference_id, "block": block_json(info.block)}
        await self._event(ctx, "block_end", body)

    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        for call in info.calls:
            await self._event(
                ctx,
                "tool_started",
                {"call": {"id": call.id, "name": call.name, "arguments": call.arguments}},
            )

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        call, result = info.call, info.result
        await self._event(
            ctx,
            "tool_finished",
            {
                "call": {"id": call.id, "name": call.name},
                "result": {"call_id": result.call_id, "output": result.output, "is_error": result.is_error},
            },
        )

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        ttft = (
            None if info.first_token_at is None else round((info.first_token_at - info.started_at) * 1000, 3)
        )
        await self._event(
            ctx,
            "usage",
            {
                "inference_id": info.inference_id,
                "provider": info.provider,
                "model": public_model(info.model),
                "reason": info.reason,
                "error": public_text(info.error),
                "usage": usage_json(info.usage),
                "latency_ms": round((info.ended_at - info.started_at) * 1000, 3),
                "ttft_ms": ttft,
            },
        )

    async def _approvals_of(
        self, tx: Tx, agent_id: str, call_ids: Sequence[str]
    ) -> dict[str, tuple[str | None, str]]:
        """(approval id, why it asks) of each held call: the deciding layer's id and text on the call's
        gate, on its batch entry (`call_gates`); else the approval the system's `ApprovalSource` keeps for
        the call (an aborted call's entry is gone when the abort decides it), read in this transaction."""
        found: dict[str, tuple[str | None, str]] = {}
        wanted = set(call_ids)
        for call_id, gate in (await call_gates(tx, agent_id)).items():
            if call_id in wanted and gate.ref is not None:
                found[call_id] = (gate.ref, gate.text if gate.state == "ask" else "")
        for call_id in wanted - found.keys():
            found[call_id] = (None, "")
            if self.approvals is not None:
                approval = await self.approvals.approval_for_call(call_id)
                if approval is not None:
                    found[call_id] = (approval.id, approval.reason)
        return found

    async def awaiting_input_tx(self, ctx: HookContext, info: AwaitingInputInfo) -> None:
        tx, calls = ctx.tx, info.calls
        if tx is None:
            return
        held = await self._approvals_of(tx, ctx.agent_id, [c.id or "" for c in calls])
        for call in calls:
            ref, reason = held[call.id or ""]
            await self._event(
                ctx,
                "approval_requested",
                {
                    "approval_id": ref,
                    "call": {"id": call.id, "name": call.name, "arguments": call.arguments},
                    "reason": reason,
                },
            )

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        tx, call, decision = ctx.tx, info.call, info.decision
        if tx is None:
            return
        ref, _ = (await self._approvals_of(tx, ctx.agent_id, [call.id or ""]))[call.id or ""]
        await self._event(
            ctx,
            "approval_decided",
            {
                "approval_id": ref,
                "call": {"id": call.id, "name": call.name},
                "decision": decision if decision in _DECISIONS else "rejected",
                "note": info.note,
            },
        )

    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        error = info.error
        status = "completed" if error is None else ("cancelled" if error == "aborted" else "failed")
        await self._event(ctx, "settled", {"status": status, "error": public_text(error)})

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        tx = ctx.tx
        if tx is None:
            return
        for table in ("stead_events", "stead_server_messages", "stead_server_agents"):
            await tx.execute(f"DELETE FROM {table} WHERE agent_id = ?", (ctx.agent_id,))
        hub, agent_id = self.hub, ctx.agent_id
        tx.after_commit(lambda: hub.close_agent(agent_id))

    # ------------------------------------------------------------------ live-only events
    def on_event(self, agent_id: str, event: Event) -> None:
        hub = self.hub
        if not hub.subscribers(agent_id):
            return
        if isinstance(event, TextDelta | ReasoningDelta):
            kind = "text_delta" if isinstance(event, TextDelta) else "reasoning_delta"
            data = dumps({"type": kind, "agent_id": agent_id, "text": event.text})
            hub.publish(Live(agent_id, None, kind, data, True))
        elif isinstance(event, BlockReset):
            data = dumps({"type": "block_reset", "agent_id": agent_id})
            hub.publish(Live(agent_id, None, "block_reset", data, False))
