"""Durable delegation: `invoke_target_agent` starts a child run of a target agent and returns at once.

`start` runs ONE transaction that records the delegation (`realtime_delegations`, `call_id` UNIQUE), the
`sub_agent` step of the session's run, creates the child agent from its definition and accepts the child's
message (its id is the delegation id, so it is an idempotency key): all of it or nothing. A repeated call id
finds the row and starts nothing. The tool's output is `{"status": "started", "delegation_id": ...}`.

`watch` waits for the child's run to settle (`agent.run` with the delegation's message id: nothing is sent
again) — in this process or, after a crash, in the next owner of the store, which restores the child like
any agent that owes work — then records the result on the row (once:
`WHERE status = 'running'`) and on the step, in one transaction, and hands it to the session to speak. A
process that stops running the child (closing, draining) records nothing: the next session adopts the row
and watches again.

`cancel` (barge-in) settles the row `cancelled` first — unless the result won the race — then aborts the
child.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stead.extend import (
    Agent,
    Closed,
    ConfigurationError,
    Outcome,
    RunNotFound,
    SteadError,
    new_id,
    record_step,
    update_step,
)
from stead.realtime._store import DELEGATION_COLS

if TYPE_CHECKING:
    from stead.extend import AgentSystem
    from stead.orchestration import Orchestrator

__all__ = ["STARTED_NOTE", "Broker", "Delegation"]

log = logging.getLogger("stead.realtime")

STARTED_NOTE = "Working on it; you will get the result. Do not invent it."
CANCELLED_NOTE = "CANCELLED: this task was cancelled before it returned a result."
X_DELEGATION = "stead.realtime.delegation"  # AgentConfig.extra of a child: its delegation id


@dataclass
class Delegation:
    id: str
    session_id: str
    agent_id: str
    call_id: str
    run_id: str
    step_id: str
    target: str
    child_agent_id: str
    child_run_id: str | None
    message_id: str
    request: str
    status: str
    result: dict[str, Any] | None
    created_at: float
    settled_at: float | None
    delivered_at: float | None

    @staticmethod
    def from_row(row: tuple[Any, ...]) -> Delegation:
        values = list(row)
        values[12] = json.loads(values[12]) if values[12] else None
        return Delegation(*values)

    @property
    def text(self) -> str:
        return str((self.result or {}).get("text") or "")


class Broker:
    def __init__(
        self,
        system: AgentSystem,
        orchestrator: Orchestrator,
        *,
        agent_id: str,
        agent_name: str,
    ) -> None:
        self.system = system
        self.orchestrator = orchestrator
        self.agent_id = agent_id
        self.agent_name = agent_name

    async def get(self, delegation_id: str) -> Delegation | None:
        async with self.system.store.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {DELEGATION_COLS} FROM realtime_delegations WHERE id = ?", (delegation_id,)
            )
        return Delegation.from_row(rows[0]) if rows else None

    async def undelivered(self) -> list[Delegation]:
        """Every delegation of this realtime agent whose result was not spoken yet, oldest first."""
        async with self.system.store.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {DELEGATION_COLS} FROM realtime_delegations "
                "WHERE agent_id = ? AND delivered_at IS NULL "
                "ORDER BY created_at, id",
                (self.agent_id,),
            )
        return [Delegation.from_row(r) for r in rows]

    async def start(
        self,
        *,
        session_id: str,
        run_id: str,
        session_data: dict[str, Any] | None,
        call_id: str,
        target: str,
        request: str,
    ) -> tuple[Delegation, bool]:
        """The delegation of `call_id` (created now, or found: then False)."""
        delegation_id, child_id = new_id(), new_id()
        kwargs = self.orchestrator.config_for(target, data=session_data, chain=[self.agent_name, target])
        kwargs["extra"] = {**kwargs.get("extra", {}), X_DELEGATION: delegation_id}
        now = time.time()
        store = self.system.store
        async with store.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {DELEGATION_COLS} FROM realtime_delegations WHERE call_id = ?", (call_id,)
            )
            if rows:
                return Delegation.from_row(rows[0]), False
            step_id = await record_step(
                tx, run_id, "sub_agent", target, status="running", target=target, input={"request": request}
            )
            await tx.execute(
                f"INSERT INTO realtime_delegations({DELEGATION_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, 'running', NULL, ?, NULL, NULL)",
                (
                    delegation_id,
                    session_id,
                    self.agent_id,
                    call_id,
                    run_id,
                    step_id,
                    target,
                    child_id,
                    delegation_id,
                    request,
                    now,
                ),
            )
            child = await self.system.create(agent_id=child_id, **kwargs)
            await child.send(
                request,
                id=delegation_id,
                metadata={
                    "stead.parent": {
                        "run_id": run_id,
                        "step_id": step_id,
                        "agent_id": self.agent_id,
                        "session_id": session_id,
                        "breadcrumb": self.agent_name,
                    }
                },
            )
        d = Delegation(
            delegation_id,
            session_id,
            self.agent_id,
            call_id,
            run_id,
            step_id,
            target,
            child_id,
            None,
            delegation_id,
            request,
            "running",
            None,
            now,
            None,
            None,
        )
        return d, True

    async def adopt(self, d: Delegation, session_id: str) -> None:
        async with self.system.store.transaction() as tx:
            await tx.execute(
                "UPDATE realtime_delegations SET session_id = ? WHERE id = ?", (session_id, d.id)
            )
        d.session_id = session_id

    async def child_run_id(self, d: Delegation) -> str | None:
        """The child's run (from the run records), remembered on the row once known."""
        if d.child_run_id is not None:
            return d.child_run_id
        try:
            runs = await self.system.runs(agent_id=d.child_agent_id, limit=50)
        except ConfigurationError:  # run records are off
            return None
        if not runs:
            return None
        d.child_run_id = runs[-1].id  # the child agent exists for this delegation: its first run
        async with self.system.store.transaction() as tx:
            await tx.execute(
                "UPDATE realtime_delegations SET child_run_id = ? WHERE id = ? AND child_run_id IS NULL",
                (d.child_run_id, d.id),
            )
        return d.child_run_id

    async def watch(self, d: Delegation) -> Delegation | None:
        """Wait for the child's result and record it; None when this process stopped running the child."""
        child = await self.system.get(d.child_agent_id, resume=True)
        outcome = await _outcome(child, d)
        if outcome is None:
            return None
        status, text = outcome
        run_id = await self.child_run_id(d)
        result = {"status": status, "text": text}
        now = time.time()
        async with self.system.store.transaction() as tx:
            changed = await tx.execute(
                "UPDATE realtime_delegations SET status = ?, result_json = ?, settled_at = ? "
                "WHERE id = ? AND status = 'running'",
                (status, json.dumps(result), now, d.id),
            )
            if changed:
                await update_step(
                    tx,
                    d.run_id,
                    d.step_id,
                    status="completed" if status == "completed" else "failed",
                    output=result,
                    error=text if status != "completed" else None,
                    target_run_id=run_id,
                )
        return await self.get(d.id)

    async def cancel(self, d: Delegation) -> bool:
        """Barge-in: settle the delegation `cancelled` (delivered: there is nothing to say) and abort its
        child. False when its result was recorded first."""
        result = {"status": "cancelled", "text": CANCELLED_NOTE}
        now = time.time()
        async with self.system.store.transaction() as tx:
            changed = await tx.execute(
                "UPDATE realtime_delegations SET status = 'cancelled', result_json = ?, settled_at = ?, "
                "delivered_at = ? WHERE id = ? AND status = 'running'",
                (json.dumps(result), now, now, d.id),
            )
            if changed:
                await update_step(
                    tx, d.run_id, d.step_id, status="cancelled", output=result, error=CANCELLED_NOTE
                )
        if not changed:
            return False
        d.status, d.result, d.delivered_at = "cancelled", result, now
        try:
            await (await self.system.get(d.child_agent_id)).abort()
        except SteadError:
            log.exception("aborting the child %s of delegation %s failed", d.child_agent_id, d.id)
        return True

    async def mark_delivered(self, d: Delegation) -> bool:
        now = time.time()
        async with self.system.store.transaction() as tx:
            changed = await tx.execute(
                "UPDATE realtime_delegations SET delivered_at = ? WHERE id = ? AND delivered_at IS NULL",
                (now, d.id),
            )
        if changed:
            d.delivered_at = now
        return bool(changed)


async def _outcome(child: Agent, d: Delegation) -> tuple[str, str] | None:
    """(status, text) of the run that consumed the delegation's message, once it settled — `agent.run`
    with the same message id sends nothing again and returns that run's result, in any process after any
    crash; None when this process stopped running the child before it settled."""
    try:
        result = await child.run(d.request, id=d.message_id)
        while result.outcome is Outcome.AWAITING_INPUT:  # the child waits for approvals: wait with it
            await child.wait_decided()
            result = await child.run(d.request, id=d.message_id)
    except Closed:
        return None
    except RunNotFound as e:
        return "failed", str(e)
    if result.outcome is Outcome.COMPLETED:
        if not result.text.strip():
            return "failed", "the agent finished without an answer"
        return "completed", result.text
    if result.outcome is Outcome.CANCELLED:
        return "cancelled", CANCELLED_NOTE
    return "failed", result.error or "the agent's run failed"
