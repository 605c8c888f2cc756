"""The `stead` command: run the calculator example end to end, list agents, show history, fail clearly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import stead
from tests.fakes.cli import empty_store, invoke

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "calculator" / "agent.yaml"
QUESTION = "What is (2+3)*4?"


def run_example(db: Path, *extra: str) -> tuple[str, str]:
    code, out, err = invoke("run", str(EXAMPLE), QUESTION, "--db", str(db), *extra)
    assert code == 0, err
    return out, err


def agent_id_of(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("agent: ")]
    assert lines, err
    return lines[-1].removeprefix("agent: ").strip()


def test_version() -> None:
    code, out, _ = invoke("--version")
    assert code == 0 and out.strip() == f"stead {stead.__version__}"


def test_run_agents_history_end_to_end(tmp_path: Path) -> None:
    db = tmp_path / "stead.db"
    out, err = run_example(db)
    assert "(2+3)*4 = 20" in out
    assert "→ add(a=2, b=3)" in err and "← multiply: 20" in err
    agent_id = agent_id_of(err)

    code, out, _ = invoke("agents", "--db", str(db))
    assert code == 0
    assert agent_id in out and "calculator" in out

    code, out, _ = invoke("agents", "--db", str(db), "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "id": agent_id,
            "name": "calculator",
            "active": False,
            "created_at": json.loads(out)[0]["created_at"],
        }
    ]

    code, out, _ = invoke("history", agent_id, "--db", str(db), "--json")
    assert code == 0
    messages = json.loads(out)
    assert messages[0]["role"] == "user"
    assert messages[0]["content"] == [{"type": "text", "text": QUESTION}]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    calls = [b for m in messages for b in m["content"] if b["type"] == "tool_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("add", {"a": 2, "b": 3}),
        ("multiply", {"a": 5, "b": 4}),
    ]
    results = [b["output"] for m in messages for b in m["content"] if b["type"] == "tool_result"]
    assert results == ["5", "20"]
    assert messages[-1]["content"] == [{"type": "text", "text": "(2+3)*4 = 20"}]

    code, out, _ = invoke("history", agent_id, "--db", str(db))
    assert code == 0
    assert QUESTION in out and "→ add(a=2, b=3)" in out and "(2+3)*4 = 20" in out


def test_run_continues_an_agent(tmp_path: Path) -> None:
    db = tmp_path / "stead.db"
    _, err = run_example(db)
    agent_id = agent_id_of(err)
    out, err = run_example(db, "--agent", agent_id)
    assert "(2+3)*4 = 20" in out
    assert agent_id_of(err) == agent_id
    code, out, _ = invoke("history", agent_id, "--db", str(db), "--json")
    assert code == 0
    users = [m for m in json.loads(out) if m["role"] == "user"]
    assert len(users) == 2


def test_unknown_agent(tmp_path: Path) -> None:
    db = tmp_path / "stead.db"
    empty_store(db)  # read commands never create a database (issue 9): make one first
    code, _, err = invoke("history", "nosuchagent", "--db", str(db))
    assert code == 1
    assert "error: no agent with id 'nosuchagent'" in err
    assert "Traceback" not in err
    code, _, err = invoke("run", str(EXAMPLE), "hi", "--agent", "zzzzzzzzzzzzzzzzzzzzzzzz", "--db", str(db))
    assert code == 1 and "no agent with id" in err


def test_bad_definition(tmp_path: Path) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("name: calc\nmodel: scripted:model.yaml\ncolour: blue\n")
    code, _, err = invoke("run", str(bad), "hi", "--db", str(tmp_path / "stead.db"))
    assert code == 1
    assert f"error: {bad}:3: unknown key 'colour'" in err
    assert "Traceback" not in err


def test_failed_turn_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text(
        "scripted: true\nrules:\n  - responses:\n      - error: model exploded\n"
    )
    (tmp_path / "agent.yaml").write_text("name: boom\nmodel: scripted:model.yaml\n")
    code, _, err = invoke("run", str(tmp_path / "agent.yaml"), "hi", "--db", str(tmp_path / "stead.db"))
    assert code == 1
    assert "error: the turn failed: model exploded" in err
    assert "agent: " in err


def test_store_locked_by_another_process(tmp_path: Path) -> None:
    db = tmp_path / "stead.db"
    holder = textwrap.dedent(
        f"""
        import asyncio, sys, stead
        async def main():
            system = await stead.open({f"sqlite:///{db}"!r})
            print("ready", flush=True)
            sys.stdin.readline()
            await system.close()
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        code, _, err = invoke("run", str(EXAMPLE), QUESTION, "--db", str(db))
        assert code == 1
        assert "is owned by another process" in err and "Traceback" not in err
        assert "stead.open(url, readonly=True)" in err  # the refusal says how to inspect instead
        code, _, err = invoke("agents", "--db", str(db))
        assert code == 0, err  # issue 9: read commands inspect a store another process owns
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
    run_example(db)  # the lock died with its owner


def test_console_script_runs_the_readme_command(tmp_path: Path) -> None:
    """The README's command, as a user types it, from a directory that is not the repository."""
    result = subprocess.run(
        [sys.executable, "-c", "from stead.cli import main; main()", "run", str(EXAMPLE), QUESTION],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("(2+3)*4 = 20")
    assert (tmp_path / "stead.db").exists()


def test_kill_9_then_resume_with_agent(tmp_path: Path) -> None:
    """A `stead run` killed mid-turn loses nothing; `stead run DEF --agent ID` (no message) finishes it."""
    tools = ROOT / "examples" / "calculator" / "tools.py"
    (tmp_path / "agent.yaml").write_text(
        f"name: slowcalc\nmodel: scripted:model.yaml\ntools: ['{tools}:add', '{tools}:multiply']\n"
    )
    script = (ROOT / "examples" / "calculator" / "model.yaml").read_text()
    (tmp_path / "model.yaml").write_text(script.replace("delay_between: 0.02", "delay: 1.0"))
    db = tmp_path / "stead.db"
    cmd = [sys.executable, "-c", "from stead.cli import main; main()", "run", "agent.yaml", QUESTION]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("← add: 5"):
                break
        proc.kill()  # SIGKILL while the model "thinks" about the next step
    finally:
        proc.wait(timeout=10)
    code, out, _ = invoke("agents", "--db", str(db), "--json")
    assert code == 0
    (info,) = json.loads(out)
    assert info["active"] is True
    code, out, err = invoke("run", str(tmp_path / "agent.yaml"), "--agent", info["id"], "--db", str(db))
    assert code == 0, err
    assert "resuming work left unfinished" in err
    assert out.strip().endswith("(2+3)*4 = 20")
    code, out, _ = invoke("history", info["id"], "--db", str(db), "--json")
    calls = [b["name"] for m in json.loads(out) for b in m["content"] if b["type"] == "tool_call"]
    assert calls == ["add", "multiply"]


def test_message_required_without_agent() -> None:
    code, _, err = invoke("run", str(EXAMPLE))
    assert code == 2 and "MESSAGE is required" in err
