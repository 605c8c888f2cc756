"""PostgreSQL benchmarks: the store and the fleet of workers (docs/benchmarks.md, "PostgreSQL").

    python bench/pg_bench.py loop      [--n 200 --k 5]    tool loop on PG (Unix socket, TCP) vs SQLite FULL
    python bench/pg_bench.py accept    [--messages 4000]  acceptances/s, 1/10/100 senders, 1 and 3 processes
                                   [--floor]          ... and one INSERT commit per message, same senders
    python bench/pg_bench.py wake      [--n 200]          accept commit -> turn start (client -> worker)
    python bench/pg_bench.py failover  [--repeats 5]      SIGKILL owner -> new owner's first commit (defaults)
    python bench/pg_bench.py zombie                       SIGSTOP/SIGCONT owner: writes accepted after steal
    python bench/pg_bench.py fleet     [--agents 60]      runs/s with 1, 2 and 3 workers

Each prints JSON lines. Every run uses a fresh database created on the local server
(`STEAD_TEST_PG_ADMIN`, default `postgresql://postgres@127.0.0.1:5432/postgres`) and drops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

import stead
from stead.core.fleet import FleetConfig
from stead.providers.scripted import ScriptedProvider
from stead.store.postgres import parse_postgres_url

ADMIN = os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
SOCKET_DIR = "/var/run/postgresql"
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def database(transport: str = "tcp", **params: str) -> Iterator[str]:
    name = "stead_bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    query = dict(params)
    if transport == "unix":
        base = f"postgresql://postgres@/{name}"
        query["host"] = SOCKET_DIR
    else:
        base = ADMIN.rsplit("/", 1)[0] + f"/{name}"
    q = "&".join(f"{k}={v}" for k, v in query.items())
    try:
        yield base + (f"?{q}" if q else "")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# ---------------------------------------------------------------------------------------------- loop
async def _loop(url: str, n: int, k: int) -> dict[str, Any]:
    inside = [0.0]
    perf = time.perf_counter

    @stead.tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        t0 = perf()
        out = a + b
        inside[0] += perf() - t0
        return out

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        t0 = perf()
        rounds = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            if m.role == "tool":
                rounds += 1
        out: list[stead.Block] = (
            [stead.ToolCall("add", {"a": rounds, "b": 1})] if rounds < k else [stead.Text(f"{k}.")]
        )
        inside[0] += perf() - t0
        return out

    system = await stead.open(url, providers={"scripted": ScriptedProvider(respond)}, tools=[add])
    agents = [await system.create(provider="scripted", model="scripted", tools=["add"]) for _ in range(n)]
    store: Any = system.store
    stats = getattr(store, "stats", None)
    c0 = store.commits
    r0 = stats.round_trips if stats is not None else 0
    t0 = perf()
    for i, agent in enumerate(agents):
        await agent.send(f"Please add things up ({i}).")
        await agent.wait_idle()
    wall = perf() - t0
    commits = store.commits - c0
    trips = (stats.round_trips - r0) if stats is not None else None
    await system.close()
    out = {
        "overhead_us_per_response": round((wall - inside[0]) / (n * (k + 1)) * 1e6, 1),
        "commits_per_conversation": commits / n,
        "wall_s": round(wall, 3),
    }
    if trips is not None:
        out["round_trips_per_commit"] = round(trips / commits, 2)
    return out


def cmd_loop(args: argparse.Namespace) -> None:
    rounds: dict[str, list[dict[str, Any]]] = {"sqlite-full": [], "pg-unix": [], "pg-tcp": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(_loop(f"sqlite:///{tmp}/w.db?synchronous=full", 5, args.k))
            rounds["sqlite-full"].append(
                asyncio.run(_loop(f"sqlite:///{tmp}/b.db?synchronous=full", args.n, args.k))
            )
        for transport in ("unix", "tcp"):
            with database(transport) as url:
                asyncio.run(_loop(url, 5, args.k))  # warm-up on the same database
                rounds[f"pg-{transport}"].append(asyncio.run(_loop(url, args.n, args.k)))
    base = min(r["overhead_us_per_response"] for r in rounds["sqlite-full"])
    for variant, rs in rounds.items():
        best = min(rs, key=lambda r: r["overhead_us_per_response"])
        med = statistics.median(r["overhead_us_per_response"] for r in rs)
        print(
            json.dumps(
                {
                    "bench": "loop",
                    "variant": variant,
                    "n": args.n,
                    "k": args.k,
                    "best": best,
                    "median_overhead_us": med,
                    "vs_sqlite_full": round(best["overhead_us_per_response"] / base, 2),
                }
            )
        )


# -------------------------------------------------------------------------------------------- accept
ACCEPTOR = r"""
import asyncio, contextlib, json, os, sys, time

@contextlib.asynccontextmanager
async def stead_sender(url, agents):
    import stead
    from stead.providers.scripted import ScriptedProvider

    async with stead.open(url, run_agents=False, records=False,
                          providers={"scripted": ScriptedProvider(lambda r: [])}) as client:
        handles = [await client.get(f"acc{i}") for i in range(agents)]

        async def send(agent, message_id):
            await handles[agent].send("m", id=message_id)

        yield send

@contextlib.asynccontextmanager
async def floor_sender(url, agents):
    # the floor: the same pool size, each message one INSERT committed on its own (autocommit)
    from psycopg_pool import AsyncConnectionPool
    from stead.store.postgres import parse_postgres_url

    conninfo, options = parse_postgres_url(url)
    async with AsyncConnectionPool(conninfo, min_size=int(options.get("pool_min", 2)),
                                   max_size=int(options.get("pool_max", 10)),
                                   kwargs={"autocommit": True}, open=False) as pool:
        async def send(agent, message_id):
            async with pool.connection() as conn:
                await conn.execute("INSERT INTO floor_msg (id, agent, body) VALUES (%s, %s, %s)",
                                   (message_id, f"acc{agent}", "m"))

        yield send

async def main(kind, url, senders, messages, agents, tag, go):
    async with (stead_sender if kind == "stead" else floor_sender)(url, agents) as send:
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.001)
        lat = []
        per = messages // senders
        async def sender(s):
            for j in range(per):
                t0 = time.perf_counter()
                await send((s * 7919 + j) % agents, f"{tag}-{s}-{j}")
                lat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(sender(s) for s in range(senders)))
        wall = time.perf_counter() - t0
        print(json.dumps({"n": per * senders, "wall": wall, "lat": sorted(lat)}), flush=True)

a = sys.argv
asyncio.run(main(a[1], a[2], int(a[3]), int(a[4]), int(a[5]), a[6], a[7]))
"""
"""One accepting process: `stead` sends through `Agent.send` (a client system, `run_agents=False`); `floor`
is the floor of acceptance — the same senders and pool size, each message one `INSERT` committed on its own
(no idempotency check, no queue, no activation): what a database round trip per message costs."""


def _run_acceptors(kind: str, url: str, procs: int, senders: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    ACCEPTOR,
                    kind,
                    url,
                    str(senders),
                    str(args.messages),
                    str(args.agents),
                    f"p{p}",
                    str(go),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for p in range(procs)
        ]
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        go.write_text("go")
        results = [json.loads(c.communicate(timeout=600)[0].strip().splitlines()[-1]) for c in children]
    total = sum(r["n"] for r in results)
    wall = max(r["wall"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    return {
        "accepted": total,
        "per_s_total": round(total / wall),
        "per_s_per_process": round(total / wall / procs),
        "p50_ms": round(pct(lat, 50) * 1e3, 2),
        "p99_ms": round(pct(lat, 99) * 1e3, 2),
    }


async def _setup_agents(url: str, n: int) -> None:
    async with stead.open(
        url, run_agents=False, records=False, providers={"scripted": ScriptedProvider(lambda r: [])}
    ) as client:
        for i in range(n):
            await client.create(provider="scripted", agent_id=f"acc{i}")


def cmd_accept(args: argparse.Namespace) -> None:
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    for procs, senders in configs:
        with database("unix", pool_max="4") as url:
            asyncio.run(_setup_agents(url, args.agents))
            result = _run_acceptors("stead", url, procs, senders, args)
            line: dict[str, Any] = {
                "bench": "accept",
                "processes": procs,
                "senders_per_process": senders,
                **result,
            }
            if args.floor:
                with psycopg.connect(parse_postgres_url(url)[0], autocommit=True) as conn:
                    conn.execute(
                        "CREATE TABLE floor_msg (id text PRIMARY KEY, agent text NOT NULL, body text)"
                    )
                floor = _run_acceptors("floor", url, procs, senders, args)
                line["floor"] = floor
                line["vs_floor"] = round(result["per_s_total"] / floor["per_s_total"], 2)
            print(json.dumps(line), flush=True)


# ---------------------------------------------------------------------------------------------- wake
async def _wake(url: str, n: int) -> list[float]:
    started: dict[str, float] = {}

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        last = next(m for m in reversed(request.messages) if m.role == "user")
        text = last.content[0].text  # type: ignore[union-attr]
        started.setdefault(text, time.perf_counter())
        return [stead.Text("ok")]

    providers = {"scripted": ScriptedProvider(respond)}
    lat: list[float] = []
    async with stead.open(url, providers=providers, records=False, fleet=FleetConfig(poll=30)) as worker:
        async with stead.open(url, providers=providers, records=False, run_agents=False) as client:
            agent = await client.create(provider="scripted", agent_id="wake")
            await agent.send("warm-up")
            for i in range(n):
                while await _pending(client, "wake"):  # noqa: ASYNC110 - polls the database
                    await asyncio.sleep(0.001)
                key = f"msg {i}"
                await agent.send(key)
                t_commit = time.perf_counter()  # send returns once the acceptance committed
                while key not in started:  # noqa: ASYNC110 - a busy wait keeps the measurement tight
                    await asyncio.sleep(0.0002)
                lat.append(started[key] - t_commit)
        assert worker.fleet is not None
    return lat


async def _pending(system: stead.AgentSystem, aid: str) -> bool:
    async with system.store.transaction() as tx:
        return await tx.get(aid, "pending") is not None


def cmd_wake(args: argparse.Namespace) -> None:
    for transport in ("unix", "tcp"):
        with database(transport) as url:
            lat = asyncio.run(_wake(url, args.n))
        print(
            json.dumps(
                {
                    "bench": "wake",
                    "transport": transport,
                    "n": len(lat),
                    "p50_ms": round(pct(lat, 50) * 1e3, 2),
                    "p99_ms": round(pct(lat, 99) * 1e3, 2),
                    "note": "client and worker: two systems in one process; pg_notify -> LISTEN",
                }
            )
        )


# ------------------------------------------------------------------------------------ fleet processes
def _defs(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.fakes.fleet import write_definitions

    return write_definitions(directory)


def _worker(url: str, defs: Path, log: Path, *extra: str) -> Any:
    sys.path.insert(0, str(ROOT))
    from tests.fakes.fleet import start_worker

    return start_worker(url, defs, log, *extra)


def _q(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    sys.path.insert(0, str(ROOT))
    from tests.fakes.fleet import query

    return query(url, sql, params)


async def _client_send(url: str, defs: Path, agents: list[tuple[str, str]], msg: str) -> None:
    async with stead.open(url, definitions=defs, run_agents=False, records=False) as client:
        for aid, definition in agents:
            try:
                agent = await client.get(aid)
            except stead.AgentNotFound:
                agent = await client.create(definition=definition, agent_id=aid)
            await agent.send(msg, id=f"{aid}-{msg}")


def cmd_failover(args: argparse.Namespace) -> None:
    samples = []
    for r in range(args.repeats):
        with database("unix") as url, tempfile.TemporaryDirectory() as tmp:
            defs = _defs(Path(tmp) / "defs")
            a = _worker(url, defs, Path(tmp) / "a.log")
            (defs / f"hold-{a.pid}").write_text("1")
            asyncio.run(_client_send(url, defs, [("fo", "fleet_durable")], "go"))
            while not (defs / f"blocked-{a.pid}").exists():
                time.sleep(0.01)
            b = _worker(url, defs, Path(tmp) / "b.log")
            epoch0 = _q(url, "SELECT epoch FROM agents WHERE id = 'fo'")[0][0]
            t0 = time.monotonic()
            a.signal(signal.SIGKILL if args.signal == "kill" else signal.SIGSTOP)
            while not _q(url, "SELECT 1 FROM history WHERE agent_id = 'fo' AND epoch > %s", (epoch0,)):
                time.sleep(0.01)
            samples.append(time.monotonic() - t0)
            b.stop()
            if args.signal == "stop":
                a.signal(signal.SIGKILL)
            a.proc.wait(5)
        print(
            json.dumps({"bench": "failover-sample", "round": r, "seconds": round(samples[-1], 2)}), flush=True
        )
    print(
        json.dumps(
            {
                "bench": "failover",
                "signal": args.signal,
                "defaults": "ttl 10 s, heartbeat 2 s, sweep 2 s +-20 %",
                "n": len(samples),
                "p50_s": round(pct(samples, 50), 2),
                "p99_s": round(pct(samples, 99), 2),
                "max_s": round(max(samples), 2),
            }
        )
    )


def cmd_zombie(args: argparse.Namespace) -> None:
    fast = ("--lease-ttl", "2", "--heartbeat", "0.5", "--sweep", "0.5", "--poll", "0.5")
    with database("unix") as url, tempfile.TemporaryDirectory() as tmp:
        defs = _defs(Path(tmp) / "defs")
        a = _worker(url, defs, Path(tmp) / "a.log", *fast)
        (defs / f"hold-{a.pid}").write_text("1")
        agents = [(f"z{i}", "fleet_default" if i % 2 else "fleet_durable") for i in range(args.agents)]
        asyncio.run(_client_send(url, defs, agents, "go"))
        while not (defs / f"blocked-{a.pid}").exists():
            time.sleep(0.01)
        a.signal(signal.SIGSTOP)
        b = _worker(url, defs, Path(tmp) / "b.log", *fast)
        while _q(url, "SELECT count(*) FROM kv WHERE key = 'pending'")[0][0]:
            time.sleep(0.05)
        before = _q(url, "SELECT agent_id, seq, epoch FROM history ORDER BY 1, 2")
        a.signal(signal.SIGCONT)
        (defs / f"hold-{a.pid}").unlink()
        deadline = time.monotonic() + 20
        while "lease-lost" not in a.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # let the continued worker try everything it had in flight
        after = _q(url, "SELECT agent_id, seq, epoch FROM history ORDER BY 1, 2")
        lost = a.text().count("lease-lost ")
        a.stop()
        b.stop()
    print(
        json.dumps(
            {
                "bench": "zombie",
                "agents": args.agents,
                "zombie_writes_accepted": len(set(after) - set(before)),
                "lease_lost_logged": lost,
            }
        )
    )


def cmd_fleet(args: argparse.Namespace) -> None:
    for workers in (1, 2, 3):
        with database("unix", pool_max="4") as url, tempfile.TemporaryDirectory() as tmp:
            defs = _defs(Path(tmp) / "defs")
            procs = [_worker(url, defs, Path(tmp) / f"w{i}.log") for i in range(workers)]
            agents = [(f"f{i}", "fleet_durable") for i in range(args.agents)]
            asyncio.run(_client_send(url, defs, agents, "warm"))
            while _q(url, "SELECT count(*) FROM kv WHERE key = 'pending'")[0][0]:
                time.sleep(0.02)
            t0 = time.monotonic()
            for j in range(args.rounds):
                asyncio.run(_client_send(url, defs, agents, f"r{j}"))
            while _q(url, "SELECT count(*) FROM kv WHERE key = 'pending' OR key LIKE 'q.%%'")[0][0]:
                time.sleep(0.02)
            wall = time.monotonic() - t0
            owners = _q(url, "SELECT count(DISTINCT owner) FROM agents")[0][0]
            for p in procs:
                try:
                    p.stop()
                except subprocess.TimeoutExpired:
                    p.signal(signal.SIGUSR1)
                    time.sleep(1)
                    print(p.text()[-3000:], file=sys.stderr)
                    p.proc.kill()
                    raise
        runs = args.agents * args.rounds
        print(
            json.dumps(
                {
                    "bench": "fleet",
                    "workers": workers,
                    "agents": args.agents,
                    "runs": runs,
                    "runs_per_s": round(runs / wall, 1),
                    "distinct_owners": owners,
                    "note": "each run: accept + 2 model responses + 1 durable tool call (5 commits)",
                }
            ),
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("loop")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("accept")
    p.add_argument("--messages", type=int, default=4000, help="per process")
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--configs", default="1x1,1x10,1x100,3x1,3x10,3x100", help="processes x senders, ...")
    p.add_argument("--floor", action="store_true", help="also the floor: one INSERT commit per message")
    p = sub.add_parser("wake")
    p.add_argument("--n", type=int, default=200)
    p = sub.add_parser("failover")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--signal", choices=["kill", "stop"], default="kill", help="stop: only the TTL detects it")
    p = sub.add_parser("zombie")
    p.add_argument("--agents", type=int, default=6)
    p = sub.add_parser("fleet")
    p.add_argument("--agents", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    {
        "loop": cmd_loop,
        "accept": cmd_accept,
        "wake": cmd_wake,
        "failover": cmd_failover,
        "zombie": cmd_zombie,
        "fleet": cmd_fleet,
    }[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
