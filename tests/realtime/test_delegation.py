"""Durable delegation (RT1, RT2): `invoke_target_agent` answers "started" at once, one transaction records
the delegation and delivers the child's message, one child run per call; results are spoken through the
sequencer and marked delivered exactly once, undelivered ones first after a reconnect or in a new session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stead.realtime import ToolCallRequest
from tests.realtime.support import Events, FakeClock, gate, open_team, rows, write_team


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return write_team(tmp_path / "team")


async def test_RT1_started_result_and_child_created_once(team: Path, db_url: str) -> None:
    g = gate("do the task")
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        started = await ev.type("delegation_started")
        # the model heard "started" at once, while the child still works (its gate is closed)
        outputs = [v for k, v in session.model.sent if k == "tool_output"]  # type: ignore[attr-defined]
        ((call_id, output),) = outputs
        payload = json.loads(output)
        assert payload["status"] == "started" and payload["delegation_id"] == started.delegation_id
        assert "Do not invent it" in payload["note"]
        (row,) = await rows(system, "SELECT status, child_agent_id, message_id FROM realtime_delegations")
        assert row[0] == "running"
        assert row[2] == started.delegation_id  # the child's message id: an idempotency key
        child = await system.get(row[1])
        assert child.active  # still working: the gate is closed
        # the same call again (a repeated tool call) starts nothing
        await session._invoke(
            ToolCallRequest(call_id, "invoke_target_agent", json.dumps({"request": "do the task"}))
        )
        assert len(await rows(system, "SELECT id FROM realtime_delegations")) == 1
        assert [a.name for a in await system.agents()].count("worker") == 1
        g.set()
        result = await ev.type("delegation_result")
        assert result.text == "finished: worked on do the task" and result.status == "completed"
        await ev.until(
            lambda e: e.type == "transcript" and e.final is True and (e.text or "").startswith("Result:")
        )
        await ev.type("response_done")
        await session.close()
        worker_runs = [r for r in await system.runs(limit=50) if r.agent_name == "worker"]
        (session_run,) = [r for r in await system.runs(limit=50) if r.agent_name == "voice"]
    assert len(worker_runs) == 1 and worker_runs[0].parent_run_id == session_run.id
    assert worker_runs[0].session_id == session.id


async def test_RT1_delegation_and_child_message_commit_together(team: Path, db_url: str) -> None:
    """A failure inside the delegating transaction leaves neither the row nor the child's message."""
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        broker = session.broker
        original = system.create

        async def failing_create(**kwargs: object) -> object:
            await original(**kwargs)  # type: ignore[arg-type]
            raise RuntimeError("boom after the child was created")

        system.create = failing_create  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            await broker.start(
                session_id=session.id,
                run_id=session.run_id,
                session_data=None,
                call_id="call_x",
                target="worker",
                request="task",
            )
        system.create = original  # type: ignore[method-assign]
        assert await rows(system, "SELECT id FROM realtime_delegations") == []
        assert "worker" not in [a.name for a in await system.agents()]
        await session.close()


async def test_RT2_result_delivered_after_reconnect_once(team: Path, db_url: str) -> None:
    g = gate("do the task")
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        started = await ev.type("delegation_started")
        await ev.type("response_done")
        await ev.type("response_done")
        # the connection drops while the child works
        first = session.model
        await first._queue.put(None)  # type: ignore[attr-defined]  # the stream ends: a dropped connection
        await ev.type("error", fatal=True)
        g.set()
        await ev.type("delegation_result", delegation_id=started.delegation_id)
        await ev.until(lambda e: e.type == "response_done")
        assert session.model is not first and session.reconnects == 1
        (delivered,) = await rows(system, "SELECT delivered_at FROM realtime_delegations")
        assert delivered[0] is not None
        # a later reconnect does not deliver it again
        second = session.model
        assert sum(1 for k, _ in second.sent if k == "system_text" and "has finished" in _) == 1  # type: ignore[attr-defined]
        await session.close()


async def test_RT2_undelivered_result_goes_first_in_a_new_session(team: Path, db_url: str) -> None:
    g = gate("do the task")
    async with open_team(db_url, team) as system:
        first = await system.realtime(definition="voice")
        ev = Events(first)
        await first.send_text("do the task")
        await ev.type("delegation_started")
        await first.close()  # the user hangs up; the child keeps working
        g.set()
        (child_id,) = [a.id for a in await system.agents() if a.name == "worker"]
        await (await system.get(child_id)).wait_idle(timeout=20)
        second = await system.realtime(definition="voice")
        ev2 = Events(second)
        result = await ev2.type("delegation_result")
        assert result.text == "finished: worked on do the task"
        spoken = await ev2.until(lambda e: e.type == "transcript" and e.final is True)
        assert spoken.text == "Result: finished: worked on do the task"  # before anything else was said
        await ev2.type("response_done")
        await second.close()
        third = await system.realtime(definition="voice")
        ev3 = Events(third)
        await third.send_text("hello")
        said = await ev3.until(lambda e: e.type == "transcript" and e.role == "assistant" and e.final is True)
        assert said.text == "You said hello."  # delivered once: the third session does not repeat it
        assert ev3.of("delegation_result") == []
        await third.close()
        (row,) = await rows(system, "SELECT session_id, status, delivered_at FROM realtime_delegations")
    assert row[0] == second.id and row[1] == "completed" and row[2] is not None


async def test_RT2_reopening_a_session_by_id_continues_it(team: Path, db_url: str) -> None:
    async with open_team(db_url, team, FakeClock()) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("hello")
        await ev.type("response_done")
        await session.close()
        again = await system.realtime(definition="voice", session_id=session.id)
        ev2 = Events(again)
        await again.send_text("hello again")
        await ev2.type("response_done")
        await again.close()
        turns = await rows(
            system,
            "SELECT seq, role, text FROM realtime_transcripts WHERE session_id = ? ORDER BY seq",
            session.id,
        )
    assert [t[2] for t in turns] == ["hello", "You said hello.", "hello again", "You said hello again."]
    assert [t[0] for t in turns] == [1, 2, 3, 4]


SCRIPT_WITH_TOOLS = """\
scripted: true
rules:
  - when: {user_contains: "shout"}
    responses:
      - tool_call: {name: shout, arguments: {text: "{user}"}}
      - text: "Done shouting."
  - when: {user_contains: "both"}
    responses:
      - tool_calls:
          - {name: invoke_target_agent, arguments: {request: "for the worker", agent: worker}}
          - {name: invoke_target_agent, arguments: {request: "for the helper", agent: helper}}
      - text: "Both started."
  - responses:
      - tool_call: {name: invoke_target_agent, arguments: {request: "x", agent: nobody}}
      - text: "Hm."
"""


async def test_extra_tools_run_in_the_session_and_several_targets_are_chosen_by_name(
    tmp_path: Path, db_url: str
) -> None:
    team = write_team(
        tmp_path / "team",
        voice={"target_agents": ["worker", "helper"], "tools": ["tests.realtime.support:shout"]},
        script=SCRIPT_WITH_TOOLS,
    )
    (team / "helper.yaml").write_text((team / "worker.yaml").read_text().replace('"worker"', '"helper"'))
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        tools = {t.name: t for t in session.config.tools}
        assert set(tools) == {"invoke_target_agent", "shout"}
        assert tools["invoke_target_agent"].parameters["properties"]["agent"]["enum"] == ["worker", "helper"]
        ev = Events(session)
        await session.send_text("shout hello")
        said = await ev.until(lambda e: e.type == "transcript" and e.final is True and e.role == "assistant")
        assert said.text == "Done shouting."
        assert (
            "tool_output",
            (next(e.call_id for e in ev.of("tool_call")), "SHOUT HELLO"),
        ) in session.model.sent  # type: ignore[attr-defined]
        await session.send_text("both please")
        first = await ev.type("delegation_started")
        second = await ev.type("delegation_started")
        assert {(first.agent, first.text), (second.agent, second.text)} == {
            ("worker", "for the worker"),
            ("helper", "for the helper"),
        }
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "Both started.")
        await session.send_text("anything")
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "Hm.")
        refused = [v for k, v in session.model.sent if k == "tool_output"][-1]  # type: ignore[attr-defined]
        assert json.loads(refused[1]) == {
            "status": "error",
            "error": "unknown agent 'nobody'; choose one of worker, helper",
        }
        await session.close()
        run = await system.run(session.run_id)
    assert [(s.type, s.target, s.status) for s in run.steps if s.type == "tool"] == [
        ("tool", "shout", "completed")
    ]
    assert sorted(c.agent_name or "" for c in run.children) == ["helper", "worker"]
