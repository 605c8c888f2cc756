"""Helpers for tests that run the `stead` command: as a real process (subprocess or pseudo-terminal), or in
this process through typer's `CliRunner` (`invoke`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from typer.testing import CliRunner

import stead
from stead.cli import app

__all__ = ["STEAD", "cli_env", "empty_store", "invoke", "run_cli", "start_cli", "write_waiting_agent"]

STEAD = [sys.executable, "-c", "from stead.cli import main; main()"]
"""The console script, run by this interpreter (the test's venv)."""


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `stead` process: this one, no colours, no terminal probing."""
    env = {**os.environ, "NO_COLOR": "1", "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "COLUMNS": "200"}
    env.pop("STEAD_DB", None)
    env.update(extra)
    return env


def empty_store(path: Path) -> None:
    """Create a stead database at `path` with no agents (write commands never create one)."""

    async def make() -> None:
        await (await stead.open(f"sqlite:///{path}")).close()

    asyncio.run(make())


def invoke(*args: str, input: str | None = None) -> tuple[int, str, str]:
    """Run `stead ARGS...` in this process (typer's `CliRunner`, `input` as its standard input): (exit code,
    stdout, stderr). An exception other than the command's own exit is raised."""
    result = CliRunner().invoke(app, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def run_cli(
    *args: str, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `stead ARGS...` to completion; stdout and stderr captured as text."""
    return subprocess.run(
        [*STEAD, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or cli_env(),
        stdin=subprocess.DEVNULL if stdin is None else None,
    )


async def start_cli(
    *args: str, cwd: Path, stdout: IO[Any] | int = subprocess.PIPE, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """Start `stead ARGS...` without blocking the test's event loop (which may be running a fake model
    server the process talks to); no standard input, stderr piped, stdout piped unless given (a file)."""
    return await asyncio.create_subprocess_exec(
        *STEAD,
        *args,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env or cli_env(),
    )


WAIT_TOOL = """\
import asyncio
import os


async def wait_for_go(flag: str) -> str:
    "Wait until the file named flag exists (the test creates it)."
    while not os.path.exists(flag):
        await asyncio.sleep(0.02)
    return "went"
"""

WAIT_MODEL = """\
# SCRIPTED MODEL — not a real LLM.
scripted: true
rules:
  - when: {{user_contains: "steer:"}}
    responses:
      - text: "the model saw: {{user}}"
  - when: {{user_contains: "start"}}
    responses:
      - tool_call: {{name: wait_for_go, arguments: {{flag: "{flag}"}}}}
      - text: "finished without a steer"
  - responses:
      - text: "echo: {{user}}"
"""


def write_waiting_agent(directory: Path, flag: Path, *, name: str = "helper") -> Path:
    """A definition whose scripted model, asked to "start", calls `wait_for_go(flag)` — a tool that runs until
    the file `flag` exists — then answers; a message containing "steer:" is echoed as `the model saw: ...`
    (so a test sees what reached the model). Returns the definition file."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tools.py").write_text(WAIT_TOOL)
    (directory / "model.yaml").write_text(WAIT_MODEL.format(flag=flag))
    path = directory / "agent.yaml"
    path.write_text(f"name: {name}\nmodel: scripted:model.yaml\ntools: [tools.py:wait_for_go]\n")
    return path
