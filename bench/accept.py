"""The accept workload: durable acceptance under concurrency, against the one-commit-per-message floor.

M concurrent senders (asyncio tasks) each deliver S messages to agents picked at random among A agents, with
client-generated ids; every `send` returns only after its message is durable. The agents' model never answers
during the measurement (each agent's first inference waits on an event), so the number measures acceptance,
not inference. stead groups concurrent acceptances into one commit (each in its own savepoint).

The floor is raw sqlite3 doing the least a crash-safe acceptance needs, one message per commit: insert the
identity row (ignored when the id is known), the queue row and the pending marker.

Run: `python bench/accept.py --senders 100 --messages 20 --agents 200 --sync normal` (one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import stead
from stead._ids import new_id

SYNC_MODES = {"normal": "NORMAL", "full": "FULL"}


class HeldProvider:
    """A provider whose responses never start until released: keeps agents busy without inference work."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        await self.release.wait()
        yield stead.Done("stop")


async def _stead(
    path: Path, senders: int, messages: int, agents: int, sync: str, seed: int
) -> dict[str, Any]:
    held = HeldProvider()
    system = await stead.open(f"sqlite:///{path}?synchronous={sync}", providers={"held": held})
    handles = [await system.create(provider="held", model="held") for _ in range(agents)]
    commits0 = system.store.commits  # type: ignore[attr-defined]
    rng = random.Random(seed)
    plan = [[(rng.randrange(agents), new_id()) for _ in range(messages)] for _ in range(senders)]

    async def sender(items: list[tuple[int, str]]) -> None:
        for index, mid in items:
            await handles[index].send("hello", id=mid)

    t0 = time.perf_counter()
    await asyncio.gather(*(sender(items) for items in plan))
    wall = time.perf_counter() - t0
    commits = system.store.commits - commits0  # type: ignore[attr-defined]
    held.release.set()
    system.abandon()
    await system.store.close()
    total = senders * messages
    return {"wall_s": wall, "messages": total, "commits": commits, "per_s": total / wall}


def _floor(path: Path, total: int, agents: int, sync: str, seed: int) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNC_MODES[sync]}")
    conn.executescript(
        "CREATE TABLE kv(agent_id TEXT, key TEXT, value TEXT, PRIMARY KEY(agent_id, key)) WITHOUT ROWID;"
    )
    rng = random.Random(seed)
    ids = [(f"agent{rng.randrange(agents):06d}", new_id()) for _ in range(total)]
    t0 = time.perf_counter()
    for n, (agent, mid) in enumerate(ids):
        conn.execute("BEGIN")
        if conn.execute("INSERT OR IGNORE INTO kv VALUES (?, ?, '')", (agent, "msg." + mid)).rowcount:
            conn.execute("INSERT INTO kv VALUES (?, ?, ?)", (agent, f"q.send.{n:020d}", '{"c":"hello"}'))
            conn.execute("INSERT OR IGNORE INTO kv VALUES (?, 'pending', '{}')", (agent,))
        conn.execute("COMMIT")
    wall = time.perf_counter() - t0
    conn.close()
    return {"wall_s": wall, "messages": total, "commits": total, "per_s": total / wall}


def run_accept(
    senders: int = 100, messages: int = 20, agents: int = 200, sync: str = "normal", seed: int = 1
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stead-accept-") as tmp:
        floor = _floor(Path(tmp) / "floor.db", senders * messages, agents, sync, seed)
        ours = asyncio.run(_stead(Path(tmp) / "stead.db", senders, messages, agents, sync, seed))
    return {
        "workload": "accept",
        "senders": senders,
        "messages_per_sender": messages,
        "agents": agents,
        "synchronous": SYNC_MODES[sync],
        "stead_per_s": round(ours["per_s"]),
        "stead_commits": ours["commits"],
        "floor_per_s": round(floor["per_s"]),
        "floor_commits": floor["commits"],
        "ratio_vs_floor": round(ours["per_s"] / floor["per_s"], 2),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="durable acceptance under concurrency vs the floor")
    parser.add_argument("--senders", type=int, default=100)
    parser.add_argument("--messages", type=int, default=20, help="messages per sender")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--sync", choices=sorted(SYNC_MODES), default="normal")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(run_accept(args.senders, args.messages, args.agents, args.sync, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
