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


async def run(base: str, agents: list[str], clients: int, total: int) -> dict[str, Any]:
    per = max(1, total // clients)
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as http:

        async def client(i: int, phase: str = "run", count: int = per) -> None:
            agent = agents[i % len(agents)]
            for n in range(count):
                t0 = time.perf_counter()
                r = await http.post(
                    f"/v1/agents/{agent}/messages", json={"content": f"hello {n}", "id": f"{phase}{i}m{n}"}
                )
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 202, r.text

        await asyncio.gather(*(client(i, "warm", 3) for i in range(clients)))  # open every connection
        latencies.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - t0
    done = len(latencies)
    return {
        "bench": "server_post_messages",
        "clients": clients,
        "requests": done,
        "per_s": round(done / wall, 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--sync", default="normal", choices=["normal", "full"])
    parser.add_argument("--clients", default="1,10,100")
    parser.add_argument("--baseline", action="store_true", help="the same clients against FastAPI alone")
    parser.add_argument("--held", action="store_true", help="agents never answer: acceptance alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for clients in [int(c) for c in args.clients.split(",")]:
            db = Path(tmp) / f"bench{clients}.db"
            proc, info = start_server(db, args.sync, clients, args.baseline, args.held)
            try:
                result = asyncio.run(
                    run(f"http://127.0.0.1:{info['port']}", info["agents"], clients, args.requests)
                )
            finally:
                proc.terminate()
                proc.wait(30)
            result["sync"] = args.sync
            if args.baseline:
                result["bench"] = "fastapi_baseline_post"
            elif args.held:
                result["bench"] = "server_post_messages_accept_only"
            result["cpus"] = os.cpu_count()
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
