"""Real-process crash tests for delegation: a child process runs a team (a lead delegating two tasks to
`worker` sub-agents in one response) and is killed with SIGKILL at a chosen point; this process reopens the
database and finishes. Exactly one child (one child run) per delegation call, each finishes, and the lead
gets each answer once and answers once.

The child is tests/orchestration/delegation_kill_worker.py, synchronized on the marker lines it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from tests.fakes.kill import run_and_kill
from tests.orchestration import delegation_kill_worker as W

TIMEOUT = 30


@pytest.mark.parametrize(
    ("mode", "until"),
    [
        ("child_inference", "CHILD_INFERENCE"),
        ("child_tool", "CHILD_TOOL"),
        ("parent_commit", "PARENT_COMMIT"),
    ],
)
async def test_kill_during_delegation_then_resume(tmp_path: Path, mode: str, until: str) -> None:
    db = tmp_path / "team.db"
    team = tmp_path / "team"
    W.write_team(team)
    markers = await run_and_kill(Path(W.__file__), db, team, mode, until=until)
    lead_id = markers[0].removeprefix("LEAD ")

    W.BLOCK = False
    async with await stead.open(f"sqlite:///{db}", definitions=team, providers=W.providers()) as system:
        assert lead_id in system.restored
        lead = await system.get(lead_id)
        await lead.wait_idle(timeout=TIMEOUT)
        assert not lead.active
        workers = [await system.get(a.id) for a in await system.agents() if a.name == "worker"]
        for w in workers:
            await w.wait_idle(timeout=TIMEOUT)
        history = await lead.history()
        worker_histories = [await w.history() for w in workers]
        runs = await system.runs(limit=100)

    # exactly one child per delegation call, each asked once and answering once
    assert len(workers) == 2
    for h in worker_histories:
        users = [m for m in h if m.role == "user"]
        finals = [m for m in h if m.role == "assistant" and m.text.startswith("done: ")]
        assert len(users) == 1 and len(finals) == 1, h
    # the lead: two results (no errors) in call order, one final answer
    results = [b for m in history if m.role == "tool" for b in m.content]
    assert len(results) == 2 and not any(r.is_error for r in results)  # type: ignore[union-attr]
    finals = [m for m in history if m.role == "assistant" and m.text.startswith("FINAL: ")]
    assert len(finals) == 1
    assert finals[0].text == (
        "FINAL: done: task A (slow work on task A) | done: task B (slow work on task B)"
    )
    # one run per child, all completed, linked to the lead's run
    worker_runs = [r for r in runs if r.agent_name == "worker"]
    (lead_run,) = [r for r in runs if r.agent_id == lead_id]
    assert len(worker_runs) == 2 and all(r.status == "completed" for r in worker_runs)
    assert all(r.parent_run_id == lead_run.id for r in worker_runs)
    assert lead_run.status == "completed" and lead_run.restarts == 1
    restarted_children = [r for r in worker_runs if r.restarts]
    if mode == "parent_commit":
        # the first child had settled before the kill: re-attached to, not run again
        (first,) = [r for r in worker_runs if (r.final_message or "").startswith("done: task A")]
        assert first.restarts == 0
    else:
        assert restarted_children  # the killed child run was resumed, not replaced
