"""`stead approvals list|approve|reject` and `stead run` stopping for an approval, through real `stead`
processes on the cleanup example (issue 12: an approval round trip from the CLI)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tests.fakes.cli import empty_store, run_cli

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "cleanup"


def _setup(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLE, tmp_path / "cleanup")
    (tmp_path / "old.log").write_text("old")
    return tmp_path / "cleanup" / "agent.yaml"


def test_an_approval_round_trip_from_the_cli(tmp_path: Path) -> None:
    definition = str(_setup(tmp_path))
    first = run_cli("run", definition, "clean up old.log", "--db", "s.db", cwd=tmp_path)
    assert first.returncode == 3, first.stderr
    assert "waiting for approval: remove_file" in first.stderr
    approval_id = re.search(r"stead approvals approve (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
    agent_id = re.search(r"agent: (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
    assert (tmp_path / "old.log").exists()  # held: never ran

    listed = run_cli("approvals", "list", "--db", "s.db", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["id"], row["tool"], row["arguments"], row["status"]) == (
        approval_id,
        "remove_file",
        {"path": "old.log"},
        "pending",
    )
    assert "remove_file" in run_cli("approvals", "list", "--db", "s.db", cwd=tmp_path).stdout

    approved = run_cli(
        "approvals", "approve", approval_id, "--db", "s.db", "--note", "ok", "--by", "ana", cwd=tmp_path
    )
    assert approved.returncode == 0, approved.stderr
    assert f"approved {approval_id}" in approved.stdout and f"--agent {agent_id}" in approved.stderr
    assert (tmp_path / "old.log").exists()  # the CLI decides; it does not run the agent

    again = run_cli("approvals", "reject", approval_id, "--db", "s.db", cwd=tmp_path)
    assert again.returncode == 1 and "already decided (approved by ana: ok)" in again.stderr

    done = run_cli("run", definition, "--agent", agent_id, "--db", "s.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Done: removed old.log" in done.stdout
    assert not (tmp_path / "old.log").exists()
    assert "no pending approvals" in run_cli("approvals", "list", "--db", "s.db", cwd=tmp_path).stderr


def test_reject_from_the_cli_commits_the_error_result(tmp_path: Path) -> None:
    definition = str(_setup(tmp_path))
    first = run_cli("run", definition, "clean up old.log", "--db", "s.db", cwd=tmp_path)
    approval_id = re.search(r"stead approvals approve (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
    agent_id = re.search(r"agent: (\S+)", first.stderr).group(1)  # type: ignore[union-attr]
    rejected = run_cli("approvals", "reject", approval_id, "--db", "s.db", "--note", "keep it", cwd=tmp_path)
    assert rejected.returncode == 0, rejected.stderr
    history = run_cli("history", agent_id, "--db", "s.db", "--json", cwd=tmp_path)
    outputs = [
        b.get("output")
        for m in json.loads(history.stdout)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert "rejected by reviewer: keep it" in outputs
    done = run_cli("run", definition, "--agent", agent_id, "--db", "s.db", cwd=tmp_path)
    assert done.returncode == 0 and "Done: rejected by reviewer: keep it" in done.stdout
    assert (tmp_path / "old.log").exists()


def test_unknown_approvals_and_empty_databases_are_one_line(tmp_path: Path) -> None:
    _setup(tmp_path)
    empty_store(tmp_path / "s.db")  # nothing yet (approve never creates a database)
    missing = run_cli("approvals", "approve", "nosuchapproval", "--db", "s.db", cwd=tmp_path)
    assert missing.returncode == 1 and "no approval with id 'nosuchapproval'" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert run_cli("approvals", "list", "--db", "s.db", "--status", "maybe", cwd=tmp_path).returncode == 2


def test_stead_chat_decides_with_slash_approve(tmp_path: Path) -> None:
    definition = str(_setup(tmp_path))
    chat = run_cli(
        "chat", definition, "--db", "s.db", cwd=tmp_path, stdin="clean up old.log\n/approve looks fine\n"
    )
    assert chat.returncode == 0, chat.stderr
    assert "waiting for approval" in chat.stderr and "approved " in chat.stderr
    assert "Done: removed old.log" in chat.stdout and not (tmp_path / "old.log").exists()
    listed = run_cli("approvals", "list", "--db", "s.db", "--status", "all", "--json", cwd=tmp_path)
    (row,) = json.loads(listed.stdout)
    assert (row["status"], row["note"]) == ("approved", "looks fine")
