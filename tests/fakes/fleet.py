"""Helpers of the PostgreSQL fleet tests (tests/fleet): a fresh database per test, a definitions directory
whose tools log every execution before acting, and `stead worker` child processes.

Tools (one per flag): `work_default`, `work_durable`, `work_tx` (transactional), `work_gated` (held for
approval). Each appends `start <call id> <pid> <epoch> <flag> <agent id> <ms>` to `tools.log` and fsyncs
it before doing anything (`ms`: how long it works, from a `ms=N` in its tag; the chaos scenario's).
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
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stead
from stead.core.batch import IN_DOUBT_TEXT
from tests.chaos.requests import Stored, check_requests, read_requests, stored_from_records

__all__ = [
    "FLAGS",
    "FleetChaosResult",
    "WorkerProc",
    "admin_url",
    "eventually",
    "fresh_database",
    "make_fleet_plan",
    "pg_available",
    "query",
    "run_fleet_chaos",
    "run_fleet_scenario",
    "start_worker",
    "wait_for",
    "write_definitions",
]

FLAGS = ("default", "durable", "tx")
ROOT = Path(__file__).resolve().parent.parent.parent
ADMIN = os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def admin_url() -> str:
    return ADMIN


def pg_available(admin: str | None = None) -> bool:
    try:
        import psycopg

        with psycopg.connect(admin or ADMIN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


@contextlib.contextmanager
def fresh_database(admin: str | None = None, **params: str) -> Iterator[str]:
    """A new, empty database for one test (dropped afterwards) on the server of `admin` (default: the
    `STEAD_TEST_PG_ADMIN` one); yields its URL (`params` join the query)."""
    import psycopg

    admin = admin or ADMIN
    name = "stead_fleet_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0]
    query_s = "&".join(f"{k}={v}" for k, v in {"pool_max": "4", **params}.items())
    try:
        yield f"{base}/{name}?{query_s}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a fresh connection (autocommit), outside stead."""
    import psycopg

    from stead.store.postgres import parse_postgres_url

    # the chaos restarts the server it reads: this observer (not stead) waits out a restart, bounded
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = psycopg.connect(parse_postgres_url(url)[0], autocommit=True, connect_timeout=5)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            _RESTARTS.acquire()  # a restart of ours in progress ends before the next try
            _RESTARTS.release()
            time.sleep(0.2)
            continue
        with conn:
            try:
                cur = conn.execute(sql, params)
                return cur.fetchall() if cur.description is not None else []
            except psycopg.OperationalError:
                # a restart ended the connection mid-statement (seed 2126): a read is asked again
                if not sql.lstrip().upper().startswith("SELECT") or time.monotonic() > deadline:
                    raise
        _RESTARTS.acquire()
        _RESTARTS.release()
        time.sleep(0.2)


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
import asyncio, os, re, sys
from pathlib import Path
import stead

HERE = Path(__file__).resolve().parent

if os.environ.get("STEAD_FLEET_REQUEST_LOG"):  # a `stead worker` of the fleet tests: the request checker
    sys.path.insert(0, os.environ["STEAD_FLEET_REQUEST_LOG"])
    from stead.providers.scripted import ScriptedProvider
    from tests.chaos.requests import RequestLog

    ScriptedProvider.observers.append(
        RequestLog(HERE / f"requests-{os.getpid()}.jsonl", f"worker pid {os.getpid()}")
    )


def _log(ctx, flag, tag=""):
    held = getattr(ctx.store, "held", None)
    epoch = held().get(ctx.agent_id, -1) if held is not None else -1
    ms = re.search(r"ms=(\\d+)", tag)
    line = f"start {ctx.call_id} {os.getpid()} {epoch} {flag} {ctx.agent_id} {ms.group(1) if ms else 0}\\n"
    fd = os.open(HERE / "tools.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _hold(kind="hold", agent_id=None, tag=""):
    hold = HERE / f"{kind}-{os.getpid()}"
    if hold.exists() and (agent_id is None or hold.read_text() == agent_id):
        (HERE / f"{kind.replace('hold', 'blocked')}-{os.getpid()}").write_text("1")
        while hold.exists():
            await asyncio.sleep(0.02)
    ms = re.search(r"ms=(\\d+)", tag)  # the chaos scenario: the message says how long the tool works
    if ms:
        await asyncio.sleep(int(ms.group(1)) / 1000)


@stead.tool
async def work_default(ctx: stead.ToolContext, tag: str) -> str:
    """Work (at most once)."""
    _log(ctx, "default", tag)
    await _hold(tag=tag)
    return f"default:{tag}"


@stead.tool(durable=True)
async def work_durable(ctx: stead.ToolContext, tag: str) -> str:
    """Work (at least once)."""
    _log(ctx, "durable", tag)
    await _hold(tag=tag)
    return f"durable:{tag}"


@stead.tool(transactional=True)
async def work_tx(ctx: stead.ToolContext, tag: str) -> str:
    """Work (exactly once, in the result's transaction)."""
    _log(ctx, "tx", tag)
    tx = ctx.tx
    await tx.write(ctx.agent_id, "fx." + ctx.call_id, tag)
    await tx.fetch("SELECT 1")  # a round trip: the fence ran, the agent's row is locked now
    await _hold("holdtx", ctx.agent_id, tag=tag)
    return f"tx:{tag}"


@stead.tool(effects="write", destructive=True)
async def work_gated(ctx: stead.ToolContext, tag: str) -> str:
    """Work a human approves first (at most once; held for approval in auto mode)."""
    _log(ctx, "gated", tag)
    await _hold(tag=tag)
    return f"gated:{tag}"
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
        env={**os.environ, "PYTHONUNBUFFERED": "1", "STEAD_FLEET_REQUEST_LOG": str(ROOT)},
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
IDLE_TX_TIMEOUT = "-cidle_in_transaction_session_timeout%3D2000"
"""A worker stopped inside a transaction keeps its row locks until PostgreSQL ends its session."""
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


def run_fleet_scenario(
    tmp_path: Path, n: int, *, a_action: str = "kill", b_in_tx: bool = True, admin: str | None = None
) -> None:
    """The decisive scenario (tests/fleet/test_fleet_processes.py): A and B own every agent and block inside
    tools; A is SIGKILLed (`a_action="kill"`) or SIGSTOPped (`"stop"`), B SIGSTOPped — with `b_in_tx` also
    inside a transaction; C takes over and finishes; the stopped ones are continued; then every invariant
    is checked (AssertionError names the first violation)."""
    defs = write_definitions(tmp_path / "defs")
    # a worker stopped inside a transaction keeps its row locks until PostgreSQL ends its session
    with fresh_database(admin, options=IDLE_TX_TIMEOUT) as url:
        cap = str((n + 1) // 2)  # A and B together can own all n (n may be odd in --pg-fleet)
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
        starts = Counter((cid, flag) for _, cid, _pid, _ep, flag, *_ in log)
        pids_of = {}
        for _, cid, pid, *_ in log:
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
        # every provider request any worker made answered each call with its committed result
        requests = read_requests(sorted(defs.glob("requests-*.jsonl")))
        assert requests, "no provider request was logged"
        bad = check_requests(requests, stored_pg(url))
        assert not bad, "\n".join(bad)


def stored_pg(url: str) -> Stored:
    """Every call and every stored version of each result (history and archive), read directly."""
    rows = query(
        url, "SELECT agent_id, record FROM history UNION ALL SELECT agent_id, record FROM history_archive"
    )
    return stored_from_records((str(aid), json.loads(rec)) for aid, rec in rows)


# ---------------------------------------------------------------------------- the chaos scenario
CHAOS_FLAGS = ("default", "durable", "tx", "gated")
CHAOS_MODEL = """scripted: true
rules:
  - responses:
      - tool_call: {name: work_%s, arguments: {tag: "{user}"}}
      - text: "done {user} -> {last_tool_result}"
"""
CHAOS_AGENT = """name: chaos_%s
instructions: chaos test agent
model: scripted:chaos_model_%s.yaml
tools:
  - tools.py:work_%s
"""
FAULTS = (
    "stop_default",  # SIGSTOP a worker inside a default tool (at most once: answered in doubt if taken over)
    "stop_durable",  # ... inside a durable tool (re-run by the next owner)
    "stop_tx",  # ... inside a transactional tool's transaction (holding the agent's row lock)
    "stop_gated",  # ... inside an approved tool
    "stop_awaiting",  # SIGSTOP the owner of an agent whose call waits for approval (decided meanwhile)
    "frozen_wakeup",  # stop inside a durable tool, SIGCONT as soon as the new owner re-runs it (issue 20.1)
    "stop_rerun",  # SIGSTOP the worker that re-runs a durable call of a stolen agent
    "stop_any",  # SIGSTOP a random worker at a random moment
    "kill",  # SIGKILL a random worker; a replacement starts
)
_RESTARTS = threading.Lock()
"""Restarts of the cluster never overlap: two overlapping pg_ctlcluster restarts fail one of them."""


def _restart(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    with _RESTARTS:
        return subprocess.run(cmd, timeout=120, capture_output=True, text=True)


RESTART = "pg_restart"  # restart the PostgreSQL cluster (only with a cluster to restart)


def _start_outside_restarts(fleet: _Fleet) -> WorkerProc:
    """A replacement worker starts while no restart of ours is in progress, and none begins before it is
    ready (seed 2117: a `stead worker` that cannot connect at startup exits with the error — its supervisor
    restarts it; the workers already running are the ones that must ride out a restart, W3)."""
    with _RESTARTS:
        return fleet.start()


def write_chaos_definitions(directory: Path) -> Path:
    """The decisive scenario's definitions plus `chaos_<flag>` agents whose tool's tag is the user
    message (`<id> ms=<N>`: the tool works N ms) and whose answer names the message."""
    write_definitions(directory)
    for flag in CHAOS_FLAGS:
        (directory / f"chaos_model_{flag}.yaml").write_text(CHAOS_MODEL % flag)
        (directory / f"chaos_agent_{flag}.yaml").write_text(CHAOS_AGENT % (flag, flag, flag))
    return directory


@dataclass
class FleetPlan:
    seed: int
    n: int
    tasks: list[list[tuple[int, str, int]]]  # per client task: (agent index, message id, tool ms)
    faults: list[tuple[str, float, float]]  # (kind, seconds after the start it is armed, stop duration)

    def describe(self) -> str:
        runs = sum(len(t) for t in self.tasks)
        return (
            f"{self.n} agents, {len(self.tasks)} clients, {runs} runs, faults {[f[0] for f in self.faults]}"
        )


def make_fleet_plan(seed: int, restarts: bool) -> FleetPlan:
    rng = random.Random(f"fleet-chaos-{seed}")
    n = rng.randint(4, 8)
    tasks = []
    for t in range(rng.randint(2, 4)):
        runs = []
        for k in range(rng.randint(4, 8)):
            a = rng.randrange(n)
            ms = rng.choice([0, 50, 300, 800, 1500, 3000, 6000])
            if CHAOS_FLAGS[a % 4] == "tx":
                ms = min(ms, 800)  # inside a transaction: below the idle-in-transaction timeout (2 s)
            runs.append((a, f"c{t}r{k}", ms))
        tasks.append(runs)
    kinds = [*FAULTS, *([RESTART, RESTART] if restarts else [])]
    faults = []
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(kinds)
        if kind == "kill" and any(f[0] == "kill" for f in faults):
            kind = "stop_any"
        faults.append((kind, rng.uniform(0.0, 12.0), rng.choice([0.3, 1.0, 2.5, 4.0, 6.0])))
    return FleetPlan(seed, n, tasks, faults)


def approves_call(call_id: str) -> bool:
    """The chaos clients' decision on an approval (deterministic in its call id): two in three approved."""
    return sum(map(ord, call_id)) % 3 != 0


@dataclass
class FleetChaosResult:
    seed: int
    violations: list[str]
    seconds: float
    stats: Counter[str] = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class _Fleet:
    """The workers of one chaos seed, the faults done to them, and the tool log as it grows."""

    def __init__(self, url: str, defs: Path, tmp: Path, n: int) -> None:
        self.url, self.defs, self.tmp, self.n = url, defs, tmp, n
        self.workers: list[WorkerProc] = []
        self.names: dict[int, str] = {}
        self.stopped: set[int] = set()
        self.killed: set[int] = set()
        self.events: list[str] = []
        self.t0 = time.monotonic()
        self.stats: Counter[str] = Counter()
        self.extra: dict[str, list[str]] = {}  # messages the faults sent (agent id -> ids)

    def start(self) -> WorkerProc:
        name = "ABCDEFGHIJ"[len(self.workers)]
        w = start_worker(
            self.url, self.defs, self.tmp / f"{name}.log", *FLEET_FAST, "--capacity", str(self.n)
        )
        self.workers.append(w)
        self.names[w.pid] = name
        return w

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:6.2f}s {what}")

    def live(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.pid not in self.stopped and w.pid not in self.killed]

    def by_pid(self, pid: int) -> WorkerProc | None:
        return next((w for w in self.workers if w.pid == pid), None)

    def stop(self, w: WorkerProc, seconds: float, why: str, kind: str) -> None:
        if w.pid in self.stopped or w.pid in self.killed:
            return
        w.signal(signal.SIGSTOP)
        self.stopped.add(w.pid)
        self.stats["stops"] += 1
        self.stats[f"fault {kind}"] += 1
        self.note(f"SIGSTOP {self.names[w.pid]} ({why}) for {seconds}s")
        asyncio.get_running_loop().call_later(seconds, self.cont, w)

    def cont(self, w: WorkerProc) -> None:
        if w.pid in self.stopped:
            self.stopped.discard(w.pid)
            w.signal(signal.SIGCONT)
            self.note(f"SIGCONT {self.names[w.pid]}")

    def kill(self, w: WorkerProc) -> None:
        w.signal(signal.SIGKILL)
        w.proc.wait(10)
        self.killed.add(w.pid)
        self.stopped.discard(w.pid)
        self.stats["kills"] += 1
        self.note(f"SIGKILL {self.names[w.pid]}")

    def tool_log(self) -> list[list[str]]:
        return _tool_log(self.defs)


async def _next_start(fleet: _Fleet, since: int, match: Any, timeout: float) -> list[str] | None:
    """The first tool start line after line `since` for which `match(line, earlier lines)` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = fleet.tool_log()
        for i in range(since, len(log)):
            if match(log[i], log[:i]):
                return log[i]
        since = max(since, len(log))
        await asyncio.sleep(0.01)
    return None


async def _fault(
    fleet: _Fleet, client: stead.AgentSystem, kind: str, seconds: float, cluster: str | None
) -> None:
    since = len(fleet.tool_log())
    live = {w.pid for w in fleet.live()}

    def in_live(line: list[str], flag: str) -> bool:
        return line[4] == flag and int(line[2]) in {w.pid for w in fleet.live()}

    if kind.startswith("stop_") and kind[5:] in CHAOS_FLAGS:
        flag = kind[5:]
        line = await _next_start(fleet, since, lambda ln, _: in_live(ln, flag), 20)
        w = fleet.by_pid(int(line[2])) if line else None
        if w is not None:
            fleet.stop(w, seconds, f"inside {flag} tool {line[1]}", kind)  # type: ignore[index]
    elif kind in ("frozen_wakeup", "stop_rerun"):
        if kind == "frozen_wakeup":
            # its own long call (6 s): the woken worker comes back while the new owner's re-run works
            durable = [i for i in range(fleet.n) if CHAOS_FLAGS[i % 4] == "durable"]
            aid = f"ag{random.Random(since).choice(durable):03d}"
            mid = f"fw{sum(len(ids) for ids in fleet.extra.values())}"  # unique per scenario
            fleet.extra.setdefault(aid, []).append(mid)
            with contextlib.suppress(stead.StoreError):
                await (await client.get(aid)).send(f"{mid} ms=6000", id=mid)
            line = await _next_start(
                fleet, since, lambda ln, _: in_live(ln, "durable") and ln[5] == aid and int(ln[6]) == 6000, 30
            )
            if line is None:
                return
            frozen = fleet.by_pid(int(line[2]))
            assert frozen is not None
            fleet.stop(frozen, 60, f"inside durable tool {line[1]}, until its re-run starts", kind)
            cid = line[1]
            rerun = await _next_start(
                fleet, since, lambda ln, _: ln[1] == cid and int(ln[2]) != frozen.pid, 20
            )
            fleet.note(f"re-run of {cid} by {fleet.names.get(int(rerun[2]), '?') if rerun else 'nobody'}")
            fleet.stats["frozen_wakeups"] += rerun is not None
            fleet.cont(frozen)
        else:

            def rerun_of(ln: list[str], earlier: list[list[str]]) -> bool:
                return int(ln[2]) in live and any(e[1] == ln[1] and e[2] != ln[2] for e in earlier)

            line = await _next_start(fleet, 0, rerun_of, 20)
            w = fleet.by_pid(int(line[2])) if line else None
            if w is not None:
                fleet.stop(w, seconds, f"re-running {line[1]}", kind)  # type: ignore[index]
    elif kind == "stop_awaiting":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(stead.StoreError):
                pending = await client.approvals()
                owners = {str(a): str(o) for a, o in query(fleet.url, "SELECT id, owner FROM agents")}
                for ap in pending:
                    w = next((w for w in fleet.live() if w.worker_id == owners.get(ap.agent_id)), None)
                    if w is not None:
                        fleet.stop(
                            w, seconds, f"owner of {ap.agent_id} awaiting approval of {ap.call_id}", kind
                        )
                        return
            await asyncio.sleep(0.02)
    elif kind == "stop_any":
        if fleet.live():
            w = random.Random(f"{seconds}{len(fleet.events)}").choice(fleet.live())
            fleet.stop(w, seconds, "at a random moment", kind)
    elif kind == "kill":
        if len(fleet.live()) > 1:
            fleet.kill(random.Random(len(fleet.events)).choice(fleet.live()))
            w = await asyncio.to_thread(_start_outside_restarts, fleet)
            fleet.note(f"started {fleet.names[w.pid]}")
    elif kind == RESTART and cluster is not None:
        version, name = cluster.split("/", 1)
        cmd = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart", "-m", "fast"]
        fleet.note(f"restarting PostgreSQL {cluster}")
        done = await asyncio.to_thread(_restart, cmd)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()}")
        fleet.stats["pg_restarts"] += 1
        fleet.note("PostgreSQL is back")


RUN_TIMEOUT = 180.0
AWAITING_GRACE = 3.0
"""How long a client's `agent.run()` may keep waiting while the agent has a call held for approval
before the client calls it a violation (it should return `awaiting_input`) and decides anyway."""


async def _decide(client: stead.AgentSystem, agent: stead.Agent) -> None:
    for ap in await agent.approvals():
        if approves_call(ap.call_id):
            await client.approve(ap.id, note="chaos")
        else:
            await client.reject(ap.id, note="chaos")


async def _run_deciding(
    agent: stead.Agent, client: stead.AgentSystem, text: str, mid: str, violations: list[str]
) -> stead.RunResult:
    """`agent.run(text, id=mid)`; while it waits and the agent has a call held for approval for longer
    than AWAITING_GRACE, that is a violation (run() returns `awaiting_input` then), and the held calls are
    decided so that the workload goes on."""
    run = asyncio.ensure_future(agent.run(text, id=mid))
    deadline = time.monotonic() + RUN_TIMEOUT
    held_since: float | None = None
    reported = False
    try:
        while True:
            done, _ = await asyncio.wait({run}, timeout=0.1)
            if done:
                return run.result()
            if time.monotonic() > deadline:
                raise TimeoutError
            try:
                held = await agent.approvals()
            except stead.StoreError:
                continue
            if not held:
                held_since = None
                continue
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > AWAITING_GRACE:
                if not reported:
                    reported = True
                    violations.append(
                        f"{agent.id} run {mid}: agent.run() of a client did not return awaiting_input while "
                        f"call(s) {[a.call_id for a in held]} waited for approval ({AWAITING_GRACE} s)"
                    )
                with contextlib.suppress(stead.StoreError):
                    await _decide(client, agent)
                held_since = None
    finally:
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run


async def _chaos_client(
    client: stead.AgentSystem,
    runs: list[tuple[int, str, int]],
    results: dict[str, stead.RunResult],
    violations: list[str],
    stats: Counter[str],
) -> None:
    """Runs `agent.run()` for each message, one after the other (several clients run concurrently):
    decides held calls and runs again with the same id; a store error (a PostgreSQL restart) is answered
    by running again with the same id (A3: nothing is sent twice); a `RunNotFound` is a violation."""
    for a, mid, ms in runs:
        aid = f"ag{a:03d}"
        text = f"{mid} ms={ms}"
        for _ in range(40):
            try:
                agent = await client.get(aid)
                res = await _run_deciding(agent, client, text, mid, violations)
            except stead.RunNotFound as e:
                violations.append(f"{aid} run {mid}: RunNotFound: {e}")
                break
            except stead.StoreError as e:
                stats["client_store_errors"] += 1
                stats[f"client_error {type(e).__name__}"] += 1
                await asyncio.sleep(0.3)
                continue
            except TimeoutError:
                violations.append(f"{aid} run {mid}: agent.run() did not return within {RUN_TIMEOUT} s")
                break
            if res.outcome == stead.Outcome.AWAITING_INPUT:
                stats["awaiting_input"] += 1
                with contextlib.suppress(stead.StoreError):
                    await _decide(client, agent)
                continue
            results[mid] = res
            # its own run: the one that consumed the message (a one-at-a-time run also consumes the
            # messages queued meanwhile, one per turn; its text is then the last one's answer)
            if res.message_id != mid or not any(m.id == mid for m in res.messages) or not res.ok:
                violations.append(
                    f"{aid} run {mid}: not its own run's result: message {res.message_id}, outcome "
                    f"{res.outcome}, messages {[m.id for m in res.messages if m.id]}, text {res.text!r}"
                )
            break
        else:
            violations.append(f"{aid} run {mid}: no result after 40 attempts")


def run_fleet_chaos(
    tmp_path: Path, seed: int, *, admin: str | None = None, cluster: str | None = None
) -> FleetChaosResult:
    """One seed of the fleet chaos mode (docs/chaos.md): three `stead worker`s, clients calling
    `agent.run()` concurrently, seeded faults (SIGSTOP/SIGCONT inside tools, during re-runs and approvals,
    a SIGKILL, PostgreSQL restarts of `cluster` — "15/chaos" — when given); then the invariants."""
    t0 = time.monotonic()
    plan = make_fleet_plan(seed, restarts=cluster is not None)
    defs = write_chaos_definitions(tmp_path / "defs")
    violations: list[str] = []
    results: dict[str, stead.RunResult] = {}
    with fresh_database(admin, options=IDLE_TX_TIMEOUT) as url:
        fleet = _Fleet(url, defs, tmp_path, plan.n)
        try:
            for _ in range(3):
                fleet.start()

            async def main() -> None:
                async with stead.open(url, definitions=defs, run_agents=False) as client:
                    for i in range(plan.n):
                        await client.create(definition=f"chaos_{CHAOS_FLAGS[i % 4]}", agent_id=f"ag{i:03d}")
                    clients = [
                        asyncio.ensure_future(_chaos_client(client, runs, results, violations, fleet.stats))
                        for runs in plan.tasks
                    ]

                    async def fault(kind: str, arm: float, seconds: float) -> None:
                        await asyncio.sleep(arm)
                        await _fault(fleet, client, kind, seconds, cluster)

                    chaos = asyncio.ensure_future(asyncio.gather(*(fault(*f) for f in plan.faults)))
                    await asyncio.gather(*clients)
                    if not chaos.done():
                        fleet.note("workload done: the remaining faults are skipped")
                    chaos.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await chaos
                    for w in list(fleet.workers):
                        fleet.cont(w)

                    async def settled() -> bool:
                        # calls left held by a client that gave up (a violation already) are decided here
                        with contextlib.suppress(stead.StoreError):
                            for ap in await client.approvals():
                                await _decide(client, await client.get(ap.agent_id))
                        sql = "SELECT count(*) FROM kv WHERE key = 'pending' OR key LIKE 'q.%%'"
                        return query(url, sql)[0][0] == 0

                    try:
                        await eventually(settled, 90, "every agent to settle")
                    except AssertionError as e:
                        violations.append(str(e))

            asyncio.run(main())
            for w in fleet.workers:
                if w.pid not in fleet.killed:
                    code = w.stop()
                    if code != 0:
                        violations.append(f"worker {fleet.names[w.pid]} exited {code}: {w.text()[-1500:]}")
        finally:
            for w in fleet.workers:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait(10)
        violations += _check_chaos(url, defs, plan, results, fleet)
    fleet.stats["runs"] = len(results)
    return FleetChaosResult(seed, violations, time.monotonic() - t0, fleet.stats, fleet.events)


def _check_chaos(
    url: str, defs: Path, plan: FleetPlan, results: dict[str, stead.RunResult], fleet: _Fleet
) -> list[str]:
    out: list[str] = []
    history = _history(url)
    log = _tool_log(defs)
    starts = Counter(cid for _, cid, *_ in log)
    fx = {r[0][3:] for r in query(url, "SELECT key FROM kv WHERE key LIKE 'fx.%%'")}
    left = query(
        url, "SELECT agent_id, key FROM kv WHERE key = 'pending' OR key LIKE 'q.%%' OR key LIKE 'tool.%%'"
    )
    if left:
        out.append(f"not settled: {left}")
    sent: dict[str, list[str]] = {}
    for runs in plan.tasks:
        for a, mid, _ms in runs:
            sent.setdefault(f"ag{a:03d}", []).append(mid)
    for aid, mids in fleet.extra.items():
        sent.setdefault(aid, []).extend(mids)
    fleet.stats["reruns"] = sum(n - 1 for n in starts.values() if n > 1)
    for i in range(plan.n):
        aid = f"ag{i:03d}"
        flag = CHAOS_FLAGS[i % 4]
        rows = history.get(aid, [])
        epochs = [e for _, e, _ in rows]
        if epochs != sorted(epochs):
            out.append(f"{aid}: history epochs decrease along seq: {epochs}")
        ends = Counter(r["run"] for _, _, r in rows if r.get("k") == "e")
        if any(v != 1 for v in ends.values()):
            out.append(f"{aid}: settlements per run {dict(ends)}")
        run_of = {r["id"]: r.get("run") for _, _, r in rows if r.get("k") == "u"}
        users = Counter(r["id"] for _, _, r in rows if r.get("k") == "u")
        if users != Counter(sent.get(aid, [])):
            out.append(f"{aid}: messages in history {dict(users)} != sent {sent.get(aid, [])}")
        for mid, res in results.items():
            if mid in run_of and res.run_id != run_of[mid]:
                out.append(
                    f"{aid}: run() for {mid} returned run {res.run_id}, the message is in {run_of[mid]}"
                )
        calls = [r["b"]["i"] for _, _, r in rows if r.get("k") == "b" and r["b"].get("t") == "c"]
        res_blocks = [r["b"] for _, _, r in rows if r.get("k") == "t"]
        if Counter(b["i"] for b in res_blocks) != Counter(calls):
            out.append(f"{aid}: calls {calls} and results {[b['i'] for b in res_blocks]} do not pair up")
        for b in res_blocks:
            cid, output, n = b["i"], str(b["o"]), starts[b["i"]]
            fleet.stats["in_doubt"] += output == IN_DOUBT_TEXT
            if flag in ("default", "gated") and n > 1:
                out.append(f"{aid}: the {flag} tool of {cid} ran {n} times")
            if flag in ("default", "gated") and output.startswith(f"{flag}:") and n != 1:
                out.append(f"{aid}: {cid} answered {output!r} but its tool ran {n} times")
            if flag == "gated" and not output.startswith("gated:") and output != IN_DOUBT_TEXT and n:
                out.append(f"{aid}: {cid} was never approved ({output!r}) but its tool ran")
            if flag == "durable" and not (output.startswith("durable:") and n >= 1):
                out.append(f"{aid}: durable call {cid} answered {output!r} after {n} runs")
            if flag == "tx" and (cid in fx) != output.startswith("tx:"):
                out.append(
                    f"{aid}: transactional call {cid} answered {output!r}, effect committed: {cid in fx}"
                )
    requests = read_requests(sorted(defs.glob("requests-*.jsonl")))
    fleet.stats["requests_checked"] = len(requests)
    if not requests:
        out.append("no provider request was logged")
    out += check_requests(requests, stored_pg(url), frozenset({"work_gated"}))
    for w in fleet.workers:
        text = w.text()
        if "Traceback" in text:
            out.append(
                f"worker {fleet.names[w.pid]} logged a traceback: {text[text.index('Traceback') :][:1500]}"
            )
    return out
