"""Helpers of the PostgreSQL fleet tests (tests/fleet): a fresh database per test, a definitions directory
whose tools log every execution before acting, and `stead worker` child processes.

Tools (one per flag): `work_default`, `work_durable`, `work_tx` (transactional). Each appends
`start <call id> <pid> <epoch> <flag> <agent id>` to `tools.log` and fsyncs it before doing anything.
A default or durable tool running in the process with pid P blocks while the file `hold-P` exists (it
first writes `blocked-P`), so a test can kill or stop a worker inside a tool; `work_tx` blocks while
`holdtx-P` exists (writing `blockedtx-P`) inside its transaction after a round trip, holding the agent's
row lock (and the process's store, which runs one transaction at a time). `work_tx` commits its effect
`fx.<call id>` in the result's transaction (at most once, whatever happens to the process).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "FLAGS",
    "WorkerProc",
    "admin_url",
    "eventually",
    "fresh_database",
    "pg_available",
    "query",
    "start_worker",
    "wait_for",
    "write_definitions",
]

FLAGS = ("default", "durable", "tx")
ADMIN = os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def admin_url() -> str:
    return ADMIN


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(ADMIN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


@contextlib.contextmanager
def fresh_database(**params: str) -> Iterator[str]:
    """A new, empty database for one test (dropped afterwards); yields its URL (`params` join the query)."""
    import psycopg

    name = "stead_fleet_" + uuid.uuid4().hex[:12]
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN.rsplit("/", 1)[0]
    query_s = "&".join(f"{k}={v}" for k, v in {"pool_max": "4", **params}.items())
    try:
        yield f"{base}/{name}?{query_s}"
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a fresh connection (autocommit), outside stead."""
    import psycopg

    from stead.store.postgres import parse_postgres_url

    with psycopg.connect(parse_postgres_url(url)[0], autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def wait_for(check: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `check()` until it returns something truthy (a synchronization point, not an assertion on
    timing: the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


TOOLS = '''
import asyncio, os
from pathlib import Path
import stead

HERE = Path(__file__).resolve().parent


def _log(ctx, flag):
    held = getattr(ctx.store, "held", None)
    epoch = held().get(ctx.agent_id, -1) if held is not None else -1
    line = f"start {ctx.call_id} {os.getpid()} {epoch} {flag} {ctx.agent_id}\\n"
    fd = os.open(HERE / "tools.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _hold(kind="hold"):
    hold = HERE / f"{kind}-{os.getpid()}"
    if hold.exists():
        (HERE / f"{kind.replace('hold', 'blocked')}-{os.getpid()}").write_text("1")
        while hold.exists():
            await asyncio.sleep(0.02)


@stead.tool
async def work_default(ctx: stead.ToolContext, tag: str) -> str:
    """Work (at most once)."""
    _log(ctx, "default")
    await _hold()
    return f"default:{tag}"


@stead.tool(durable=True)
async def work_durable(ctx: stead.ToolContext, tag: str) -> str:
    """Work (at least once)."""
    _log(ctx, "durable")
    await _hold()
    return f"durable:{tag}"


@stead.tool(transactional=True)
async def work_tx(ctx: stead.ToolContext, tag: str) -> str:
    """Work (exactly once, in the result's transaction)."""
    _log(ctx, "tx")
    tx = ctx.tx
    await tx.write(ctx.agent_id, "fx." + ctx.call_id, tag)
    await tx.fetch("SELECT 1")  # a round trip: the fence ran, the agent's row is locked now
    await _hold("holdtx")
    return f"tx:{tag}"
'''

MODEL = """scripted: true
rules:
  - responses:
      - tool_call: {name: %s, arguments: {tag: "t"}}
      - text: "done {last_tool_result}"
"""

AGENT = """name: fleet_%s
instructions: test agent
model: scripted:model_%s.yaml
tools:
  - tools.py:work_%s
"""


def write_definitions(directory: Path) -> Path:
    """The three agent definitions (`fleet_default`, `fleet_durable`, `fleet_tx`) with their tools."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tools.py").write_text(TOOLS)
    for flag in FLAGS:
        (directory / f"model_{flag}.yaml").write_text(MODEL % f"work_{flag}")
        (directory / f"agent_{flag}.yaml").write_text(AGENT % (flag, flag, flag))
    return directory


class WorkerProc:
    """One `stead worker` child: its pid, worker id (from the `ready` line) and stderr log."""

    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.pid = proc.pid
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"ready (\S+) ", line)
        if m is None:
            proc.kill()
            raise AssertionError(f"worker did not get ready: {line!r}; log: {log.read_text()}")
        self.worker_id = m.group(1)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def text(self) -> str:
        return self.log.read_text()


def start_worker(url: str, definitions: Path, log: Path, *args: str) -> WorkerProc:
    """Start `stead worker` and wait for its `ready` line."""
    exe = Path(sys.executable).parent / "stead"
    err = log.open("w")
    proc = subprocess.Popen(
        [str(exe), "worker", "--db", url, "--definitions", str(definitions), *args],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return WorkerProc(proc, log)


async def eventually(check: Any, timeout: float, what: str) -> Any:
    """Await until `check()` (sync or async) returns something truthy; the timeout only bounds a hang."""
    import asyncio
    import inspect

    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
