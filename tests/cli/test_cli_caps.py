"""Issue 25 through the real `stead` command (a subprocess) against the fake model servers on 127.0.0.1:
stdout holds committed text only (S6) — a block dropped by a retry never reaches a redirected stdout, and a
Ctrl-C during a streamed answer adds nothing to it; on a terminal a dropped block is erased — a response cut
by its output cap is shown as such (MR2), and `--retry-for` waits for a server that is down (MR3)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
from pathlib import Path

from rich.console import Console

import stead
from stead.cli._printer import RETRY_NOTE, Printer, erase_sequence
from stead.cli._render import CUT_NOTE
from stead.messages import Text
from tests.fakes import RUNAWAY_WORD, Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.cli import cli_env, run_cli, start_cli
from tests.fakes.openai_server import OpenAIFakeServer


def _definition(directory: Path, model: str, extra: str = "") -> Path:
    path = directory / "agent.yaml"
    path.write_text(f"name: helper\nmodel: {model}\ninstructions: Be brief.\n{extra}", encoding="utf-8")
    return path


def _agent_id(stderr: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in stderr.splitlines() if line.startswith("agent:"))


async def test_S6_redirected_stdout_holds_the_answer_once(tmp_path: Path, oai: OpenAIFakeServer) -> None:
    """A stream cut mid-answer, then retried: the file holds the retried answer once, never the dropped
    partial block; stderr says a retry happened."""
    oai.push(
        Reply([Text("a partial answer that is never finished")], chunk=4, cut_after=4),
        Reply([Text("the whole answer")], chunk=4),
    )
    spec = _definition(tmp_path, f"openai-compatible:local@{oai.base_url}")
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        proc = await start_cli(
            "run", str(spec), "hi", "--db", str(tmp_path / "a.db"), cwd=tmp_path, stdout=stdout
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.read_text() == "the whole answer\n"
    assert RETRY_NOTE in err.decode()  # the partial block was streamed, then dropped
    assert len(oai.requests) == 2


async def test_S6_ctrl_c_during_a_streamed_answer_adds_nothing_to_stdout(
    tmp_path: Path, ant: AnthropicFakeServer
) -> None:
    """Ctrl-C while a text block streams: the drain lets the answer finish, and the redirected stdout holds
    the blocks exactly, without the newline the Ctrl-C note used to put in the middle of one."""
    reply = Reply([Text("first block."), Text("second block, streaming")], chunk=6)
    frames = ant.render(reply, {}, 0)
    second = next(i for i, f in enumerate(frames) if b'"index":1' in f and b"text_delta" in f)
    reply.hold_after = second + 1  # pause after the second block's first piece
    ant.push(reply)
    spec = _definition(tmp_path, f"anthropic:claude-haiku-4-5@{ant.url}")
    out = tmp_path / "out.txt"
    env = cli_env(ANTHROPIC_API_KEY="sk-ant-test")
    with out.open("w") as stdout:
        proc = await start_cli(
            "run", str(spec), "hi", "--db", str(tmp_path / "a.db"), cwd=tmp_path, stdout=stdout, env=env
        )
        await asyncio.wait_for(ant.holding.wait(), 60)
        # the first block was committed when the second started streaming: it is in the file
        deadline = time.monotonic() + 30
        while not out.read_text().startswith("first block.\n"):
            assert time.monotonic() < deadline, out.read_text()
            await asyncio.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.stderr is not None
        seen = b""
        while b"Ctrl-C" not in seen:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, seen.decode()
            seen += line
        ant.release.set()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130, (seen + err).decode()
    assert out.read_text() == "first block.\nsecond block, streaming\n"


def test_S6_a_dropped_block_is_erased_on_a_terminal() -> None:
    """On a terminal the text streams; a block dropped by a retry is erased (cursor back to its first row,
    cleared to the end of the screen) before the retried answer."""
    screen = io.StringIO()
    printer = Printer(Console(file=io.StringIO()), stream=screen, tty=True)
    partial = "x" * 100 + "\nhalf a line"
    printer.handle(stead.TextDelta(partial[:60]))
    printer.handle(stead.TextDelta(partial[60:]))
    printer.handle(stead.BlockReset())
    printer.handle(stead.TextDelta("the answer"))
    printer.handle(stead.BlockEnd(Text("the answer")))
    width = os.get_terminal_size().columns if os.isatty(1) else 80
    assert screen.getvalue() == partial + erase_sequence(partial, width) + "the answer\n"
    # 100 characters on an 80-column screen take 2 rows, then one more row: 2 rows up from the cursor
    assert erase_sequence(partial, 80) == "\r\x1b[2A\x1b[J"
    assert erase_sequence("x" * 80, 80) == "\r\x1b[J"  # a row filled exactly keeps the cursor on it
    assert erase_sequence("line\n", 80) == "\r\x1b[1A\x1b[J"
    # off a terminal nothing of a dropped block is written
    piped = io.StringIO()
    printer = Printer(Console(file=io.StringIO()), stream=piped, tty=False)
    for ev in (stead.TextDelta(partial), stead.BlockReset(), stead.BlockEnd(Text("the answer"))):
        printer.handle(ev)
    assert piped.getvalue() == "the answer\n"


async def test_MR2_a_cut_response_is_shown_by_run_history_and_runs_show(
    tmp_path: Path, oai: OpenAIFakeServer
) -> None:
    oai.push(Reply(runaway=True))
    spec = _definition(
        tmp_path, f"openai-compatible:local@{oai.base_url}", "context:\n  max_output_tokens: 30\n"
    )
    db = str(tmp_path / "a.db")
    proc = await start_cli("run", str(spec), "talk", "--db", db, cwd=tmp_path)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert oai.caps == [30]
    assert out.decode() == RUNAWAY_WORD * 30 + "\n"
    assert CUT_NOTE in " ".join(err.decode().split())
    agent_id = _agent_id(err.decode())
    shown = await asyncio.to_thread(run_cli, "history", agent_id, "--db", db, cwd=tmp_path)
    assert CUT_NOTE in " ".join(shown.stdout.split())
    listed = await asyncio.to_thread(run_cli, "runs", "--json", "--db", db, cwd=tmp_path)
    run_id = json.loads(listed.stdout)[0]["id"]
    tree = await asyncio.to_thread(run_cli, "runs", "show", run_id, "--db", db, cwd=tmp_path)
    assert "cut off at the output cap" in tree.stdout


async def test_MR3_retry_for_waits_for_a_server_that_is_down(tmp_path: Path) -> None:
    """The server is down (connection refused) for 10 s: with `--retry-for 20` the run succeeds once it is
    back; without it the default retries (5 attempts, at most 7.5 s of backoff) give up while it is down."""
    server = OpenAIFakeServer()
    await server.start()
    port = server.port
    await server.close()  # down: nothing listens on the port
    spec = _definition(tmp_path, f"openai-compatible:local@http://127.0.0.1:{port}/v1")

    proc = await start_cli("run", str(spec), "hi", "--db", str(tmp_path / "a.db"), cwd=tmp_path)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and out == b""
    assert "connection failed" in err.decode()

    proc = await start_cli(
        "run", str(spec), "hi", "--db", str(tmp_path / "b.db"), "--retry-for", "20", cwd=tmp_path
    )
    await asyncio.sleep(10)  # the outage itself, not a synchronization: the server comes back after 10 s
    server = OpenAIFakeServer()
    server.push(Reply([Text("back again")]))
    await server.start(port)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await server.close()
    assert proc.returncode == 0, err.decode()
    assert out.decode() == "back again\n"


def test_MR3_retry_for_is_read_from_the_environment(tmp_path: Path) -> None:
    spec = _definition(tmp_path, "openai-compatible:local@http://127.0.0.1:9/v1")
    env = cli_env(STEAD_RETRY_FOR="-1")
    done = run_cli("run", str(spec), "hi", "--db", str(tmp_path / "a.db"), cwd=tmp_path, env=env)
    assert done.returncode == 2 and "--retry-for" in done.stderr
