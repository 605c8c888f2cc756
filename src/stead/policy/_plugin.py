"""`PolicyPlugin`: the permission-mode policy the kernel enforces, and durable human approvals.

At dispatch (inside the batch's own transaction, T1) its `gate_call_tx` hook asks the policy table
(`stead.policy._modes`) about every call, with the permission mode the consuming turn made effective:
`run` lets the call run; `deny` refuses it (the error result names the mode, committed in call order, the
call never runs); `ask` writes an `approvals` row in that same transaction and holds the call
(`stead.core.gate`), so a request exists exactly when its held call does — a crash can lose neither alone.

Decisions run in one transaction each: the row's `UPDATE ... WHERE status = 'pending'` (its row count says
whether this decision was the first: a later one returns the stored decision with `decided=False`) and the
kernel's decision on the held call (`Agent.release_call` / `Agent.refuse_call`) commit together. Approve:
the call runs once, under its tool's own flags (edited arguments are validated against the tool's schema
before anything is written). Reject: the call's error result "rejected by reviewer: …" commits with the
decision. Expiry rejects with "approval expired". The kernel's own decisions — a steered message rejects
held calls in its consumption transaction, an abort cancels them — reach the rows through
`call_decided_tx`, in the kernel's transaction.

A child agent's approvals carry the root run of its delegation tree (`root_run_id`), learned at the child's
activation from the delegating message's `stead.parent` link (`stead.observability.records.PARENT_KEY`)
and kept in the child's run KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from stead.extend import (
    PERMISSION_MODES,
    AgentScope,
    AgentSystem,
    Approval,
    ApprovalStatus,
    CallDecidedInfo,
    ConfigurationError,
    Decision,
    Gate,
    GateCallInfo,
    HookContext,
    Hooks,
    InvalidInput,
    Migrations,
    NotFound,
    Plugin,
    ToolArgumentError,
    Tx,
    new_id,
    page_query,
    parent_link,
)
from stead.policy import _sql as Q
from stead.policy._modes import DEFAULT_TABLE, Cell, Rules, check_table, decide, rules_from

__all__ = ["PERMISSIONS_KEY", "ROOT_KEY", "PolicyPlugin"]

log = logging.getLogger("stead.policy")

PERMISSIONS_KEY = "stead.permissions"
"""`AgentConfig.extra` key: the agent's allow / ask / deny rules (`{"allow": [...], ...}`)."""
ROOT_KEY = "kv.r.stead.root_run"
"""Run KV key of a child agent: the root run of its delegation tree (erased at settlement)."""
REJECTED = "rejected by reviewer: {note}"
EXPIRED = "approval expired: nobody decided in time; the call never ran"
KERNEL = "stead"
"""`decided_by` of decisions the kernel made (a steered message, an abort)."""


def _approval(row: Sequence[Any]) -> Approval:
    return Approval(
        id=str(row[0]),
        agent_id=str(row[1]),
        run_id=str(row[2]),
        root_run_id=str(row[3]),
        call_id=str(row[4]),
        tool=str(row[5]),
        arguments=json.loads(row[6]),
        effects=str(row[7]),
        destructive=bool(row[8]),
        mode=str(row[9]),
        reason=str(row[10]),
        status=row[11],
        note=row[12],
        edited_arguments=None if row[13] is None else json.loads(row[13]),
        decided_by=row[14],
        created_at=float(row[15]),
        decided_at=None if row[16] is None else float(row[16]),
        expires_at=None if row[17] is None else float(row[17]),
    )


class PolicyPlugin(Plugin):
    """Permission-mode policy + durable approvals. `stead.open(url, approvals=True)` adds one.

    `rules`: allow / ask / deny patterns for every agent of the system (each agent's own rules, from its
    definition's `permissions:` or `extra["stead.permissions"]`, add to them; deny wins). `table`: replaces
    the default policy table (every mode, every column). `expire_after`: seconds after which an undecided
    approval expires (its call is rejected with "approval expired"); `check_every`: how often the
    background task looks for due ones. `clock`: for tests."""

    name: ClassVar[str] = "policy"
    migrations: ClassVar[Migrations] = Q.MIGRATIONS

    def __init__(
        self,
        *,
        rules: Rules | Mapping[str, Sequence[str]] | None = None,
        table: Mapping[str, Mapping[str, Cell]] | None = None,
        expire_after: float | None = None,
        check_every: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.rules = rules_from(rules) if rules is not None else Rules()
        self.table = dict(table) if table is not None else DEFAULT_TABLE
        try:
            check_table(self.table, PERMISSION_MODES)
        except ValueError as e:
            raise ConfigurationError(str(e)) from None
        if expire_after is not None and expire_after <= 0:
            raise ConfigurationError("expire_after must be a positive number of seconds")
        self.expire_after = expire_after
        self.check_every = check_every
        self.clock: Callable[[], float] = clock or time.time
        self._system: AgentSystem | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._hooks = _PolicyHooks(self)

    def hooks(self) -> list[Hooks]:
        return [self._hooks]

    # ------------------------------------------------------------------ lifecycle
    async def start(self, system: AgentSystem) -> None:
        self._system = system
        if self.expire_after is not None and not system.readonly:
            self._expiry = asyncio.get_running_loop().create_task(self._expire_loop(), name="stead-expiry")

    async def close(self, system: AgentSystem) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
            self._expiry = None

    @property
    def system(self) -> AgentSystem:
        if self._system is None:
            raise ConfigurationError("the policy plugin has not started")
        return self._system

    # ------------------------------------------------------------------ the policy, at dispatch
    def rules_for(self, extra: Mapping[str, Any]) -> Rules:
        """The rules that apply to an agent: the system's plus its own."""
        return self.rules + rules_from(extra.get(PERMISSIONS_KEY))

    async def gate_call_tx(self, ctx: HookContext, info: GateCallInfo) -> Gate | None:
        call, tool = info.call, info.tool
        if tool is None or ctx.tx is None or call.id is None:
            return None  # not offered: the kernel answers it (T6)
        mode = ctx.permission_mode
        verdict = decide(mode, tool, call.arguments, self.rules_for(ctx.extra), self.table)
        if verdict.cell == "run":
            return None
        if verdict.cell == "deny":
            return Gate.deny(verdict.reason)
        if not callable(tool.approval):
            try:
                tool.validate(call.arguments)
            except ToolArgumentError:
                return None  # it cannot run anyway: its T6 error result answers it, no human is asked
        tx = ctx.tx
        run_id = ctx.run_id or ""
        root = await tx.get(ctx.agent_id, ROOT_KEY)
        approval_id = new_id()
        now = self.clock()
        expires = now + self.expire_after if self.expire_after is not None else None
        await tx.execute(
            Q.INSERT,
            (
                approval_id,
                ctx.agent_id,
                run_id,
                json.loads(root) if root else run_id,
                call.id,
                call.name,
                json.dumps(call.arguments, ensure_ascii=False),
                tool.effects,
                1 if tool.destructive else 0,
                mode,
                verdict.reason,
                now,
                expires,
            ),
        )
        return Gate.ask(verdict.reason, approval_id)

    async def activated_tx(self, ctx: HookContext) -> None:
        """A child agent's run learns the root run of its delegation tree (for `root_run_id`)."""
        if ctx.tx is None or ctx.restored or ctx.message is None:
            return
        link = parent_link(ctx.message.metadata)
        if link is None:
            return
        parent_agent = link.get("agent_id")
        root: str = link["run_id"]
        if isinstance(parent_agent, str):
            parents_root = await ctx.tx.get(parent_agent, ROOT_KEY)
            if parents_root:
                root = json.loads(parents_root)
        await ctx.tx.write(ctx.agent_id, ROOT_KEY, json.dumps(root))

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        """The kernel decided a held call (a steered message, an abort), or this plugin did (then the row
        is no longer pending and nothing changes)."""
        call, decision = info.call, info.decision
        if ctx.tx is None or call.id is None:
            return
        status = decision if decision in ("approved", "rejected", "expired", "cancelled") else "rejected"
        await ctx.tx.execute(Q.DECIDE_CALL, (status, info.note, KERNEL, self.clock(), call.id))

    # ------------------------------------------------------------------ reading (ApprovalSource)
    async def approvals(
        self,
        status: ApprovalStatus | None = "pending",
        agent_id: str | None = None,
        root_run_id: str | None = None,
    ) -> list[Approval]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("status", status), ("agent_id", agent_id), ("root_run_id", root_run_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = Q.SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, id"
        async with self.system.store.transaction() as tx:
            rows = await tx.fetch(sql, params)
        return [_approval(r) for r in rows]

    async def approvals_page(
        self,
        *,
        status: Literal["pending", "decided"] | None = None,
        agent_id: str | None = None,
        root_run_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int = 50,
        scope: AgentScope | None = None,
    ) -> list[Approval]:
        kept = {"pending": "status = 'pending'", "decided": "status <> 'pending'"}.get(status or "")
        where, params = page_query(
            # a deleted agent takes its approvals with it
            conditions=["agent_id IN (SELECT id FROM agents)", *([kept] if kept else [])],
            equal={"agent_id": agent_id, "root_run_id": root_run_id},
            time_column="created_at",
            cursor=after,
            scope=scope,
        )
        async with self.system.store.transaction() as tx:
            rows = await tx.fetch(f"{Q.SELECT}{where} LIMIT ?", (*params, max(0, int(limit))))
        return [_approval(r) for r in rows]

    async def approval(self, approval_id: str) -> Approval:
        async with self.system.store.transaction() as tx:
            found = await self._read(tx, approval_id)
        if found is None:
            raise NotFound(f"no approval with id {approval_id!r}")
        return found

    async def approval_for_call(self, call_id: str) -> Approval | None:
        async with self.system.store.transaction() as tx:
            rows = await tx.fetch(Q.SELECT + " WHERE call_id = ?", (call_id,))
        return _approval(rows[0]) if rows else None

    async def _read(self, tx: Tx, approval_id: str) -> Approval | None:
        rows = await tx.fetch(Q.SELECT + " WHERE id = ?", (approval_id,))
        return _approval(rows[0]) if rows else None

    # ------------------------------------------------------------------ decisions
    async def approve(
        self,
        approval_id: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        decided_by: str | None = None,
    ) -> Decision:
        system = self.system
        async with system.store.transaction() as tx:
            found = await self._read(tx, approval_id)
            if found is None:
                raise NotFound(f"no approval with id {approval_id!r}")
            if found.status != "pending":
                return Decision(found, False)
            checked: dict[str, Any] | None = None
            result_note: str | None = None
            if arguments is not None:
                checked = self._validated(found, arguments)
                result_note = (
                    "The reviewer changed the arguments to "
                    f"{json.dumps(checked, ensure_ascii=False, default=str)} before approving this call."
                )
            edited = None if checked is None else json.dumps(checked, ensure_ascii=False, default=str)
            won = await tx.execute(
                Q.DECIDE, ("approved", note, edited, decided_by, self.clock(), approval_id)
            )
            if not won:
                stored = await self._read(tx, approval_id)
                assert stored is not None
                return Decision(stored, False)
            agent = await system.get(found.agent_id)
            if not await agent.release_call(
                found.call_id, arguments=checked, note=note, result_note=result_note
            ):
                raise NotFound(f"the call of approval {approval_id} is no longer waiting")  # rolls back
            decided = await self._read(tx, approval_id)
        assert decided is not None
        return Decision(decided, True)

    def _validated(self, found: Approval, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = self.system.tools.get(found.tool)
        if tool is None:
            raise InvalidInput(f"cannot check edited arguments: tool {found.tool!r} is not registered here")
        if not isinstance(arguments, dict):
            raise InvalidInput("edited arguments must be a JSON object")
        tool.validate(arguments)  # ToolArgumentError (an InvalidInput) names the problem; nothing written
        copied: dict[str, Any] = json.loads(json.dumps(arguments, default=str))
        return copied

    async def reject(
        self, approval_id: str, *, note: str | None = None, decided_by: str | None = None
    ) -> Decision:
        return await self._refuse(
            approval_id, "rejected", REJECTED.format(note=note or "no reason given"), note, decided_by
        )

    async def _refuse(
        self, approval_id: str, status: str, output: str, note: str | None, decided_by: str | None
    ) -> Decision:
        system = self.system
        async with system.store.transaction() as tx:
            found = await self._read(tx, approval_id)
            if found is None:
                raise NotFound(f"no approval with id {approval_id!r}")
            if found.status != "pending":
                return Decision(found, False)
            if not await tx.execute(Q.DECIDE, (status, note, None, decided_by, self.clock(), approval_id)):
                stored = await self._read(tx, approval_id)
                assert stored is not None
                return Decision(stored, False)
            agent = await system.get(found.agent_id)
            if not await agent.refuse_call(found.call_id, output, decision=status, note=note):
                raise NotFound(f"the call of approval {approval_id} is no longer waiting")  # rolls back
            decided = await self._read(tx, approval_id)
        assert decided is not None
        return Decision(decided, True)

    # ------------------------------------------------------------------ expiry
    async def expire(self, now: float | None = None) -> list[str]:
        """Reject every pending approval whose `expires_at` has passed ("approval expired"); returns their
        ids. The background task calls this; tests may call it with their own `now`."""
        at = self.clock() if now is None else now
        async with self.system.store.transaction() as tx:
            due = [str(r[0]) for r in await tx.fetch(Q.DUE, (at,))]
        done: list[str] = []
        for approval_id in due:
            decision = await self._refuse(approval_id, "expired", EXPIRED, None, KERNEL)
            if decision.decided:
                done.append(approval_id)
        return done

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_every)
            try:
                await self.expire()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expiring approvals failed (will retry)")


class _PolicyHooks(Hooks):
    """The plugin's kernel hooks (a separate object: a `Plugin` is not itself a `Hooks` here)."""

    def __init__(self, plugin: PolicyPlugin) -> None:
        self.plugin = plugin

    async def gate_call_tx(self, ctx: HookContext, info: GateCallInfo) -> Gate | None:
        return await self.plugin.gate_call_tx(ctx, info)

    async def activated_tx(self, ctx: HookContext) -> None:
        await self.plugin.activated_tx(ctx)

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        # SEC2: the agent's approvals (pending or decided, with their arguments) go with it
        if ctx.tx is not None:
            await ctx.tx.write_sql("DELETE FROM approvals WHERE agent_id = ?", (ctx.agent_id,))

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        await self.plugin.call_decided_tx(ctx, info)
