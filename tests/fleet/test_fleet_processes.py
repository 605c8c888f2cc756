"""The decisive multi-process test of a PostgreSQL fleet (docs/postgres.md, reference §1.6).

Three real `stead worker` processes (A, B started at once on a fresh database: their migrations must not
race; C later) and a separate client. The client creates agents of three definitions — one tool each: a
default (at most once), a `durable` and a `transactional` one — and sends three messages to each (mixed
send/steer, client ids, one repeated). Every tool logs call id, pid and epoch before acting. A and B block
inside their tools (B's transactional tools inside their transaction, holding the agent's row lock); A is
SIGKILLed, B SIGSTOPped; once C owns every agent and has finished, B is continued and its tools released.
Every provider request any worker made is checked against the store (tests/chaos/requests.py).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

import stead
from tests.fakes import Reply
from tests.fakes.fleet import (
    eventually,
    fresh_database,
    pg_available,
    query,
    run_fleet_chaos,
    run_fleet_scenario,
    start_worker,
)
from tests.fakes.openai_server import OpenAIFakeServer

pytestmark = pytest.mark.skipif(not pg_available(), reason="no PostgreSQL server (tests/fakes/fleet.py)")
CI_FLEET_SEED = 3
REPLAY = f"python scripts/chaos.py --pg-fleet --seed {CI_FLEET_SEED}"


@pytest.mark.timeout(300)
def test_W2_fleet_kill_and_stop_workers_lose_nothing_and_admit_no_zombie_write(tmp_path: Path) -> None:
    run_fleet_scenario(tmp_path, 12)


@pytest.mark.timeout(600)
def test_W2_fleet_of_sixty_agents_kill_and_stop_lose_nothing(tmp_path: Path) -> None:
    run_fleet_scenario(tmp_path, 60)


# ---------------------------------------------------------------------------- a frozen owner wakes up
FROZEN_TOOLS = '''
import asyncio, os
from pathlib import Path
import stead

HERE = Path(__file__).resolve().parent


def _log(line):
    fd = os.open(HERE / "tools.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@stead.tool(durable=True)
async def work_slow(ctx: stead.ToolContext, tag: str) -> str:
    """Slow work (at least once): runs until the test creates `release-<pid>`, and answers with its pid and
    the epoch of the lease it ran under. If that file says `after-loss <epoch>`, a run under that epoch
    returns only once its process no longer holds that lease, and outlives a cancellation meanwhile: the
    way a loop goes on when asyncio loses a cancel (Python 3.11's wait_for, under psycopg_pool's wait for
    a connection, drops a cancel that arrives with its result)."""
    epoch = ctx.store.held().get(ctx.agent_id, -1)
    _log(f"start {ctx.call_id} {os.getpid()} {epoch}")
    (HERE / f"blocked-{os.getpid()}").write_text("1")
    release = HERE / f"release-{os.getpid()}"
    while True:
        try:
            while not release.exists():
                await asyncio.sleep(0.02)
            if release.read_text() == f"after-loss {epoch}":
                while ctx.store.held().get(ctx.agent_id) == epoch:
                    await asyncio.sleep(0.02)
            break
        except asyncio.CancelledError:
            _log(f"cancelled {ctx.call_id} {os.getpid()} {epoch}")
    _log(f"end {ctx.call_id} {os.getpid()} {epoch}")
    return f"durable:{tag}:{os.getpid()}:{epoch}"
'''

FROZEN_AGENT = """name: frozen
instructions: test agent
model: openai-compatible:fake-model@%s
tools:
  - tools.py:work_slow
"""

FROZEN_FLEET = ("--lease-ttl", "4", "--heartbeat", "0.3", "--sweep", "0.5", "--poll", "0.5")
"""A short TTL for CI, long enough that a loaded machine does not evict the live worker by mistake."""


def _frozen_model(body: Any) -> Reply:
    """The model: a call of `work_slow` for the user's message, then an answer quoting the last result."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply([stead.Text(f"durable result: {messages[-1]['content']}")])
    return Reply([stead.ToolCall("work_slow", {"tag": "t"})])


def _lease(url: str) -> tuple[str | None, int]:
    owner, epoch = query(url, "SELECT owner, epoch FROM agents WHERE id = 'frozen-1'")[0]
    return (None if owner is None else str(owner), int(epoch))


def _rows(url: str) -> list[tuple[int, int, dict[str, Any]]]:
    sql = "SELECT seq, epoch, record FROM history WHERE agent_id = 'frozen-1' ORDER BY seq"
    return [(int(seq), int(epoch), json.loads(rec)) for seq, epoch, rec in query(url, sql)]


def _check_requests(bodies: list[Any], committed: str) -> None:
    """Every provider request answers each of its tool calls, in order, and the one after the call carries
    exactly the committed result."""
    for body in bodies:
        messages = body["messages"]
        calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert answers == calls, f"a tool call without its result in a model request: {messages}"
    assert [[m["content"] for m in b["messages"] if m["role"] == "tool"] for b in bodies] == [[], [committed]]


@pytest.mark.timeout(120)
async def test_W6_a_frozen_owner_that_wakes_during_the_re_run_commits_nothing_and_the_model_sees_the_result(
    tmp_path: Path,
) -> None:
    """Issue 20 item 1, with real `stead worker` processes: A runs a durable tool and is SIGSTOPped inside
    it; after the lease TTL B takes the agent over and runs the tool again (same call id); A is continued
    while B's run is still going, and A's run returns once A has found itself evicted (its loop outlived
    the lease). A commits nothing after the steal, and the model request after the take-over carries
    exactly the result that was committed (the fake model records every request)."""
    server = OpenAIFakeServer()
    server.responder = _frozen_model
    await server.start()
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "tools.py").write_text(FROZEN_TOOLS)
    (defs / "frozen.yaml").write_text(FROZEN_AGENT % server.base_url)
    a = b = None
    try:
        with fresh_database() as url:
            a = start_worker(url, defs, tmp_path / "a.log", *FROZEN_FLEET)
            async with stead.open(url, definitions=defs, run_agents=False) as client:
                agent = await client.create(definition="frozen", agent_id="frozen-1")
                assert (await agent.send("go", id="frozen-m1")).created
            await eventually(lambda: (defs / f"blocked-{a.pid}").exists(), 30, "A inside the tool")
            a_epoch = _lease(url)[1]
            a.signal(signal.SIGSTOP)
            b = start_worker(url, defs, tmp_path / "b.log", *FROZEN_FLEET)
            bpid = b.pid
            await eventually(lambda: (defs / f"blocked-{bpid}").exists(), 30, "B running the tool again")
            stolen_lease = _lease(url)
            assert stolen_lease[0] == b.worker_id and stolen_lease[1] > a_epoch
            stolen = _rows(url)  # what B found: the user message and the call, no result
            assert [r["k"] for _, _, r in stolen] == ["u", "b"]
            # A wakes up while B's run is still going; A's run returns once A has lost the lease
            (defs / f"release-{a.pid}").write_text(f"after-loss {a_epoch}")
            a.signal(signal.SIGCONT)
            await eventually(lambda: "registered" in a.text(), 30, "A to find itself evicted")
            await eventually(lambda: "end " in (defs / "tools.log").read_text(), 30, "A's run to return")
            # then A's loop stops at its result commit (a second lease-lost line), or it wrote something
            await eventually(
                lambda: a.text().count("lease-lost") >= 2 or _rows(url) != stolen, 30, "A's loop to stop"
            )
            if _lease(url) == stolen_lease:  # (unless the loaded machine moved the agent on meanwhile)
                assert _rows(url) == stolen, "the woken worker committed after its lease was taken"
            (defs / f"release-{bpid}").write_text("go")

            def settled() -> bool:
                return not query(url, "SELECT 1 FROM kv WHERE agent_id = 'frozen-1' AND key = 'pending'")

            await eventually(settled, 30, "the run to end")
            rows = _rows(url)
            (call,) = [r["b"] for _, _, r in rows if r["k"] == "b" and r["b"]["t"] == "c"]
            ((epoch, result),) = [(e, r["b"]) for _, e, r in rows if r["k"] == "t"]
            pid, ran_under = (int(x) for x in result["o"].split(":")[2:])
            assert result["i"] == call["i"]
            # committed under the lease its run held, never by the run that outlived its lease
            assert ran_under == epoch and (pid, ran_under) != (a.pid, a_epoch)
            assert rows[-2][2]["b"] == {"t": "x", "x": f"durable result: {result['o']}"}
            _check_requests([r.body for r in server.requests], result["o"])
            log = [line.split() for line in (defs / "tools.log").read_text().splitlines()]
            assert [x for x in log if x[0] == "end" and int(x[2]) == a.pid][:1] == [
                ["end", call["i"], str(a.pid), str(a_epoch)]
            ]  # A's own run did return (and its result was refused)
            assert a.stop() == 0 and b.stop() == 0
    except BaseException:
        for w in (a, b):
            if w is not None:
                print(f"--- worker {w.pid}\n{w.text()}")
        raise
    finally:
        for w in (a, b):
            if w is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(10)
        await server.close()


@pytest.mark.timeout(600)
def test_W2_fleet_chaos_seed_concurrent_runs_stops_and_approvals(tmp_path: Path) -> None:
    """One seed of `scripts/chaos.py --pg-fleet`'s chaos scenario (no PostgreSQL restart: CI has only the
    shared cluster): concurrent client `agent.run()`s, seeded SIGSTOP/SIGCONT inside tools, during re-runs
    and approvals, every provider request checked against the store (tests/fakes/fleet.py)."""
    result = run_fleet_chaos(tmp_path, CI_FLEET_SEED)
    assert result.ok, "\n".join([*result.violations, *result.events, f"replay: {REPLAY}"])
    assert result.stats["stops"] > 0 and result.stats["requests_checked"] > 0
