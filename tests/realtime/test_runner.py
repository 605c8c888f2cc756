"""The session runner against the text-duplex driver: the sequencer never overlaps (RT3), narration pacing
with an injected clock (RT4), barge-in (RT5), transcripts (RT6), usage checkpoints (RT7), reconnects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stead.definitions._schema import NarrationSettings
from stead.realtime import Narrator, RealtimeUsage, Transcript
from stead.realtime._transcripts import TranscriptWriter
from tests.realtime.support import Events, FakeClock, gate, open_team, rows, write_team


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return write_team(tmp_path / "team")


# ------------------------------------------------------------------------------------------------ RT3
async def test_RT3_sequencer_never_overlaps(tmp_path: Path, db_url: str) -> None:
    """Speech requested from everywhere at once — user turns (typed over the model: barge-ins), tool outputs,
    results — is spoken one response at a time: the driver never saw a response.create while a response was
    active, and every result was spoken and marked delivered."""
    team = write_team(
        tmp_path / "team", voice={"realtime": {"delegation": {"cancel_on_interruption": False}}}
    )
    gates = [gate(f"task {i}") for i in range(3)]
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        for i in range(3):  # each turn is sent while the previous replies are still queued or speaking
            await session.send_text(f"task {i}")
            await ev.type("delegation_started")
        for g in gates:  # three results become due at once, while replies are still owed
            g.set()
        await session.send_text("hello")

        def spoken_results() -> int:
            return sum(
                1
                for e in ev.seen
                if e.type == "transcript" and e.final and (e.text or "").startswith("Result:")
            )

        while spoken_results() < 3:
            await ev.until(lambda e: e.type == "transcript" and e.final is True)
        await ev.type("response_done")
        driver = session.model
        assert driver.collisions == 0  # type: ignore[attr-defined]
        assert session.sequencer.collisions == 0
        # every response that started also ended before the next one started
        kinds = [e.type for e in ev.seen if e.type == "response_done"]
        assert len(kinds) == session.sequencer.creates
        await session.close()
        delivered = await rows(system, "SELECT delivered_at FROM realtime_delegations")
    assert len(delivered) == 3 and all(d[0] is not None for d in delivered)


# ------------------------------------------------------------------------------------------------ RT4
def test_RT4_narration_pacing_5s_8s() -> None:
    n = Narrator(NarrationSettings())
    n.add("a is searching", 100.0)
    assert n.due(104.9) is None  # not before 5 s into the burst
    n.add("a is searching", 102.0)  # a duplicate changes nothing
    assert n.due(105.0) == "a is searching"
    n.add("b is writing", 106.0)
    assert n.due(111.5) is None  # 5 s into the new burst, but not 8 s after the last update
    assert n.due(113.0) == "b is writing"
    for i in range(6):
        n.add(f"step {i}", 200.0)
    assert n.due(205.0) == "step 2; step 3; step 4; step 5"  # at most 4 items, the oldest dropped
    n.add("late", 206.0)
    n.clear()  # barge-in
    assert n.due(300.0) is None


def test_RT4_narration_repeated_digest_is_not_spoken_again() -> None:
    n = Narrator(NarrationSettings(first_after=0, every=0))
    n.add("x", 1.0)
    assert n.due(1.0) == "x"
    n.seen.clear()  # the same text from another step
    n.add("x", 2.0)
    assert n.due(2.0) is None


async def test_RT4_narration_from_the_childs_run_records(team: Path, db_url: str) -> None:
    clock = FakeClock()
    gate("do the task")
    async with open_team(db_url, team, clock) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        await ev.type("delegation_started")
        await ev.type("response_done")
        await ev.type("response_done")
        # the child's tool step is recorded; the first tick reads it and starts the burst
        (child_id,) = [a.id for a in await system.agents() if a.name == "worker"]
        child_events = (await system.get(child_id)).events()
        while not await rows(system, "SELECT 1 FROM run_steps WHERE type = 'tool' AND status = 'running'"):
            await asyncio.wait_for(child_events.__anext__(), 20)  # the child's next event, then look again
        await session.tick()
        progress = await ev.type("delegation_progress")
        assert progress.text == "worker is using work"
        clock.t += 4.9
        await session.tick()
        assert not any(k == "response.create" and v[0] == "update" for k, v in session.model.sent)  # type: ignore[attr-defined]
        clock.t += 0.1
        await session.tick()
        spoken = await ev.until(lambda e: e.type == "transcript" and e.final is True)
        assert spoken.text == "Update: worker is using work"
        (update,) = [v for k, v in session.model.sent if k == "response.create" and v[0] == "update"]  # type: ignore[attr-defined]
        assert "worker is using work" in update[1] and "do not make up results" in update[1]
        await session.close()


# ------------------------------------------------------------------------------------------------ RT5
async def _speaking_with_a_delegation(system, ev):  # type: ignore[no-untyped-def]
    session = ev.session
    await session.send_text("do the task")
    started = await ev.type("delegation_started")
    await ev.type("response_done")
    await ev.type("response_done")
    await session.send_text("a long story please")
    await ev.until(lambda e: e.type == "transcript" and e.role == "assistant" and e.final is False)
    return started


async def test_RT5_barge_in_cancels_and_aborts(team: Path, db_url: str) -> None:
    clock = FakeClock()
    gate("do the task")
    async with open_team(db_url, team, clock) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        started = await _speaking_with_a_delegation(system, ev)
        assert session.sequencer.active is not None  # the model is speaking (its response takes 1000 s)
        session.narrator.add("something", clock.now())
        await session.send_text("stop")  # typing while it speaks: a barge-in
        cancelled = await ev.type("response_done", status="cancelled")
        assert cancelled.reason == "client_cancelled"
        result = await ev.type("delegation_result", delegation_id=started.delegation_id)
        assert result.status == "cancelled"
        assert session.narrator.buffer == []
        kinds = [k for k, _ in session.model.sent]  # type: ignore[attr-defined]
        stop = kinds.index("user_text", kinds.index("response.cancel"))
        assert kinds[stop - 2 : stop + 1] == [
            "response.cancel",
            "system_text",
            "user_text",
        ]  # cancel, note, turn
        (row,) = await rows(system, "SELECT status, delivered_at, child_agent_id FROM realtime_delegations")
        assert row[0] == "cancelled" and row[1] is not None
        child = await system.get(row[2])
        await child.wait_idle(timeout=20)
        said = await ev.until(lambda e: e.type == "transcript" and e.role == "assistant" and e.final is True)
        assert said.text == "You said stop."
        await session.close()
        runs = [r for r in await system.runs(limit=20) if r.agent_name == "worker"]
        turns = await rows(system, "SELECT role, text, status FROM realtime_transcripts ORDER BY seq")
    assert [r.status for r in runs] == ["cancelled"]
    assert ("assistant", "This is ", "complete") in turns  # the cut answer keeps what was said


async def test_RT5_barge_in_keeps_delegations_when_configured(tmp_path: Path, db_url: str) -> None:
    team = write_team(
        tmp_path / "team", voice={"realtime": {"delegation": {"cancel_on_interruption": False}}}
    )
    g = gate("do the task")
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await _speaking_with_a_delegation(system, ev)
        await session.interrupt()
        await ev.type("response_done", status="cancelled")
        (row,) = await rows(system, "SELECT status FROM realtime_delegations")
        assert row[0] == "running"
        g.set()
        result = await ev.type("delegation_result")
        assert result.status == "completed"
        await session.close()


# ------------------------------------------------------------------------------------------------ RT6
async def test_RT6_transcript_interim_then_final_one_row(team: Path, db_url: str) -> None:
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        await session.close()
        writer = TranscriptWriter(system.store, "s1")
        writer.start()
        writer.put(Transcript("assistant", "i1", "Hel", False))
        writer.put(Transcript("user", "u1", "wa", False))
        writer.put(Transcript("assistant", "i1", "lo", False))
        await writer.drain()
        first = await rows(
            system, "SELECT seq, role, text, status FROM realtime_transcripts WHERE session_id = 's1'"
        )
        assert first == [(1, "assistant", "Hel", "in_progress"), (2, "user", "wa", "in_progress")]
    # the session writes one row per turn: interim pieces, then the final text, in one row
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("hello")
        await ev.type("response_done")
        await session.close()
        turns = await rows(
            system,
            "SELECT seq, role, text, status FROM realtime_transcripts WHERE session_id = ? ORDER BY seq",
            session.id,
        )
    assert turns == [(1, "user", "hello", "complete"), (2, "assistant", "You said hello.", "complete")]


async def test_RT6_a_turn_completes_the_row_its_first_interim_created(team: Path, db_url: str) -> None:
    async with open_team(db_url, team) as system:
        writer = TranscriptWriter(system.store, "s2")
        writer.start()
        for piece in ("One ", "two ", "three"):
            writer.put(Transcript("assistant", "i1", piece, False))
        writer.put(Transcript("assistant", "i1", "One two three", True))
        writer.put(Transcript("user", "u1", "four", True))
        await writer.drain()
        got = await rows(
            system, "SELECT seq, role, text, status FROM realtime_transcripts WHERE session_id = 's2'"
        )
    assert got == [(1, "assistant", "One two three", "complete"), (2, "user", "four", "complete")]
    assert writer.writes == 3  # create, complete, one complete row: the interims in between wrote nothing


# ------------------------------------------------------------------------------------------------ RT7
async def test_RT7_usage_debounced_final_flush(team: Path, db_url: str) -> None:
    clock = FakeClock()
    async with open_team(db_url, team, clock) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        meter = session.usage
        await session.send_text("hello")
        first = await ev.type("response_done")
        await session.send_text("hello again")
        second = await ev.type("response_done")
        assert meter.checkpoints == 0  # within the debounce window: nothing written yet
        step = await rows(
            system, "SELECT input_tokens, output_tokens FROM run_steps WHERE id = ?", session.prompt_step_id
        )
        assert step == [(None, None)]
        meter.checkpointed.clear()
        clock.advance(5.0)
        await asyncio.wait_for(meter.checkpointed.wait(), 20)
        assert meter.checkpoints == 1
        expected = [
            first.usage["input_tokens"] + second.usage["input_tokens"],  # type: ignore[index]
            first.usage["output_tokens"] + second.usage["output_tokens"],
        ]  # type: ignore[index]
        step = await rows(
            system, "SELECT input_tokens, output_tokens FROM run_steps WHERE id = ?", session.prompt_step_id
        )
        assert list(step[0]) == expected
        await session.send_text("third")
        third = await ev.type("response_done")
        await session.close()  # the final flush writes the third response without waiting for the clock
        assert meter.checkpoints == 2
        meter.add(RealtimeUsage(input_tokens=1000), session.model)  # late usage after stop: ignored
        step = await rows(
            system, "SELECT input_tokens, status FROM run_steps WHERE id = ?", session.prompt_step_id
        )
        (usage_json,) = await rows(
            system, "SELECT usage_json FROM realtime_sessions WHERE id = ?", session.id
        )
        run = await system.run(session.run_id)
    total_in = expected[0] + third.usage["input_tokens"]  # type: ignore[index]
    assert step == [(total_in, "completed")]
    assert (
        json.loads(usage_json[0])["input_tokens"] == total_in and json.loads(usage_json[0])["responses"] == 3
    )
    assert run.status == "completed" and run.own_input_tokens == total_in


# ------------------------------------------------------------------------------------------------ reconnect
async def test_one_automatic_reconnect_then_the_session_fails(team: Path, db_url: str) -> None:
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.model._queue.put(None)  # type: ignore[attr-defined]
        await ev.type("error", fatal=True)
        assert session.reconnects == 1
        await session.model.close()  # the second connection drops too
        await ev.type("error", fatal=True)
        await session._closed.wait()
        (row,) = await rows(system, "SELECT status, error FROM realtime_sessions WHERE id = ?", session.id)
        run = await system.run(session.run_id)
    assert session.reconnects == 1
    assert row[0] == "failed" and "failed twice" in row[1]
    assert run.status == "failed"


async def test_close_is_idempotent(team: Path, db_url: str) -> None:
    async with open_team(db_url, team) as system:
        session = await system.realtime(definition="voice")
        await asyncio.gather(session.close(), session.close())
        await session.close()
        (row,) = await rows(system, "SELECT status FROM realtime_sessions")
        with pytest.raises(Exception, match="closed"):
            await session.send_text("hi")
    assert row == ("closed",)
