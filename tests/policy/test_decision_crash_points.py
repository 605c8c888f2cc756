"""Crash points over the decision (issue 12): the store dies at every operation from opening a system whose
agent waits for approval, through the approval's transaction, the claim of the approved call, its run and
its result, to settlement (`stead.testing.Faults(crash_at=N)` rolls back the open transaction and releases
the file like a dead process). A fresh system then finishes (approving again if the decision was lost).

Invariants after every crash point: the call (a default, at-most-once tool) ran at most once and only
after a committed approval; it has exactly one result; the approval ends `approved`; the agent settles
with nothing left behind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import stead
from stead.providers.scripted import ScriptedProvider
from stead.testing import Faults
from tests.fakes.crash_points import measured_once, parametrize_crash_at, run_until_crash

AGENT_ID = "decisionagent01"
executions: Counter[str] = Counter()
approved_before_run: list[bool] = []


@stead.tool(effects="write", destructive=True)
async def remove(path: str, ctx: stead.ToolContext) -> str:
    "Remove a file (at most once)."
    executions[ctx.call_id] += 1
    async with ctx.store.transaction() as tx:
        rows = await tx.fetch("SELECT status FROM approvals WHERE call_id = ?", (ctx.call_id,))
    approved_before_run.append(bool(rows) and rows[0][0] == "approved")
    return f"removed {path}"


def respond(request: stead.ProviderRequest) -> list[stead.Block]:
    if request.messages[-1].role == "tool":
        return [stead.Text("finished")]
    return [stead.ToolCall("remove", {"path": "old.txt"})]


def _open(url: str, faults: Faults | None = None) -> stead.system.Opening:
    return stead.open(
        url, providers={"scripted": ScriptedProvider(respond)}, tools=[remove], approvals=True, faults=faults
    )


async def _prepare(url: str) -> str:
    async with _open(url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["remove"], agent_id=AGENT_ID)
        await agent.send("remove old.txt", id="removemsg")
        await agent.wait_idle(timeout=10)
        (a,) = await system.approvals()
    return a.id


async def _decide_and_finish(url: str, approval_id: str, faults: Faults) -> None:
    async def act(system: stead.AgentSystem) -> None:
        await system.approve(approval_id)
        agent = await system.get(AGENT_ID)
        await agent.wait_idle(timeout=10)

    await run_until_crash(_open(url, faults), faults, act)


async def _count_ops(tmp: Path) -> int:
    url = f"sqlite:///{tmp / 'count.db'}?synchronous=off"
    approval_id = await _prepare(url)
    faults = Faults()
    await _decide_and_finish(url, approval_id, faults)
    assert not faults.crashed
    return faults.ops


_op_count = measured_once(_count_ops, "stead-decision-")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_crash_at(metafunc, lambda: range(_op_count() + 1))


def test_the_decision_run_exercises_the_store() -> None:
    assert _op_count() > 15


async def test_crash_at_every_operation_of_the_decision(crash_at: int, tmp_path: Path) -> None:
    executions.clear()
    approved_before_run.clear()
    url = f"sqlite:///{tmp_path / 'crash.db'}?synchronous=off"
    approval_id = await _prepare(url)
    faults = Faults(crash_at=crash_at)
    await _decide_and_finish(url, approval_id, faults)
    assert faults.crashed == (crash_at < _op_count())
    ran_before_recovery = sum(executions.values())

    async with _open(url) as system:  # a new process takes over the file
        if (await system.approval(approval_id)).status == "pending":
            assert ran_before_recovery == 0  # no decision committed: nothing ran
            assert (await system.approve(approval_id)).decided
        agent = await system.get(AGENT_ID)
        await agent.wait_idle(timeout=10)
        assert agent.state == "idle" and not agent.active
        approval = await system.approval(approval_id)
        history = await agent.history()
        async with system.store.transaction() as tx:
            left = [
                k
                for k, _ in await tx.read_prefix(AGENT_ID, "")
                if k.startswith(("pending", "tool.", "kv.c."))
            ]
    assert approval.status == "approved"
    assert left == []
    assert all(approved_before_run)  # never ran before its approval committed
    (call,) = [b for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    results = [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    assert [r.call_id for r in results] == [call.id]
    assert executions[call.id or ""] <= 1  # at most once, ever
    if not results[0].is_error:
        assert results[0].output == "removed old.txt" and executions[call.id or ""] == 1
    assert history[-1].text == "finished"
    assert json.dumps(approval.arguments) == '{"path": "old.txt"}'
