"""The raw-sqlite3 FLOOR for the tool-loop workload.

The floor is the least work a crash-safe agent runtime must do per conversation, written with
nothing but Python's ``sqlite3`` and ``json``: no framework, no asyncio, no validation. Every
framework (stead included) is compared to it.

Workload (same as every peer in ``bench/peers``): N conversations, run one after another. Each
conversation gets one user message; a scripted model answers with one tool call ``add(a, b)`` K
times, then with a final text answer, so K + 1 model responses per conversation.

Commits per conversation, for K tool rounds (12 for K=5):

1. accept the user message: insert a queue row and the ``pending`` marker;
2. per tool round, one transaction: consume the queue row (first round only, moving the user
   message into history), append the model's tool-call block to history, insert the batch entry
   for the call and update ``pending``;
3. per tool round, one transaction: append the tool result to history, delete the batch entry,
   update ``pending``;
4. append the final answer to history and delete ``pending``.

Reported: framework overhead per model response (wall time of the workload minus the time spent
inside the fake model and the tool, divided by the number of model responses), commits per
conversation, database bytes per conversation (main file + WAL after a TRUNCATE checkpoint,
divided by N) and the peak RSS of the process.

Run: ``python bench/floor.py --n 200 --sync normal`` (prints one JSON line), or import
``run_floor`` and call it.
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    agent_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (agent_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS history (
    agent_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (agent_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    agent_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (agent_id, key)
) WITHOUT ROWID;
"""

SYNC_MODES = {"normal": "NORMAL", "full": "FULL"}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def scripted_model(conv: int, round_no: int, k: int) -> dict[str, Any]:
    """The fake model: a tool call for rounds 0..k-1, then a final answer."""
    if round_no < k:
        return {
            "role": "assistant",
            "calls": [{"id": f"c{conv}-{round_no}", "name": "add", "args": {"a": round_no, "b": 1}}],
        }
    return {"role": "assistant", "text": f"The answer is {k}."}


def add(a: int, b: int) -> int:
    """The tool."""
    return a + b


class Floor:
    """One connection, explicit transactions, compact JSON records."""

    def __init__(self, path: Path, sync: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={SYNC_MODES[sync]}")
        self.conn.executescript(SCHEMA)
        self.commits = 0

    def _commit(self) -> None:
        self.conn.execute("COMMIT")
        self.commits += 1

    def accept(self, agent: str, text: str) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO queue VALUES (?, ?, ?)", (agent, 0, _dumps({"role": "user", "text": text})))
        c.execute("INSERT INTO kv VALUES (?, 'pending', ?)", (agent, _dumps({"stage": "queued"})))
        self._commit()

    def run(
        self,
        agent: str,
        conv: int,
        k: int,
        model: Callable[[int, int, int], dict[str, Any]],
        clock: list[float],
    ) -> None:
        """Drive one accepted conversation to its final answer; ``clock[0]`` collects model+tool time."""
        c = self.conn
        perf = time.perf_counter
        seq = 0
        user_json: str | None = c.execute(
            "SELECT json FROM queue WHERE agent_id = ? ORDER BY seq LIMIT 1", (agent,)
        ).fetchone()[0]
        round_no = 0
        while True:
            t0 = perf()
            response = model(conv, round_no, k)
            clock[0] += perf() - t0
            c.execute("BEGIN IMMEDIATE")
            if user_json is not None:
                seq += 1
                c.execute("INSERT INTO history VALUES (?, ?, ?)", (agent, seq, user_json))
                c.execute("DELETE FROM queue WHERE agent_id = ? AND seq = 0", (agent,))
                user_json = None
            seq += 1
            c.execute("INSERT INTO history VALUES (?, ?, ?)", (agent, seq, _dumps(response)))
            calls = response.get("calls")
            if not calls:
                c.execute("DELETE FROM kv WHERE agent_id = ? AND key = 'pending'", (agent,))
                self._commit()
                return
            call = calls[0]
            batch_key = "batch:" + call["id"]
            c.execute("INSERT INTO kv VALUES (?, ?, ?)", (agent, batch_key, _dumps(call)))
            c.execute(
                "UPDATE kv SET value = ? WHERE agent_id = ? AND key = 'pending'",
                (_dumps({"stage": "tools", "round": round_no, "seq": seq}), agent),
            )
            self._commit()

            t0 = perf()
            value = add(**call["args"])
            clock[0] += perf() - t0
            c.execute("BEGIN IMMEDIATE")
            seq += 1
            c.execute(
                "INSERT INTO history VALUES (?, ?, ?)",
                (agent, seq, _dumps({"role": "tool", "call_id": call["id"], "value": value})),
            )
            c.execute("DELETE FROM kv WHERE agent_id = ? AND key = ?", (agent, batch_key))
            c.execute(
                "UPDATE kv SET value = ? WHERE agent_id = ? AND key = 'pending'",
                (_dumps({"stage": "model", "round": round_no + 1, "seq": seq}), agent),
            )
            self._commit()
            round_no += 1

    def size_bytes(self, path: Path) -> int:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = Path(str(path) + "-wal")
        return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    def close(self) -> None:
        self.conn.close()


def _workload(path: Path, n: int, k: int, sync: str) -> tuple[float, float, int, int]:
    floor = Floor(path, sync)
    clock = [0.0]
    t0 = time.perf_counter()
    for conv in range(n):
        agent = f"conv-{conv:06d}"
        floor.accept(agent, f"Please add things up ({conv}).")
        floor.run(agent, conv, k, scripted_model, clock)
    wall = time.perf_counter() - t0
    commits = floor.commits
    size = floor.size_bytes(path)
    floor.close()
    return wall, clock[0], commits, size


def run_floor(
    n: int = 200, k: int = 5, sync: str = "normal", warmup: int = 5, directory: Path | None = None
) -> dict[str, Any]:
    """Run the floor workload and return its results (same keys as the peers' JSON line).

    The database lives in a temporary directory (under ``directory`` if given), removed afterwards.
    """
    if sync not in SYNC_MODES:
        raise ValueError(f"sync must be one of {sorted(SYNC_MODES)}")
    with tempfile.TemporaryDirectory(prefix="stead-floor-", dir=directory) as tmp:
        if warmup:
            _workload(Path(tmp) / "warmup.db", warmup, k, sync)
        wall, inside, commits, size = _workload(Path(tmp) / "floor.db", n, k, sync)
    responses = n * (k + 1)
    return {
        "framework": "floor",
        "variant": f"sqlite3 WAL synchronous={SYNC_MODES[sync]}",
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
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="conversations (default 200)")
    parser.add_argument("--k", type=int, default=5, help="tool rounds per conversation (default 5)")
    parser.add_argument("--sync", choices=sorted(SYNC_MODES), default="normal")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up conversations, not measured")
    parser.add_argument("--dir", type=Path, default=None, help="directory for the database files")
    args = parser.parse_args(argv)
    print(json.dumps(run_floor(args.n, args.k, args.sync, args.warmup, args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
