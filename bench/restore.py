"""Restore benchmark (R3): how long `stead.open` takes on a store with many idle agents and a few owing work.

    python bench/restore.py [--idle 10000] [--owing 10] [--history 6] [--db PATH] [--repeat 3]

Builds a store with `--idle` agents that each have a short finished transcript and `--owing` agents that
accepted a message whose response never came (the owning process was abandoned mid-request), then measures,
in a fresh child process per repetition, the wall time of `stead.open(...)`, how many agents it restored
(`system.restored`) and the child's peak RSS. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stead
from stead._ids import new_id
from stead.core.config import AgentConfig
from stead.providers.scripted import ScriptedProvider
from stead.store.base import AgentRow


async def never_answer(request: stead.ProviderRequest) -> list[stead.Block]:
    """A responder whose answer never comes."""
    await asyncio.Event().wait()
    return []


def _url(path: Path) -> str:
    return f"sqlite:///{path}?synchronous=off"


async def build(path: Path, *, idle: int, owing: int, history: int = 6) -> list[str]:
    """Create the store; return the ids of the agents that owe work."""
    all_asked = asyncio.Event()
    asked = 0

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        nonlocal asked
        asked += 1
        if asked >= owing:
            all_asked.set()
        return await never_answer(request)

    system = await stead.open(_url(path), providers={"scripted": ScriptedProvider(respond)})
    config = AgentConfig(provider="scripted", model="m", instructions="You are one of many idle agents.")
    now = time.time()
    batch = 1000
    for start in range(0, idle, batch):
        async with system.store.transaction() as tx:
            for _ in range(start, min(idle, start + batch)):
                aid = new_id()
                await tx.insert_agent(AgentRow(aid, None, config.encode(), now))
                records = []
                for turn in range(history // 2):
                    records.append(
                        {"k": "u", "id": new_id(), "r": "user", "c": [{"t": "x", "x": f"question {turn}"}]}
                    )
                    records.append(
                        {"k": "b", "i": new_id(), "b": {"t": "x", "x": f"answer {turn} " + "x" * 200}}
                    )
                await tx.append(aid, [json.dumps(r, separators=(",", ":")) for r in records])
    owing_ids: list[str] = []
    for _ in range(owing):
        agent = await system.create(provider="scripted", model="m")
        await agent.send("please answer")
        owing_ids.append(agent.id)
    if owing:
        await asyncio.wait_for(all_asked.wait(), 60)  # every owing agent is inside its endless request
    # the owning process goes away mid-request: nothing more is written
    system.abandon()
    await system.store.close()
    return owing_ids


async def measure(path: Path) -> dict[str, float | int]:
    started = time.perf_counter()
    system = await stead.open(_url(path), providers={"scripted": ScriptedProvider(never_answer)})
    elapsed = time.perf_counter() - started
    restored = len(system.restored)
    system.abandon()
    await system.store.close()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"open_seconds": round(elapsed, 4), "restored": restored, "peak_rss_mb": round(peak_kb / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--owing", type=int, default=10)
    parser.add_argument("--history", type=int, default=6, help="history records per idle agent")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--db", type=Path, default=None, help="where to build the store (default: a temp dir)"
    )
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(asyncio.run(measure(args.measure))))
        return
    tmp = tempfile.TemporaryDirectory()
    path = args.db or Path(tmp.name) / "restore.db"
    if path.exists():
        path.unlink()
    t0 = time.perf_counter()
    owing = asyncio.run(build(path, idle=args.idle, owing=args.owing, history=args.history))
    build_seconds = time.perf_counter() - t0
    runs = []
    for _ in range(args.repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--measure", str(path)], check=True, capture_output=True, text=True
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["open_seconds"])
    result = {
        "bench": "restore",
        "idle_agents": args.idle,
        "owing_agents": len(owing),
        "history_records_per_idle_agent": args.history,
        "db_mb": round(os.path.getsize(path) / 1e6, 1),
        "build_seconds": round(build_seconds, 2),
        "open_seconds_best": best["open_seconds"],
        "open_seconds_all": [r["open_seconds"] for r in runs],
        "restored": best["restored"],
        "restored_ok": all(r["restored"] == len(owing) for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
    }
    print(json.dumps(result))
    tmp.cleanup()


if __name__ == "__main__":
    main()
