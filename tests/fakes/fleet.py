"""Helpers of the PostgreSQL fleet tests (tests/fleet): a fresh database per test, a definitions directory
whose tools log every execution before acting, and `stead worker` child processes.

Tools (one per flag): `work_default`, `work_durable`, `work_tx` (transactional). Each appends
`start <call id> <pid> <epoch> <flag> <agent id>` to `tools.log` and fsyncs it before doing anything.
A default or durable tool running in the process with pid P blocks while the file `hold-P` exists (it
first writes `blocked-P`), so a test can kill or stop a worker inside a tool; `work_tx` blocks while
`holdtx-P` names its agent (writing `blockedtx-P`) inside its transaction after a round trip, holding
the agent's row lock (and the process's store, which runs one transaction at a time). `work_tx` commits
its effect `fx.<call id>` in the result's transaction (at most once, whatever happens to the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import stead
from stead.core.batch import IN_DOUBT_TEXT

__all__ = [
    "FLAGS",
    "WorkerProc",
    "admin_url",
    "eventually",
    "fresh_database",
    "pg_available",
    "query",
    "run_fleet_scenario",
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


async def _hold(kind="hold", agent_id=None):
    hold = HERE / f"{kind}-{os.getpid()}"
    if hold.exists() and (agent_id is None or hold.read_text() == agent_id):
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
    await _hold("holdtx", ctx.agent_id)
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


# ---------------------------------------------------------------------------- the decisive scenario
FLEET_FAST = ("--lease-ttl", "2", "--heartbeat", "0.5", "--sweep", "0.5", "--poll", "0.5")


async def _client_work(url: str, defs: Path, n: int) -> dict[str, list[str]]:
    """Create `n` agents and send three messages to each; returns the accepted (created) ids per agent."""
    accepted: dict[str, list[str]] = {}
    async with stead.open(url, definitions=defs, run_agents=False) as client:
        assert client.fleet is None
        for i in range(n):
            aid = f"ag{i:03d}"
            agent = await client.create(definition=f"fleet_{FLAGS[i % 3]}", agent_id=aid)
            ids = []
            for j in range(3):
                mid = f"{aid}-m{j}"
                deliver = agent.steer if (i + j) % 2 else agent.send
                acc = await deliver(f"message {j}", id=mid)
                assert acc.created
                ids.append(mid)
            again = await agent.send("message 0", id=f"{aid}-m0")  # A3: a repeated id is not created twice
            assert not again.created
            accepted[aid] = ids
    return accepted


async def _send_one(url: str, defs: Path, agent_id: str, message_id: str) -> str:
    async with stead.open(url, definitions=defs, run_agents=False) as client:
        agent = await client.get(agent_id)
        assert (await agent.send("one more", id=message_id)).created
    return message_id


def _history(url: str) -> dict[str, list[tuple[int, int, dict[str, object]]]]:
    rows = query(url, "SELECT agent_id, seq, epoch, record FROM history ORDER BY agent_id, seq")
    out: dict[str, list[tuple[int, int, dict[str, object]]]] = {}
    for aid, seq, epoch, rec in rows:
        out.setdefault(aid, []).append((int(seq), int(epoch), json.loads(rec)))
    return out


def _tool_log(defs: Path) -> list[list[str]]:
    path = defs / "tools.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def run_fleet_scenario(tmp_path: Path, n: int, *, a_action: str = "kill", b_in_tx: bool = True) -> None:
    """The decisive scenario (tests/fleet/test_fleet_processes.py): A and B own every agent and block inside
    tools; A is SIGKILLed (`a_action="kill"`) or SIGSTOPped (`"stop"`), B SIGSTOPped — with `b_in_tx` also
    inside a transaction; C takes over and finishes; the stopped ones are continued; then every invariant
    is checked (AssertionError names the first violation)."""
    defs = write_definitions(tmp_path / "defs")
    # a worker stopped inside a transaction keeps its row locks until PostgreSQL ends its session
    with fresh_database(options="-cidle_in_transaction_session_timeout%3D2000") as url:
        cap = str(n // 2)
        a = start_worker(url, defs, tmp_path / "a.log", *FLEET_FAST, "--capacity", cap)
        b = start_worker(url, defs, tmp_path / "b.log", *FLEET_FAST, "--capacity", cap)
        c = None
        try:
            (defs / f"hold-{a.pid}").write_text("1")
            (defs / f"hold-{b.pid}").write_text("1")
            accepted = asyncio.run(_client_work(url, defs, n))

            def split() -> bool:
                owners = Counter(str(o) for (o,) in query(url, "SELECT owner FROM agents"))
                return owners[a.worker_id] + owners[b.worker_id] == n

            wait_for(split, 30, "A and B to own every agent")
            wait_for(lambda: (defs / f"blocked-{a.pid}").exists(), 30, "A blocked inside a tool")
            wait_for(lambda: (defs / f"blocked-{b.pid}").exists(), 30, "B blocked inside a tool")
            b_agents = {r[0] for r in query(url, "SELECT id FROM agents WHERE owner = %s", (b.worker_id,))}
            # and inside a transaction: one more message for a transactional agent of B
            tx_agents = sorted(x for x in b_agents if FLAGS[int(x[2:]) % 3] == "tx")
            if b_in_tx and tx_agents:
                # its earlier messages must be done first: a transaction blocked on one of them would
                # hold the row lock the next acceptance needs
                tx_agent = tx_agents[0]

                def tx_idle() -> bool:
                    sql = (
                        "SELECT count(*) FROM kv WHERE agent_id = %s AND (key = 'pending' OR key LIKE 'q.%%')"
                    )
                    return query(url, sql, (tx_agent,))[0][0] == 0

                wait_for(tx_idle, 60, "B's transactional agent to finish its first messages")
                (defs / f"holdtx-{b.pid}").write_text(tx_agent)
                accepted[tx_agent].append(asyncio.run(_send_one(url, defs, tx_agent, f"{tx_agent}-m3")))
                wait_for(lambda: (defs / f"blockedtx-{b.pid}").exists(), 30, "B blocked in a transaction")
            stopped = [b]
            if a_action == "kill":
                a.signal(signal.SIGKILL)
                a.proc.wait(10)
            else:
                a.signal(signal.SIGSTOP)
                stopped.append(a)
            b.signal(signal.SIGSTOP)
            c = start_worker(url, defs, tmp_path / "c.log", *FLEET_FAST, "--capacity", str(n))

            def done() -> bool:
                left = query(url, "SELECT count(*) FROM kv WHERE key = 'pending' OR key LIKE 'q.%%'")[0][0]
                owners = {str(o) for (o,) in query(url, "SELECT owner FROM agents")}
                return left == 0 and owners <= {c.worker_id, "None"}

            wait_for(done, 90, "C to take over and finish every agent")
            before = _history(url)
            # the stopped workers come back: their tools return, every write they try is fenced
            for w in stopped:
                w.signal(signal.SIGCONT)
                (defs / f"hold-{w.pid}").unlink()
                (defs / f"holdtx-{w.pid}").unlink(missing_ok=True)
            for w in stopped:
                wait_for(lambda w=w: "lease-lost" in w.text(), 30, f"{w.pid} to log LeaseLost")
                wait_for(lambda w=w: "registered" in w.text(), 30, f"{w.pid} to re-register under a new id")
                assert w.stop() == 0
            assert c.stop() == 0
            after = _history(url)
            assert after == before, "the paused worker committed after its lease was taken"
        finally:
            for w in (a, b, c):
                if w is not None and w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait(10)

        log = _tool_log(defs)
        starts = Counter((cid, flag) for _, cid, _pid, _ep, flag, _aid in log)
        pids_of = {}
        for _, cid, pid, _ep, _flag, _aid in log:
            pids_of.setdefault(cid, set()).add(int(pid))
        history = after
        kv_fx = {r[0] for r in query(url, "SELECT key FROM kv WHERE key LIKE 'fx.%%'")}
        assert len(history) == n
        for aid, rows in history.items():
            epochs = [e for _, e, _ in rows]
            assert epochs == sorted(epochs), f"{aid}: history epochs decrease along seq: {epochs}"
            # X3: every run settled exactly once, and every consumed message belongs to a settled run
            ends = Counter(r["run"] for _, _, r in rows if r.get("k") == "e")
            assert ends and set(ends.values()) == {1}, f"{aid}: settlements per run: {ends}"
            assert {r.get("run") for _, _, r in rows if r.get("k") == "u"} <= set(ends)
            users = [r["id"] for _, _, r in rows if r.get("k") == "u"]
            assert Counter(users) == Counter(accepted[aid]), f"{aid}: accepted ids in history: {users}"
            calls = [r["b"]["i"] for _, _, r in rows if r.get("k") == "b" and r["b"].get("t") == "c"]
            results = [r["b"] for _, _, r in rows if r.get("k") == "t"]
            assert Counter(x["i"] for x in results) == Counter(calls), f"{aid}: one result per call"
            flag = FLAGS[int(aid[2:]) % 3]
            for res in results:
                cid = res["i"]
                if flag == "default":
                    assert starts[(cid, "default")] <= 1, f"default tool of {cid} ran twice"
                    interrupted = pids_of.get(cid, set()) & {a.pid, b.pid}
                    if interrupted:
                        assert res["o"] == IN_DOUBT_TEXT
                elif flag == "tx":
                    assert f"fx.{cid}" in kv_fx
                    assert res["o"] == "tx:t"
                else:
                    assert res["o"] == "durable:t"
        assert any(pids_of.get(cid, set()) & {b.pid} for cid, _ in starts), "B ran no tool"
        assert b_agents, "B owned nothing"
        # B logged the lost lease; its default calls were answered in doubt by C, never run again
        assert "lease-lost" in (tmp_path / "b.log").read_text()
        assert not any(line.startswith("Traceback") for line in (tmp_path / "b.log").read_text().splitlines())
