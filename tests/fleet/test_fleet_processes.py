"""The decisive multi-process test of a PostgreSQL fleet (docs/postgres.md, reference §1.6).

Three real `stead worker` processes (A, B started at once on a fresh database: their migrations must not
race; C later) and a separate client. The client creates agents of three definitions — one tool each: a
default (at most once), a `durable` and a `transactional` one — and sends three messages to each (mixed
send/steer, client ids, one repeated). Every tool logs call id, pid and epoch before acting. A and B block
inside their tools (B's transactional tools inside their transaction, holding the agent's row lock); A is
SIGKILLed, B SIGSTOPped; once C owns every agent and has finished, B is continued and its tools released.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import pytest

import stead
from stead.core.batch import IN_DOUBT_TEXT
from tests.fakes.fleet import (
    FLAGS,
    fresh_database,
    pg_available,
    query,
    start_worker,
    wait_for,
    write_definitions,
)

pytestmark = pytest.mark.skipif(
    not pg_available(), reason="PostgreSQL is not reachable (tests/fakes/fleet.py)"
)

FAST = ("--lease-ttl", "2", "--heartbeat", "0.5", "--sweep", "0.5", "--poll", "0.5")


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


def _run_fleet(tmp_path: Path, n: int) -> None:
    defs = write_definitions(tmp_path / "defs")
    # a worker stopped inside a transaction keeps its row locks until PostgreSQL ends its session
    with fresh_database(options="-cidle_in_transaction_session_timeout%3D2000") as url:
        cap = str(n // 2)
        a = start_worker(url, defs, tmp_path / "a.log", *FAST, "--capacity", cap)
        b = start_worker(url, defs, tmp_path / "b.log", *FAST, "--capacity", cap)
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
            tx_agent = sorted(x for x in b_agents if FLAGS[int(x[2:]) % 3] == "tx")[0]
            (defs / f"holdtx-{b.pid}").write_text("1")
            accepted[tx_agent].append(asyncio.run(_send_one(url, defs, tx_agent, f"{tx_agent}-m3")))
            wait_for(lambda: (defs / f"blockedtx-{b.pid}").exists(), 30, "B blocked inside a transaction")
            a.signal(signal.SIGKILL)
            b.signal(signal.SIGSTOP)
            a.proc.wait(10)
            c = start_worker(url, defs, tmp_path / "c.log", *FAST, "--capacity", str(n))

            def done() -> bool:
                left = query(url, "SELECT count(*) FROM kv WHERE key = 'pending' OR key LIKE 'q.%%'")[0][0]
                owners = {str(o) for (o,) in query(url, "SELECT owner FROM agents")}
                return left == 0 and owners <= {c.worker_id, "None"}

            wait_for(done, 90, "C to take over and finish every agent")
            before = _history(url)
            # B comes back: its tools return, every write it tries is fenced
            b.signal(signal.SIGCONT)
            (defs / f"hold-{b.pid}").unlink()
            (defs / f"holdtx-{b.pid}").unlink()
            wait_for(lambda: "lease-lost" in b.text(), 30, "B to log LeaseLost")
            wait_for(lambda: "registered" in b.text(), 30, "B to re-register under a new id")
            assert b.stop() == 0
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


@pytest.mark.timeout(300)
def test_W2_fleet_kill_and_stop_workers_lose_nothing_and_admit_no_zombie_write(tmp_path: Path) -> None:
    _run_fleet(tmp_path, 12)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_W2_fleet_of_sixty_agents_kill_and_stop_lose_nothing(tmp_path: Path) -> None:
    _run_fleet(tmp_path, 60)
