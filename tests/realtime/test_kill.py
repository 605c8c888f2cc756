"""The session's process is SIGKILLed while a delegation runs: a new session, in a new process, gets the
result — the child run finishes under the next owner of the store, exactly once."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.kill import run_and_kill
from tests.realtime.support import Events, open_team, rows, write_team

WORKER = Path(__file__).resolve().parent / "kill_worker.py"


async def run_until_working(db: Path, team: Path) -> dict[str, str]:
    """Kill the session's process once it printed both `WORKING` and `STARTED`; their values by kind."""

    def working(lines: list[str]) -> bool:
        return {"WORKING", "STARTED"} <= {line.partition(" ")[0] for line in lines}

    lines = await run_and_kill(WORKER, db, team, until=working)
    return {kind: value for kind, _, value in (line.partition(" ") for line in lines)}


async def test_RT2_session_process_killed_then_a_new_session_gets_the_result(tmp_path: Path) -> None:
    team = write_team(tmp_path / "team")
    db = tmp_path / "rt.db"
    markers = await run_until_working(db, team)
    old_session, delegation = markers["SESSION"], markers["STARTED"]

    async with open_team(f"sqlite:///{db}", team) as system:
        (child_id,) = [a.id for a in await system.agents() if a.name == "worker"]
        assert child_id in system.restored  # the next owner of the store resumes the child run
        session = await system.realtime(definition="voice")
        ev = Events(session)
        result = await ev.type("delegation_result", delegation_id=delegation)
        assert result.status == "completed" and result.text == "finished: worked on do the task"
        spoken = await ev.until(lambda e: e.type == "transcript" and e.final is True)
        assert spoken.text == "Result: finished: worked on do the task"
        await ev.type("response_done")
        await session.close()
        (row,) = await rows(
            system, "SELECT session_id, status, delivered_at, child_agent_id FROM realtime_delegations"
        )
        sessions = dict(await rows(system, "SELECT id, status FROM realtime_sessions"))
        runs = await system.runs(limit=50)
        history = await (await system.get(child_id)).history()
    assert row[0] == session.id and row[1] == "completed" and row[2] is not None and row[3] == child_id
    assert sessions == {old_session: "dropped", session.id: "closed"}
    worker_runs = [r for r in runs if r.agent_name == "worker"]
    assert len(worker_runs) == 1 and worker_runs[0].status == "completed" and worker_runs[0].restarts == 1
    voice_runs = {r.session_id: r for r in runs if r.agent_name == "voice"}
    assert (
        voice_runs[old_session].status == "failed"
        and worker_runs[0].parent_run_id == voice_runs[old_session].id
    )
    assert [m.id for m in history if m.role == "user"] == [delegation]  # asked once
