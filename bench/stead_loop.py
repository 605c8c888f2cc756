"""stead on the tool-loop workload (same workload and JSON line as bench/floor.py and bench/peers/).

N conversations, run one after another, each on its own agent: one user message; a scripted model answers
with one tool call `add(a, b)` K times, then with a final text answer (K + 1 model responses). Agents are
created before the clock starts (the floor and the peers have no creation step either); everything from
`send` to `wait_idle` is measured. Overhead per response = (wall − time inside the model and the tool) /
responses. Commits are the store's durable commits during the measured part.

Run: `python bench/stead_loop.py --n 200 --sync normal` (prints one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stead
from stead.providers.scripted import ScriptedProvider

SYNC_MODES = {"normal": "NORMAL", "full": "FULL"}


async def _workload(
    path: Path,
    n: int,
    k: int,
    sync: str,
    records: bool = True,
    around: Callable[[str], None] | None = None,
) -> tuple[float, float, int, int]:
    """Run the workload; `around("on")` / `around("off")` are called right before and after the measured
    part (bench/profile_loop.py switches callgrind's instrumentation with it)."""
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
            [stead.ToolCall("add", {"a": rounds, "b": 1})]
            if rounds < k
            else [stead.Text(f"The answer is {k}.")]
        )
        inside[0] += perf() - t0
        return out

    url = f"sqlite:///{path}?synchronous={sync}"
    system = await stead.open(
        url, providers={"scripted": ScriptedProvider(respond)}, tools=[add], records=records
    )
    agents = [await system.create(provider="scripted", model="scripted", tools=["add"]) for _ in range(n)]
    commits0 = system.store.commits  # type: ignore[attr-defined]
    if around is not None:
        around("on")
    t0 = perf()
    for i, agent in enumerate(agents):
        await agent.send(f"Please add things up ({i}).")
        await agent.wait_idle()
    wall = perf() - t0
    if around is not None:
        around("off")
    commits = system.store.commits - commits0  # type: ignore[attr-defined]
    await system.close()
    return wall, inside[0], commits, _size(path)


def _size(path: Path) -> int:
    """Main file + WAL after a TRUNCATE checkpoint."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    wal = Path(str(path) + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def run_stead(
    n: int = 200,
    k: int = 5,
    sync: str = "normal",
    warmup: int = 5,
    directory: Path | None = None,
    records: bool = True,
) -> dict[str, Any]:
    """Run the workload and return the results (same keys as the floor's)."""
    with tempfile.TemporaryDirectory(prefix="stead-bench-", dir=directory) as tmp:
        if warmup:
            asyncio.run(_workload(Path(tmp) / "warmup.db", warmup, k, sync, records))
        wall, inside, commits, size = asyncio.run(_workload(Path(tmp) / "stead.db", n, k, sync, records))
    responses = n * (k + 1)
    return {
        "framework": "stead",
        "variant": f"stead {stead.__version__} SQLite synchronous={SYNC_MODES[sync]}"
        + ("" if records else " records=off"),
        "n": n,
        "k": k,
        "responses": responses,
        "wall_s": round(wall, 4),
        "model_tool_s": round(inside, 4),
        "overhead_us_per_response": round((wall - inside) / responses * 1e6, 1),
        "commits_per_conversation": commits / n,
        "db_bytes_per_conversation": round(size / n),
        "synchronous": SYNC_MODES[sync],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "persistence": True,
        "records": records,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stead on the tool-loop workload")
    parser.add_argument("--n", type=int, default=200, help="conversations (default 200)")
    parser.add_argument("--k", type=int, default=5, help="tool rounds per conversation (default 5)")
    parser.add_argument("--sync", choices=sorted(SYNC_MODES), default="normal")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up conversations, not measured")
    parser.add_argument("--dir", type=Path, default=None, help="directory for the database files")
    parser.add_argument(
        "--no-records", action="store_true", help="open without run records (stead.open(records=False))"
    )
    args = parser.parse_args(argv)
    print(json.dumps(run_stead(args.n, args.k, args.sync, args.warmup, args.dir, not args.no_records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
