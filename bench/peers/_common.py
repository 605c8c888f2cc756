"""Shared, stdlib-only helpers for the peer workloads (run with bench/.peers/venv/bin/python).

Each peer script runs the same tool-loop workload as ``bench/floor.py``: N conversations, one user
message each, a scripted model that calls ``add(a, b)`` K times (one call per response) and then
answers in text. The script times the whole workload, subtracts the time spent inside the fake model
and the tool body (measured with :class:`Clock`), and divides by N x (K + 1) model responses.

Commits are counted on a separate warm-up pass (the trace callback used for counting costs time, so
the timed pass runs without it): :func:`install_sqlite_hooks` wraps ``sqlite3.connect`` so that every
connection a framework opens gets a statement trace, and :class:`CommitCounter` counts write
transactions (explicit ``BEGIN .. COMMIT`` blocks that wrote something, plus writes in autocommit
mode, plus outermost ``SAVEPOINT .. RELEASE`` blocks; ``CREATE .. IF NOT EXISTS`` is not counted as a
write, since on an existing schema it writes nothing). The same hook can force
``PRAGMA synchronous`` on every connection for the ``--sync`` option.
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

K_DEFAULT = 5
N_DEFAULT = 200
WARMUP_DEFAULT = 5

_WRITE_PREFIXES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


def conv_id(i: int) -> str:
    return f"conv-{i:06d}"


def user_text(conv: str) -> str:
    """The user message; the conversation id is in parentheses so a stateless fake model can find it."""
    return f"Please add things up ({conv})."


def conv_from_text(text: str) -> str:
    return text[text.rindex("(") + 1 : text.rindex(")")]


def final_text(k: int) -> str:
    return f"The answer is {k}."


def call_id(conv: str, round_no: int) -> str:
    return f"call_{conv}_{round_no}"


class Clock:
    """Accumulates time spent inside the fake model and the tool bodies."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.inside = 0.0
        self.model_calls = 0
        self.tool_calls = 0

    @contextmanager
    def model(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.inside += time.perf_counter() - t0
            self.model_calls += 1

    @contextmanager
    def tool(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.inside += time.perf_counter() - t0
            self.tool_calls += 1


@dataclass
class _ConnState:
    in_txn: bool = False
    dirty: bool = False
    savepoints: int = 0
    savepoint_txn: bool = False


@dataclass
class CommitCounter:
    """Counts write transactions from statement traces of every hooked connection."""

    enabled: bool = False
    commits: int = 0
    statements: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tracer(self) -> Callable[[str], None]:
        st = _ConnState()

        def trace(sql: str) -> None:
            if not self.enabled:
                return
            head = sql.lstrip().upper()
            with self._lock:
                self.statements += 1
                if head.startswith("BEGIN"):
                    st.in_txn, st.dirty = True, False
                elif head.startswith(("COMMIT", "END")):
                    if st.in_txn and st.dirty:
                        self.commits += 1
                    st.in_txn = st.dirty = st.savepoint_txn = False
                    st.savepoints = 0
                elif head.startswith("ROLLBACK"):
                    if " TO " not in head:
                        st.in_txn = st.dirty = st.savepoint_txn = False
                        st.savepoints = 0
                elif head.startswith("SAVEPOINT"):
                    if not st.in_txn:
                        st.in_txn, st.dirty, st.savepoint_txn = True, False, True
                    st.savepoints += 1
                elif head.startswith("RELEASE"):
                    st.savepoints = max(0, st.savepoints - 1)
                    if st.savepoint_txn and st.savepoints == 0:
                        if st.dirty:
                            self.commits += 1
                        st.in_txn = st.dirty = st.savepoint_txn = False
                elif " IF NOT EXISTS " in head:
                    pass  # schema set-up on an existing schema writes nothing
                elif head.startswith(_WRITE_PREFIXES) or (head.startswith("WITH") and " INSERT " in head):
                    if st.in_txn:
                        st.dirty = True
                    else:
                        self.commits += 1

        return trace


COUNTER = CommitCounter()
_SYNC: dict[str, str | None] = {"mode": None}


def install_sqlite_hooks(sync: str | None) -> None:
    """Wrap sqlite3.connect: trace every new connection into COUNTER; force ``synchronous`` if asked.

    Must run before the framework opens any connection (aiosqlite looks ``sqlite3.connect`` up at
    call time, so it is covered too).
    """
    _SYNC["mode"] = None if sync in (None, "default") else sync.upper()
    if getattr(sqlite3.connect, "_bench_hooked", False):
        return
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = original(*args, **kwargs)
        if _SYNC["mode"]:
            conn.execute(f"PRAGMA synchronous={_SYNC['mode']}")
        conn.set_trace_callback(COUNTER.tracer())
        return conn

    connect._bench_hooked = True  # type: ignore[attr-defined]
    sqlite3.connect = connect  # type: ignore[assignment]


def db_bytes(path: Path) -> int:
    """Size of a SQLite database (main file + WAL) after a TRUNCATE checkpoint."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    total = 0
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total


def effective_synchronous(path: Path) -> str:
    """What a fresh connection to ``path`` gets for ``PRAGMA synchronous`` (after the hook)."""
    conn = sqlite3.connect(path)
    try:
        value = conn.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        conn.close()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(value, str(value))


def parse_args(description: str, variants: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=N_DEFAULT, help="conversations (default 200)")
    parser.add_argument("--k", type=int, default=K_DEFAULT, help="tool rounds per conversation (default 5)")
    parser.add_argument("--warmup", type=int, default=WARMUP_DEFAULT, help="warm-up conversations")
    parser.add_argument("--variant", choices=variants, default=variants[0])
    parser.add_argument(
        "--sync",
        choices=["default", "normal", "full"],
        default="default",
        help="force PRAGMA synchronous on the framework's connections (default: leave it alone)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="directory for database files")
    return parser.parse_args()


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def emit(
    *,
    framework: str,
    variant: str,
    version: str,
    n: int,
    k: int,
    wall: float,
    clock: Clock,
    commits: float | None,
    db_bytes_total: int | None,
    synchronous: str | None,
    note: str | None = None,
) -> None:
    responses = n * (k + 1)
    if clock.model_calls != responses or clock.tool_calls != n * k:
        raise SystemExit(
            f"{framework}: workload ran {clock.model_calls} model calls and {clock.tool_calls} tool calls, "
            f"expected {responses} and {n * k}"
        )
    result: dict[str, Any] = {
        "framework": framework,
        "variant": variant,
        "version": version,
        "n": n,
        "k": k,
        "responses": responses,
        "wall_s": round(wall, 4),
        "model_tool_s": round(clock.inside, 4),
        "overhead_us_per_response": round((wall - clock.inside) / responses * 1e6, 1),
        "commits_per_conversation": commits,
        "db_bytes_per_conversation": None if db_bytes_total is None else round(db_bytes_total / n),
        "synchronous": synchronous,
        "peak_rss_mb": peak_rss_mb(),
        "persistence": db_bytes_total is not None,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }
    if note:
        result["note"] = note
    print(json.dumps(result), flush=True)
