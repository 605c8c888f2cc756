"""`stead talk`: the README's realtime example — the voice of examples/voice hands a task to the team of
examples/team; a session that ends before the work is done loses nothing (the next one speaks the result)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.fakes.cli import invoke

ROOT = Path(__file__).resolve().parent.parent.parent
VOICE = ROOT / "examples" / "voice" / "voice.yaml"
TEAM = ROOT / "examples" / "team"


def talk(*args: str, input: str) -> tuple[int, str, str]:
    return invoke("talk", *args, input=input)


def test_talk_hands_a_task_to_the_team(tmp_path: Path) -> None:
    db = str(tmp_path / "talk.db")
    code, out, err = talk(
        str(VOICE), "--definitions", str(TEAM), "--db", db, input="write a brief about durable agents\n"
    )
    assert code == 0, err
    assert "Sure, I'm handing that to the team now." in out
    assert "The team has finished. Here is the brief, researched and written by the team:" in out
    assert "→ handed to orchestrator: write a brief about durable agents" in err
    assert "← orchestrator completed" in err


def test_talk_a_dropped_session_loses_nothing(tmp_path: Path) -> None:
    """The session ends while the team still works (its writer takes 1.5 s here); the next session of the
    voice speaks the result first."""
    team, voice = tmp_path / "team", tmp_path / "voice"
    shutil.copytree(TEAM, team)
    shutil.copytree(VOICE.parent, voice)
    writer = team / "models" / "writer.yaml"
    slow = writer.read_text().replace("scripted: true\n", "scripted: true\ndelay: 1.5\n")
    assert "delay: 1.5" in slow
    writer.write_text(slow)
    db = str(tmp_path / "talk.db")
    args = (str(voice / "voice.yaml"), "--definitions", str(team), "--db", db)
    code, out, err = talk(*args, "--wait", "0", input="write a brief about durable agents\n")
    assert code == 0, err
    assert "→ handed to orchestrator" in err
    assert "The team has finished" not in out  # the session ended before the result was spoken
    code, out, err = talk(*args, input="")
    assert code == 0, err
    assert out.startswith("The team has finished. Here is the brief")  # the next session speaks it first


def test_talk_errors_are_one_line(tmp_path: Path) -> None:
    code, _, err = talk("voice", "--db", str(tmp_path / "x.db"), input="")
    assert code == 2 and "give --definitions DIR" in err
    code, _, err = talk(str(TEAM / "orchestrator.yaml"), "--db", str(tmp_path / "x.db"), input="")
    assert code == 1 and "has type 'loop'" in err
