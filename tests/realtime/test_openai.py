"""The OpenAI Realtime driver against a loopback fake of the GA protocol (fake_openai_realtime.py):
the exact client events it sends (RT8), the collision of a server-started response (RT3), barge-in by speech
with `turn_detected` and truncation (RT5), a dropped connection with one reconnect, and usage."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stead.realtime._openai import session_update
from tests.realtime.fake_openai_realtime import FakeRealtimeServer, Reply
from tests.realtime.support import Events, gate, open_team, rows, write_team

ENV = {"OPENAI_API_KEY": "sk-test"}


def _text(item: dict[str, Any]) -> str:
    part = (item.get("content") or [{}])[0]
    return str(part.get("text") or part.get("transcript") or "")


def reply(items: list[dict[str, Any]]) -> Reply:
    last = items[-1] if items else {}
    if last.get("type") == "function_call_output":
        return Reply("It has started.")
    if last.get("role") == "system":
        return Reply("Result is in.")
    text = _text(last)
    if "task" in text:
        return Reply("Handing it over.", calls=[("invoke_target_agent", {"request": text})])
    if "long" in text:
        return Reply("one two three four five", hold=True)
    return Reply(f"You said {text}.")


@pytest.fixture
async def server() -> AsyncIterator[FakeRealtimeServer]:
    s = FakeRealtimeServer(reply)
    await s.start()
    yield s
    s.released.set()
    await s.close()


def team_for(tmp_path: Path, server: FakeRealtimeServer, **realtime: Any) -> Path:
    return write_team(
        tmp_path / "team", voice={"model": f"openai:gpt-realtime@{server.url}", "realtime": realtime or None}
    )


async def test_RT8_openai_driver_speaks_exact_events(
    tmp_path: Path, db_url: str, server: FakeRealtimeServer
) -> None:
    team = team_for(tmp_path, server, voice="marin")
    g = gate("do the task")
    async with open_team(db_url, team, env=ENV) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        await ev.type("delegation_started")
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "It has started.")
        g.set()
        await ev.type("delegation_result")
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "Result is in.")
        await ev.type("response_done")
        await session.close()
        usage = await rows(
            system, "SELECT input_tokens, output_tokens FROM run_steps WHERE id = ?", session.prompt_step_id
        )
    assert server.problems == []
    assert server.types() == [
        "session.update",
        "conversation.item.create",  # the user's text
        "response.create",
        "conversation.item.create",  # the function_call_output: started
        "response.create",
        "conversation.item.create",  # the result, as a system message
        "response.create",
    ]
    first = server.received[0]
    assert first["session"] == session_update("gpt-realtime", session.config)
    s = first["session"]
    assert s["type"] == "realtime" and s["model"] == "gpt-realtime" and s["output_modalities"] == ["text"]
    assert s["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert s["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}
    assert s["audio"]["input"]["transcription"] == {"model": "gpt-4o-mini-transcribe"}
    assert [t["name"] for t in s["tools"]] == ["invoke_target_agent"] and s["tool_choice"] == "auto"
    user, output, result = (e["item"] for e in server.received if e["type"] == "conversation.item.create")
    assert user == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "do the task"}],
    }
    assert output["type"] == "function_call_output" and output["call_id"].startswith("call_")
    assert result["role"] == "system" and "finished: worked on do the task" in result["content"][0]["text"]
    assert all(e["event_id"].startswith("evt_") for e in server.received)
    assert usage[0][0] and usage[0][1]  # usage from every response.done, summed on the prompt step


async def test_RT3_collision_with_a_server_started_response_is_retried(
    tmp_path: Path, db_url: str, server: FakeRealtimeServer
) -> None:
    """The server starts a response by itself once the tool output arrives; the runner's own request
    collides, gets the error naming its event id, and is retried after the next response.done."""
    server.auto_respond_to_tool_output = True
    team = team_for(tmp_path, server)
    gate("do the task")
    async with open_team(db_url, team, env=ENV) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        collision = await ev.type("error", code="conversation_already_has_active_response")
        assert collision.fatal is False
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "It has started.")
        await ev.type("response_done")
        await ev.type("response_done")  # the retried request got its own response
        assert server.collisions == 1 and session.sequencer.collisions == 1
        assert session.status == "open" and session.reconnects == 0
        await session.close()
    assert server.problems == []
    creates = [e for e in server.received if e["type"] == "response.create"]
    errors_for = creates[1]["event_id"]
    assert errors_for != creates[2]["event_id"]  # the retry is a new request


async def test_RT5_barge_in_by_speech_truncates_and_aborts(
    tmp_path: Path, db_url: str, server: FakeRealtimeServer
) -> None:
    team = team_for(
        tmp_path, server, output="audio", turn_detection={"type": "server_vad", "interrupt_response": True}
    )
    gate("do the task")
    async with open_team(db_url, team, env=ENV) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("do the task")
        started = await ev.type("delegation_started")
        await ev.until(lambda e: e.type == "transcript" and e.final is True and e.text == "It has started.")
        await ev.type("response_done")
        await session.send_text("a long story")
        for _ in range(5):  # five words of audio (10 ms each) reach the client, then the server holds
            await ev.type("audio")
        loud = struct.pack("<2400h", *([8000] * 2400))  # 100 ms of loud sound: the user starts speaking
        await session.send_audio(loud)
        cancelled = await ev.type("response_done", status="cancelled")
        assert cancelled.reason == "turn_detected"
        result = await ev.any("delegation_result", delegation_id=started.delegation_id)
        assert result.status == "cancelled"
        await session.close()
        (status,) = await rows(system, "SELECT status FROM realtime_delegations")
    assert status == ("cancelled",)
    (truncate,) = [e for e in server.received if e["type"] == "conversation.item.truncate"]
    assert truncate["audio_end_ms"] == 50 and truncate["content_index"] == 0
    assert "response.cancel" not in server.types()  # the server cancelled it on speech by itself
    assert server.problems == []


async def test_a_dropped_connection_reconnects_once(
    tmp_path: Path, db_url: str, server: FakeRealtimeServer
) -> None:
    server.drop_after_responses = 1
    team = team_for(tmp_path, server)
    async with open_team(db_url, team, env=ENV) as system:
        session = await system.realtime(definition="voice")
        ev = Events(session)
        await session.send_text("hello")
        await ev.type("response_done")
        await ev.type("error", fatal=True)
        await session.send_text("again") if False else None
        while server.connections < 2:
            await asyncio.wait_for(
                ev.until(lambda e: True, timeout=0.5), 1
            ) if False else await asyncio.sleep(0)
        await session.close()
    assert session.reconnects == 1 and server.connections == 2
    second = [e for e in server.received if e["type"] == "session.update"]
    assert len(second) == 2 and second[0]["session"] == second[1]["session"]  # same session settings
