"""`stead chat` in a real pseudo-terminal (pexpect): streaming, steering while a slow tool runs (the scripted
model echoes what reached it), /history, /runs, /abort, Ctrl-C aborting a turn, a double Ctrl-C exiting,
and continuing the same agent later with --agent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pexpect
import pytest

from tests.fakes.cli import STEAD, cli_env, run_cli, write_waiting_agent

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        STEAD[0],
        [*STEAD[1:], "chat", *args],
        cwd=str(tmp_path),
        env=cli_env(),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 200),
    )
    child.logfile_read = (tmp_path / "chat.log").open("w")
    return child


def test_chat_steers_a_working_agent_and_aborts_on_ctrl_c(tmp_path: Path) -> None:
    flag = tmp_path / "go"
    definition = write_waiting_agent(tmp_path / "defs", flag)
    db = tmp_path / "chat.db"
    child = spawn(tmp_path, str(definition), "--db", str(db))
    child.expect("chatting with helper")

    child.sendline("hello there")  # idle: sent
    child.expect("echo: hello there")

    child.sendline("start the job")
    child.expect(r"→ wait_for_go\(")  # the slow tool runs
    child.sendline("steer: go left")  # typed while the agent works: a steer
    child.expect(r"steer queued: it reaches the model at the next step")
    flag.touch()  # the tool returns; the next boundary takes the steer
    child.expect("↳ steer reached the model: steer: go left")
    child.expect("the model saw: steer: go left")  # the model's answer to the steer

    child.sendline("/history")
    child.expect("← wait_for_go: went")
    child.expect("  steer: go left")
    child.sendline("/runs")
    child.expect("completed")

    flag.unlink()
    child.sendline("start again")
    child.expect(r"→ wait_for_go\(")
    child.sendcontrol("c")  # the first Ctrl-C aborts the turn
    child.expect("Ctrl-C: aborting the current turn")
    child.expect(r"\(turn aborted\)")
    child.sendline("/abort")
    child.expect("nothing to abort: the agent is idle")
    child.sendcontrol("c")
    child.sendcontrol("c")  # twice within 2 s: exit 130 (interrupted), as docs/cli.md says
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130

    result = run_cli("agents", "--json", "--db", str(db), cwd=tmp_path)
    (info,) = json.loads(result.stdout)
    assert info["active"] is False
    history = json.loads(run_cli("history", info["id"], "--json", "--db", str(db), cwd=tmp_path).stdout)
    users = [m["content"][0]["text"] for m in history if m["role"] == "user"]
    assert users == ["hello there", "start the job", "steer: go left", "start again"]


def test_chat_continues_an_agent_and_exits_with_slash_exit(tmp_path: Path) -> None:
    flag = tmp_path / "go"
    definition = write_waiting_agent(tmp_path / "defs", flag)
    db = tmp_path / "chat.db"
    first = run_cli("run", str(definition), "first message", "--db", str(db), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    agent_id = first.stderr.strip().splitlines()[-1].removeprefix("agent: ")

    child = spawn(tmp_path, str(tmp_path / "defs"), "--agent", agent_id, "--db", str(db))
    child.expect(f"agent {agent_id}")
    child.sendline("/history")
    child.expect("echo: first message")
    child.sendline("second message")
    child.expect("echo: second message")
    child.sendline("/nope")
    child.expect("unknown command /nope")
    child.sendline("/exit")
    child.expect(f"agent: {agent_id}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_usage_errors(tmp_path: Path) -> None:
    definition = write_waiting_agent(tmp_path / "defs", tmp_path / "go")
    result = run_cli("chat", str(tmp_path / "defs"), cwd=tmp_path)
    assert result.returncode == 2 and "AGENT_NAME is required" in result.stderr
    result = run_cli("chat", str(definition), "extra", cwd=tmp_path)
    assert result.returncode == 2 and "unexpected argument 'extra'" in result.stderr


def test_chat_reads_piped_lines_and_answers_them_before_leaving(tmp_path: Path) -> None:
    definition = write_waiting_agent(tmp_path / "defs", tmp_path / "go")
    result = run_cli("chat", str(definition), "--db", "p.db", cwd=tmp_path, stdin="hello\n")
    assert result.returncode == 0, result.stderr
    assert "echo: hello" in result.stdout
