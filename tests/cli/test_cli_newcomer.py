"""What a new user hits with the `stead` command (issue 9), each through a real `stead` process.

Items: 1 (file and directory mode build the same agent), 2 (read commands inspect a store another process
owns), 3 (read commands never create or alter databases; read-only files can be inspected), 9 (an empty
message leaves no orphan agent; usage errors exit 2), 10 (--model for every agent a command creates), and
the one-line errors, `-`/`@file` messages, SIGTERM/Ctrl-C, a closed pipe and the help format.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

import stead
from stead.messages import Text, ToolCall
from stead.providers.scripted import ScriptedProvider
from stead.store.sqlite import SCHEMA_VERSION
from tests.fakes import Reply
from tests.fakes.cli import STEAD, cli_env, empty_store, run_cli, write_waiting_agent
from tests.fakes.openai_server import OpenAIFakeServer
from tests.fakes.postgres import raw_rows
from tests.fakes.slow_owner import AGENT_ID, ANSWER, MESSAGE_ID, SlowOwner

ROOT = Path(__file__).resolve().parents[2]
CALCULATOR = ROOT / "examples" / "calculator"
TEAM = ROOT / "examples" / "team"
QUESTION = "What is (2+3)*4?"


def agent_of(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("agent: ")]
    assert lines, stderr
    return lines[-1].removeprefix("agent: ").strip()


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one `error: ...` line and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


async def inspect(db: Path) -> stead.AgentSystem:
    return await stead.open(f"sqlite:///{db}", readonly=True)


def configs(db: Path) -> dict[str, dict[str, object]]:
    """Every agent's stored configuration (name → config), read without owning the store."""

    async def read() -> dict[str, dict[str, object]]:
        async with await inspect(db) as system:
            out: dict[str, dict[str, object]] = {}
            for info in await system.agents():
                config = (await system.get(info.id))._rt.config
                out[info.name or info.id] = {
                    "instructions": config.instructions,
                    "provider": config.provider,
                    "model": config.model,
                    "limits": config.extra.get("stead.limits"),
                }
            return out

    return asyncio.run(read())


# ------------------------------------------------------------------------------------------ item 1
TEMPLATED = """\
name: templated
description: Checks that file mode renders like directory mode.
instructions: |
  I am {{ agent.name }} ({{ agent.description }}).
model: [openai:gpt-4.1-mini, scripted:model.yaml]
tools: [tools.py:add, tools.py:multiply]
limits:
  max_iterations: 1
"""


def _templated(directory: Path) -> Path:
    directory.mkdir()
    shutil.copy(CALCULATOR / "tools.py", directory / "tools.py")
    shutil.copy(CALCULATOR / "model.yaml", directory / "model.yaml")
    (directory / "agent.yaml").write_text(TEMPLATED)
    return directory / "agent.yaml"


def test_run_file_and_directory_build_the_same_agent(tmp_path: Path) -> None:
    definition = _templated(tmp_path / "defs")
    by_file = run_cli("run", str(definition), QUESTION, "--db", "file.db", cwd=tmp_path)
    by_dir = run_cli("run", str(definition.parent), "templated", QUESTION, "--db", "dir.db", cwd=tmp_path)
    for result in (by_file, by_dir):
        # limits apply: the model's second request is refused (max_iterations: 1)
        assert result.returncode == 1 and "max_iterations" in result.stderr, result.stderr
        assert "→ add(a=2, b=3)" in result.stderr  # the scripted candidate served it: no OPENAI_API_KEY
    (file_config,) = configs(tmp_path / "file.db").values()
    (dir_config,) = configs(tmp_path / "dir.db").values()
    assert file_config == dir_config
    assert (
        file_config["instructions"]
        == "I am templated (Checks that file mode renders like directory mode.).\n"
    )
    assert file_config["limits"] == {"max_iterations": 1}


def test_run_file_mode_refuses_an_undefined_template_variable(tmp_path: Path) -> None:
    definition = _templated(tmp_path / "defs")
    definition.write_text(TEMPLATED.replace("{{ agent.name }}", "{{ data.nope }}"))
    result = run_cli("run", str(definition), QUESTION, cwd=tmp_path)
    line = one_error_line(result)
    assert result.returncode == 1 and line.startswith(f"error: {definition}:4: instructions: ")
    assert "nope" in line
    assert json.loads(run_cli("agents", "--json", cwd=tmp_path).stdout) == []  # nothing was created


# ------------------------------------------------------------------------------------------ item 2
def test_read_commands_inspect_a_store_while_its_owner_runs_a_slow_tool(tmp_path: Path) -> None:
    db = tmp_path / "owned.db"
    with SlowOwner(f"sqlite:///{db}") as owner:
        owner.wait_for("tool-started")
        agents = run_cli("agents", "--json", "--db", str(db), cwd=tmp_path)
        assert agents.returncode == 0, agents.stderr
        (info,) = json.loads(agents.stdout)
        assert (info["id"], info["active"]) == (AGENT_ID, True)
        history = run_cli("history", AGENT_ID, "--json", "--db", str(db), cwd=tmp_path)
        assert history.returncode == 0, history.stderr
        assert [m["role"] for m in json.loads(history.stdout)] == ["user", "assistant"]
        assert json.loads(history.stdout)[0]["id"] == MESSAGE_ID
        runs = run_cli("runs", "--json", "--db", str(db), cwd=tmp_path)
        (run,) = json.loads(runs.stdout)
        assert run["status"] == "running"
        shown = run_cli("runs", "show", run["id"], "--db", str(db), cwd=tmp_path)
        assert shown.returncode == 0 and "running" in shown.stdout and "prompt" in shown.stdout

        owned = run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, "--db", str(db), cwd=tmp_path)
        line = one_error_line(owned)
        assert f"{db} is owned by another process (pid {owner.proc.pid}" in line  # type: ignore[union-attr]
        assert "readonly=True" in line and "stead agents" in line

        owner.go_on()
        owner.wait_for("idle")
        runs = run_cli("runs", "--json", "--db", str(db), cwd=tmp_path)
        (run,) = json.loads(runs.stdout)
        assert run["status"] == "completed" and run["final_message"] == ANSWER
        owner.go_on()


# ------------------------------------------------------------------------------------------ item 3
def test_read_commands_never_create_or_alter_a_database(tmp_path: Path) -> None:
    for command in (["agents"], ["history", "x"], ["runs"], ["runs", "show", "x"]):
        result = run_cli(*command, "--db", "typo.db", cwd=tmp_path)
        assert result.returncode == 1
        assert one_error_line(result) == (
            "error: typo.db: no such database file (opening read-only never creates one)"
        )
    assert list(tmp_path.iterdir()) == []

    other = tmp_path / "app.db"
    raw_rows(other, "CREATE TABLE customers(id INTEGER)")  # another application's database
    before = other.read_bytes()
    result = run_cli("agents", "--db", str(other), cwd=tmp_path)
    assert one_error_line(result) == (
        f"error: {other} is not a stead store (it is a SQLite database of another application; "
        "tables: customers)"
    )
    assert other.read_bytes() == before

    newer = tmp_path / "newer.db"
    empty_store(newer)
    raw_rows(newer, "UPDATE stead_meta SET value='7' WHERE key='schema_version'")
    result = run_cli("runs", "--db", str(newer), cwd=tmp_path)
    assert one_error_line(result) == (
        f"error: {newer} has schema version 7, newer than this stead's {SCHEMA_VERSION}; upgrade stead"
    )


def test_database_file_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "junk.db").write_text("not a database at all " * 200)
    (tmp_path / "adir").mkdir()
    run_args = ["run", str(CALCULATOR / "agent.yaml"), QUESTION]
    cases = [
        (["agents", "--db", "junk.db"], "error: junk.db is not a SQLite database (it holds something else)"),
        ([*run_args, "--db", "junk.db"], "error: junk.db is not a SQLite database (it holds something else)"),
        (["agents", "--db", "adir"], "error: adir is a directory, not a database file"),
        ([*run_args, "--db", "adir"], "error: adir is a directory, not a database file"),
    ]
    for args, expected in cases:
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 1
        assert one_error_line(result).startswith(expected)
    result = run_cli("agents", "--db", "", cwd=tmp_path)
    assert result.returncode == 2 and one_error_line(result).startswith("error: --db is empty")
    result = run_cli("agents", "--db", "no/such/dir/x.db", cwd=tmp_path)  # a missing parent directory
    assert one_error_line(result).startswith("error: no/such/dir/x.db: no such database file")
    result = run_cli(*run_args, "--db", "junk.db/x.db", cwd=tmp_path)  # a parent that is a file
    assert one_error_line(result) == "error: junk.db/x.db: 'junk.db' is not a directory"
    result = run_cli(*run_args, "--db", "no/such/dir/x.db", cwd=tmp_path)  # run never creates a directory
    assert one_error_line(result).startswith("error: no/such/dir/x.db: no such directory 'no/such/dir'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "junk.db"]  # nothing created

    damaged = tmp_path / "damaged.db"
    empty_store(damaged)
    data = bytearray(damaged.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    damaged.write_bytes(bytes(data))
    for args in (["agents", "--db", str(damaged)], [*run_args, "--db", str(damaged)]):
        line = one_error_line(run_cli(*args, cwd=tmp_path))
        assert line.startswith(f"error: {damaged} is ")  # corrupted / not a SQLite database


@pytest.fixture
def bound_by_permissions() -> list[str]:
    """A command prefix under which file permissions bind: as root (which ignores chmod), `setpriv` drops
    the capabilities that override them."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def test_a_read_only_file_and_directory_can_be_inspected(
    tmp_path: Path, bound_by_permissions: list[str]
) -> None:
    store = tmp_path / "ro"
    store.mkdir()
    db = store / "s.db"
    result = run_cli("run", str(CALCULATOR / "agent.yaml"), QUESTION, "--db", str(db), cwd=store)
    assert result.returncode == 0, result.stderr
    agent_id = agent_of(result.stderr)
    for extra in store.iterdir():
        if extra.name != "s.db":
            extra.unlink()  # as after a clean shutdown elsewhere: no -wal/-shm/lock beside it
    db.chmod(0o444)
    before = db.read_bytes()

    def bound(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*bound_by_permissions, *STEAD, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=cli_env(),
        )

    try:
        for directory_mode in (0o755, 0o555):  # a read-only file, then also in a read-only directory
            store.chmod(directory_mode)
            listed = bound("agents", "--json", "--db", str(db))
            assert listed.returncode == 0, listed.stderr
            assert [a["id"] for a in json.loads(listed.stdout)] == [agent_id]
            shown = bound("history", agent_id, "--db", str(db))
            assert shown.returncode == 0 and "(2+3)*4 = 20" in shown.stdout, shown.stderr
        owner = bound("run", str(CALCULATOR / "agent.yaml"), QUESTION, "--db", str(db))
        line = one_error_line(owner)
        assert str(db) in line and "readonly=True" in line
    finally:
        store.chmod(0o755)
        db.chmod(0o644)
    assert db.read_bytes() == before


# ------------------------------------------------------------------------------------------ item 9
def test_an_empty_message_leaves_no_agent_and_exits_2(tmp_path: Path) -> None:
    definition = str(CALCULATOR / "agent.yaml")
    for message in ("", "   \n"):
        result = run_cli("run", definition, message, cwd=tmp_path)
        assert result.returncode == 2
        assert one_error_line(result) == "error: MESSAGE: message content is empty"
    assert not (tmp_path / "stead.db").exists()  # refused before anything was opened or created
    result = run_cli("run", definition, "-", cwd=tmp_path, stdin="")
    assert result.returncode == 2 and "message content is empty" in result.stderr
    result = run_cli("run", definition, "a", "b", cwd=tmp_path)
    assert result.returncode == 2 and "too many arguments" in one_error_line(result)
    assert not (tmp_path / "stead.db").exists()


def test_message_from_stdin_and_from_a_file_and_the_payload_limit(tmp_path: Path) -> None:
    definition = str(CALCULATOR / "agent.yaml")
    result = run_cli("run", definition, "-", cwd=tmp_path, stdin=QUESTION)
    assert result.returncode == 0 and result.stdout.strip().endswith("(2+3)*4 = 20"), result.stderr
    (tmp_path / "question.txt").write_text(QUESTION)
    result = run_cli("run", definition, "@question.txt", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("(2+3)*4 = 20"), result.stderr
    result = run_cli("run", definition, "@missing.txt", cwd=tmp_path)
    assert result.returncode == 2 and "message file 'missing.txt' not found" in one_error_line(result)
    result = run_cli("run", definition, "@@literally", "--db", "lit.db", cwd=tmp_path)
    history = run_cli("history", agent_of(result.stderr), "--json", "--db", "lit.db", cwd=tmp_path)
    assert json.loads(history.stdout)[0]["content"][0]["text"] == "@literally"

    big = "x" * 2000
    result = run_cli("run", definition, big, "--max-payload-bytes", "1000", cwd=tmp_path)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "the limit is 1000 bytes (raise it with --max-payload-bytes)" in line
    result = run_cli("run", definition, big, "--max-payload-bytes", "5000", "--db", "big.db", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------ item 10
async def test_model_applies_to_every_agent_a_directory_run_creates(
    tmp_path: Path, oai: OpenAIFakeServer
) -> None:
    model = f"openai-compatible:fake-model@{oai.base_url}"
    oai.push(
        Reply([ToolCall("writer", {"request": "write it"})]),  # the orchestrator delegates
        Reply([Text("the brief")]),  # the writer (a sub-agent created by this command) answers
        Reply([Text("done: the brief")]),
    )
    db = tmp_path / "team.db"
    proc = await asyncio.create_subprocess_exec(
        *STEAD,
        *["run", str(TEAM), "orchestrator", "hi", "--model", model, "--db", str(db)],
        cwd=tmp_path,
        env=cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    assert stdout.decode().strip().endswith("done: the brief")
    assert [r.body["model"] for r in oai.requests] == ["fake-model"] * 3
    async with await inspect(db) as system:
        infos = await system.agents()
        assert sorted(i.name or "" for i in infos) == ["orchestrator", "writer"]
        for info in infos:
            config = (await system.get(info.id))._rt.config
            assert (config.provider, config.model) == ("catalog", model)


def test_model_without_its_key_is_one_line_naming_it(tmp_path: Path) -> None:
    result = run_cli("run", str(TEAM), "orchestrator", "hi", "--model", "openai:gpt-4.1-mini", cwd=tmp_path)
    assert result.returncode == 1
    assert "OPENAI_API_KEY" in one_error_line(result)
    assert not (tmp_path / "stead.db").exists()


# ------------------------------------------------------------------------------------------ interrupts
@contextmanager
def _waiting_run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], IO[str], Path, Path]]:
    """`stead run` of an agent whose tool call waits for the file `flag`, once that call is running: yields
    the process, its stderr, `flag` and the definition; the process is killed on the way out if it still
    runs."""
    flag = tmp_path / "go"
    definition = write_waiting_agent(tmp_path / "defs", flag)
    proc = subprocess.Popen(
        [*STEAD, "run", str(definition), "start the job", "--db", "w.db"],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if line.startswith("→ wait_for_go("):
                break
        yield proc, proc.stderr, flag, definition
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_drains_then_names_the_agent_to_continue(tmp_path: Path) -> None:
    with _waiting_run(tmp_path) as (proc, stderr, flag, definition):
        proc.send_signal(signal.SIGTERM)
        line = stderr.readline()
        assert line.startswith("SIGTERM: stopping agent ") and "at its next safe point" in line
        assert "Press Ctrl-C again to exit at once" in line
        agent_id = line.split()[3]
        flag.touch()  # the running tool call finishes; the agent stops before asking the model again
        rest = stderr.read()
        assert proc.wait(timeout=30) == 143
    assert f"error: interrupted (accepted work is durable: continue it with --agent {agent_id})" in rest
    resumed = run_cli("run", str(definition), "--agent", agent_id, "--db", "w.db", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "finished without a steer"


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    with _waiting_run(tmp_path) as (proc, stderr, _, _):
        proc.send_signal(signal.SIGINT)
        first = stderr.readline()
        assert first.startswith("Ctrl-C: stopping agent ") and "the model response or tool call" in first
        agent_id = first.split()[3]
        proc.send_signal(signal.SIGINT)  # the tool is still running: exit without waiting for it
        rest = stderr.read()
        assert proc.wait(timeout=30) == 130
    assert f"exiting at once; accepted work is durable: continue it with --agent {agent_id}" in rest
    listed = json.loads(run_cli("agents", "--json", "--db", "w.db", cwd=tmp_path).stdout)
    assert [(a["id"], a["active"]) for a in listed] == [(agent_id, True)]


# ------------------------------------------------------------------------------------------ output
def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    async def big_history() -> str:
        provider = ScriptedProvider(lambda r: [stead.Text("ok\n" * 40_000)])
        async with stead.open(f"sqlite:///{tmp_path / 'big.db'}", providers={"s": provider}) as system:
            agent = await system.create(provider="s")
            await agent.send("hi")
            await agent.wait_idle()
            return agent.id

    agent_id = asyncio.run(big_history())
    for command in (f"history {agent_id}", f"history {agent_id} --json", "runs --json"):
        shell = f"{' '.join(STEAD[:2])} '{STEAD[2]}' {command} --db big.db | head -1"
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", shell],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=cli_env(),
        )
        assert result.stderr == "", result.stderr
        assert "BrokenPipe" not in result.stderr and "Exception ignored" not in result.stderr


def test_help_has_no_type_placeholders_and_whole_sentences(tmp_path: Path) -> None:
    for command in ([], ["run"], ["chat"], ["agents"], ["history"], ["runs"], ["runs", "show"], ["models"]):
        result = run_cli(*command, "--help", cwd=tmp_path, env=cli_env(COLUMNS="100"))
        assert result.returncode == 0, result.stderr
        text = result.stdout
        for placeholder in ("<bool>", "<str>", "<path>", "<int>", "<list", "TEXT", "INTEGER"):
            assert placeholder not in text, (command, placeholder, text)
        for line in text.splitlines():
            assert len(line) <= 100, line
    run_help = run_cli("run", "--help", cwd=tmp_path).stdout
    assert "--model MODEL" in run_help and "--db PATH" in run_help and "--agent ID" in run_help
    assert "sub-agents included" in " ".join(run_help.split())
    # a paragraph is rewrapped as a whole: no line ends a sentence fragment that the source broke mid-way
    assert "single definition\n  file." not in run_help


def test_definitions_directory_with_a_yaml_file_that_is_not_a_definition(tmp_path: Path) -> None:
    defs = tmp_path / "defs"
    shutil.copytree(CALCULATOR, defs)
    (defs / "docker-compose.yaml").write_text("services:\n  web:\n    image: nginx\n")
    result = run_cli("run", str(defs), "calculator", QUESTION, cwd=tmp_path)
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"error: {defs / 'docker-compose.yaml'}:1: not an agent definition: it has none of the keys name, "
        "model, instructions (its keys: services)"
    )


def test_a_tool_parameter_without_a_schema_fails_the_run_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: hi\n")
    (tmp_path / "tools.py").write_text(
        "class Thing:\n    pass\n\ndef lookup(thing: Thing) -> str:\n    return ''\n"
    )
    (tmp_path / "agent.yaml").write_text("name: a\nmodel: scripted:model.yaml\ntools: [tools.py:lookup]\n")
    result = run_cli("run", "agent.yaml", "hi", cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith("error: agent.yaml:3: tools[0]: ") or line.startswith(f"error: {tmp_path}")
    assert "tool 'lookup': parameter 'thing' has type Thing" in line


def test_yaml_syntax_error_points_at_the_unterminated_quote(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text('name: a\nmodel: "scripted:model.yaml\ntools: []\n')
    line = one_error_line(run_cli("run", "agent.yaml", "hi", cwd=tmp_path))
    assert line.startswith("error: agent.yaml:2: YAML syntax error: a quoted scalar starts here")
