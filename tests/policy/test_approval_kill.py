"""An approval survives `kill -9` (issue 12): a real child process is SIGKILLed while its agent waits for a
decision (the call never ran), or while the approved call runs (it ran once and is never run again)."""

from __future__ import annotations

from pathlib import Path

import stead
from stead.core.batch import IN_DOUBT_TEXT
from tests.fakes.kill import run_and_kill
from tests.policy import approval_worker as W

WORKER = Path(W.__file__)
TIMEOUT = 30


async def test_P2_approval_survives_kill9(tmp_path: Path) -> None:
    db = tmp_path / "approvals.db"
    markers = await run_and_kill(WORKER, db, "wait", until="WAITING")
    approval_id = markers[-1].split()[1]
    assert W.effects(db) == []  # killed while waiting: the call never started
    async with W.open_system(db) as system:
        assert system.restored == [W.AGENT_ID]
        agent = await system.get(W.AGENT_ID)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"  # after the restart: still held, not in doubt
        (a,) = await system.approvals()
        assert a.id == approval_id and a.status == "pending"
        assert W.effects(db) == []
        await system.approve(approval_id)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle"
        history = await agent.history()
    assert len(W.effects(db)) == 1  # exactly once, after the decision
    assert history[-1].text == "finished: removed old.txt"


async def test_P2_a_decision_made_without_running_the_agent_is_run_by_the_next_owner(tmp_path: Path) -> None:
    db = tmp_path / "approvals.db"
    approval_id = (await run_and_kill(WORKER, db, "wait", until="WAITING"))[-1].split()[1]
    async with W.open_system(db, restore=False) as system:  # as `stead approvals approve` does
        assert (await system.approve(approval_id, note="ok")).decided
        agent = await system.get(W.AGENT_ID)
        assert agent.state == "idle"  # this process does not run the agent: nothing started here
    assert W.effects(db) == []
    async with W.open_system(db) as system:
        agent = await system.get(W.AGENT_ID)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle"
        assert (await agent.history())[-1].text == "finished: removed old.txt"
    assert len(W.effects(db)) == 1


async def test_P2_an_approved_call_killed_mid_run_is_never_run_again(tmp_path: Path) -> None:
    db = tmp_path / "approvals.db"
    markers = await run_and_kill(WORKER, db, "approve", until="RUNNING")
    call_id = markers[-1].split()[1]
    assert [line.split()[1] for line in W.effects(db)] == [call_id]
    async with W.open_system(db) as system:
        agent = await system.get(W.AGENT_ID)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle"
        results = [b for m in await agent.history() for b in m.content if isinstance(b, stead.ToolResult)]
        (a,) = await system.approvals(status=None)
        assert a.status == "approved"
    # started under the approval, then the process died: in doubt (at most once), not run a second time
    assert results == [stead.ToolResult(call_id, IN_DOUBT_TEXT, True)]
    assert len(W.effects(db)) == 1
