"""`POST /v1/agents/{id}/messages` throughput and latency with 1, 10 and 100 concurrent clients.

The service runs in its own process (`bench/server_proc.py`: SQLite, an echo model that answers each
message at once, so every accepted message also makes a run: activation, consumption, answer, settlement;
`--held`: the model never answers, so only acceptance is measured; `--baseline`: FastAPI alone answering
the same route with a constant, the floor of the HTTP stack on this machine).
Each client is an `httpx.AsyncClient` connection posting to its own agent, one request at a time, with a
fresh message id; a request's latency is from sending it to reading the 202 (which comes after the durable
commit). Everything runs on loopback on the same 2-core machine as the server, so the client's own cost is
part of the numbers.

    python bench/server_messages.py --requests 2000 --sync normal      (one JSON line per concurrency)
    python bench/server_messages.py --requests 4000 --held --compare  (and FastAPI alone, same run: ratios)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent


def start_server(
    db: Path, sync: str, agents: int, baseline: bool = False, held: bool = False
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    args = ["--db", str(db), "--sync", sync, "--agents", str(agents)]
    args += (["--baseline"] if baseline else []) + (["--held"] if held else [])
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "server_proc.py"), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    info: dict[str, Any] = json.loads(proc.stdout.readline())
    return proc, info


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(
    base: str, agents: list[str], clients: int, total: int, pid: int | None = None
) -> dict[str, Any]:
    per = max(1, total // clients)
    latencies: list[float] = []
    # one client = one AsyncClient with one keep-alive connection: a shared pool of 100 connections costs
    # the client process work that grows with the requests waiting in it (httpcore assigns requests to
    # connections by scanning), which made the client, not the server, the limit
    https = [
        httpx.AsyncClient(
            base_url=base, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=60
        )
        for _ in range(clients)
    ]
    try:

        async def client(i: int, phase: str = "run", count: int = per) -> None:
            agent = agents[i % len(agents)]
            http = https[i]
            for n in range(count):
                t0 = time.perf_counter()
                r = await http.post(
                    f"/v1/agents/{agent}/messages", json={"content": f"hello {n}", "id": f"{phase}{i}m{n}"}
                )
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 202, r.text

        await asyncio.gather(*(client(i, "warm", 3) for i in range(clients)))  # open every connection
        latencies.clear()
        server0 = cpu_seconds(pid) if pid is not None else 0.0
        client0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - t0
        client_cpu = time.process_time() - client0
        server_cpu = cpu_seconds(pid) - server0 if pid is not None else float("nan")
    finally:
        for http in https:
            await http.aclose()
    done = len(latencies)
    return {
        "bench": "server_post_messages",
        "clients": clients,
        "requests": done,
        "per_s": round(done / wall, 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        # what each side spent per request: the server's CPU is what stead costs; when the client's
        # approaches the wall time, the one client process is what limits the throughput
        "server_cpu_ms_per_request": round(server_cpu / done * 1000, 3),
        "client_cpu_ms_per_request": round(client_cpu / done * 1000, 3),
        "client_cpu_share_of_wall": round(client_cpu / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--sync", default="normal", choices=["normal", "full"])
    parser.add_argument("--clients", default="1,10,100")
    parser.add_argument("--baseline", action="store_true", help="the same clients against FastAPI alone")
    parser.add_argument("--held", action="store_true", help="agents never answer: acceptance alone")
    parser.add_argument(
        "--compare", action="store_true", help="each concurrency against stead, then FastAPI alone: ratios"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for clients in [int(c) for c in args.clients.split(",")]:
            sides = [args.baseline] if not args.compare else [False, True]
            results = [measure(Path(tmp), clients, args, baseline) for baseline in sides]
            for result in results:
                print(json.dumps(result), flush=True)
            if args.compare:
                ours, floor = results
                ratios = {
                    "bench": "server_post_messages_vs_fastapi",
                    "clients": clients,
                    "throughput": round(ours["per_s"] / floor["per_s"], 2),
                    "p50": round(ours["p50_ms"] / floor["p50_ms"], 2),
                    "p99": round(ours["p99_ms"] / floor["p99_ms"], 2),
                    "server_cpu": round(
                        ours["server_cpu_ms_per_request"] / floor["server_cpu_ms_per_request"], 2
                    ),
                }
                print(json.dumps(ratios), flush=True)


def measure(tmp: Path, clients: int, args: argparse.Namespace, baseline: bool) -> dict[str, Any]:
    db = tmp / f"bench{clients}{'b' if baseline else ''}.db"
    proc, info = start_server(db, args.sync, clients, baseline, args.held)
    try:
        result = asyncio.run(
            run(f"http://127.0.0.1:{info['port']}", info["agents"], clients, args.requests, proc.pid)
        )
    finally:
        proc.terminate()
        proc.wait(30)
    result["sync"] = args.sync
    if baseline:
        result["bench"] = "fastapi_baseline_post"
    elif args.held:
        result["bench"] = "server_post_messages_accept_only"
    result["cpus"] = os.cpu_count()
    return result


if __name__ == "__main__":
    main()
