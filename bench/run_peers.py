"""Run the tool-loop workload on the floor, stead (if present) and the peers; print a markdown table.

Every workload runs as its own subprocess and prints one JSON line per variant (see
``bench/peers/_common.py:emit`` for the keys). Workloads are interleaved: each of ``--repeat``
rounds runs every workload once, in a rotated order, so that drift on the machine (other load,
page cache, CPU frequency) spreads over all of them. The table shows, per row, the best (minimum)
of the rounds with the median and the worst, and computes ratios from the best (``--stat median``
to use medians): on a shared 2-core machine other load only ever adds time, so the minimum is the
least disturbed estimate.

- floor: ``bench/floor.py`` (synchronous=NORMAL and FULL), run with the project interpreter;
- stead: ``bench/stead_loop.py`` if the file exists, run with the project interpreter
  (``/work/main/.venv/bin/python`` or ``$STEAD_PYTHON``) as ``stead_loop.py --n N --k K``, twice
  with ``--sync normal`` and ``--sync full`` if the script has a ``--sync`` option; it may print one
  JSON line per variant, with the same keys as the peers;
- peers: ``bench/peers/*_loop.py`` with ``bench/.peers/venv/bin/python`` (``bash
  bench/peers/install.sh`` creates it).

Ratios: "x floor" divides by the floor run with the same ``synchronous`` setting (rows without
persistence are compared with the NORMAL floor); "x LangGraph" divides by LangGraph with
``SqliteSaver``, ``durability="sync"`` (its crash-safest configuration).

Run: ``python bench/run_peers.py [--n 200] [--repeat 5] [--out results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEERS_PY = BENCH / ".peers" / "venv" / "bin" / "python"
STEAD_LOOP = BENCH / "stead_loop.py"
LANGGRAPH_REF = ("langgraph", "SqliteSaver+invoke durability=sync")


def project_python() -> str:
    env = os.environ.get("STEAD_PYTHON")
    if env:
        return env
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


@dataclass(frozen=True)
class Workload:
    name: str
    python: str
    script: Path
    args: tuple[str, ...] = ()


def workloads(n: int, k: int, peer_sync: str, skip_peers: bool) -> list[Workload]:
    py = project_python()
    common = ("--n", str(n), "--k", str(k))
    out = [
        Workload("floor-normal", py, BENCH / "floor.py", (*common, "--sync", "normal")),
        Workload("floor-full", py, BENCH / "floor.py", (*common, "--sync", "full")),
    ]
    if STEAD_LOOP.exists():
        # The stead hook: run it like the floor, at both synchronous settings if it takes --sync.
        if '"--sync"' in STEAD_LOOP.read_text():
            out.append(Workload("stead-normal", py, STEAD_LOOP, (*common, "--sync", "normal")))
            out.append(Workload("stead-full", py, STEAD_LOOP, (*common, "--sync", "full")))
            # the kernel alone: run/step records off (they are on by default)
            off = ("--no-records",)
            out.append(Workload("stead-normal-norec", py, STEAD_LOOP, (*common, "--sync", "normal", *off)))
            out.append(Workload("stead-full-norec", py, STEAD_LOOP, (*common, "--sync", "full", *off)))
        else:
            out.append(Workload("stead", py, STEAD_LOOP, common))
    if skip_peers:
        return out
    if not PEERS_PY.exists():
        print(f"note: {PEERS_PY} missing (run bash bench/peers/install.sh); skipping peers", file=sys.stderr)
        return out
    peers = str(PEERS_PY)
    p = BENCH / "peers"
    pc = (*common, "--sync", peer_sync)
    out += [
        Workload("langgraph-sync", peers, p / "langgraph_loop.py", (*pc, "--variant", "sync")),
        Workload("langgraph-default", peers, p / "langgraph_loop.py", (*pc, "--variant", "default")),
        Workload("langgraph-aio-sync", peers, p / "langgraph_loop.py", (*pc, "--variant", "aio-sync")),
        Workload("langgraph-aio-default", peers, p / "langgraph_loop.py", (*pc, "--variant", "aio-default")),
        Workload("openai-agents", peers, p / "openai_agents_loop.py", pc),
        Workload("pydantic-ai", peers, p / "pydantic_ai_loop.py", (*pc, "--variant", "in-memory")),
        Workload("pydantic-ai-store", peers, p / "pydantic_ai_loop.py", (*pc, "--variant", "store-at-end")),
    ]
    return out


def run_one(w: Workload, timeout: float) -> list[dict[str, Any]]:
    cmd = [w.python, str(w.script), *w.args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{w.name} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise RuntimeError(f"{w.name} printed no JSON line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return rows


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return (str(row["framework"]), str(row["variant"]))


def summarize(runs: dict[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for key, rows in runs.items():
        overheads = [float(r["overhead_us_per_response"]) for r in rows]
        last = rows[-1]
        out.append(
            {
                **last,
                "framework": key[0],
                "variant": key[1],
                "overhead_us_median": statistics.median(overheads),
                "overhead_us_min": min(overheads),
                "overhead_us_max": max(overheads),
                "runs": len(rows),
                "peak_rss_mb": max(float(r["peak_rss_mb"]) for r in rows),
            }
        )
    return out


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def _ratio(a: float, b: float | None) -> str:
    if not b:
        return "—"
    r = a / b
    return f"{r:.2f}×" if r < 1 else f"{r:.1f}×"


def markdown(summary: list[dict[str, Any]], stat: str = "min") -> str:
    """The results table; ratios use ``stat`` ("min": best of the rounds, or "median")."""
    col = f"overhead_us_{stat}"
    floor = {r["synchronous"]: r[col] for r in summary if r["framework"] == "floor"}
    lg = next((r[col] for r in summary if _key(r) == LANGGRAPH_REF), None)
    lines = [
        "| framework | variant | synchronous | overhead µs/response: best (median, worst) "
        "| × floor | × LangGraph | commits/conv | DB bytes/conv | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"floor": 0, "stead": 1}
    for r in sorted(summary, key=lambda r: (order.get(r["framework"], 2), r["framework"], r["variant"])):
        sync = r.get("synchronous")
        ref = floor.get(sync or "NORMAL")
        value = r[col]
        commits = r.get("commits_per_conversation")
        lines.append(
            f"| {r['framework']} | {r['variant']} | {sync or 'n/a (no DB)'} "
            f"| {_fmt(r['overhead_us_min'], 1)} ({_fmt(r['overhead_us_median'], 1)}, "
            f"{_fmt(r['overhead_us_max'], 1)}) "
            f"| {_ratio(value, ref)} | {_ratio(value, lg)} "
            f"| {_fmt(commits, 1) if commits is not None else '—'} "
            f"| {_fmt(r.get('db_bytes_per_conversation'))} | {_fmt(r['peak_rss_mb'], 1)} |"
        )
    return "\n".join(lines)


def _footer(stat: str) -> str:
    which = "best (minimum) of the rounds" if stat == "min" else "median of the rounds"
    return (
        f"Ratios use the {which}. × floor: divided by the floor with the same synchronous setting "
        "(rows without a database: the NORMAL floor). × LangGraph: divided by LangGraph "
        "SqliteSaver+invoke durability=sync."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Tool-loop benchmark: floor, stead and peers.")
    parser.add_argument("--n", type=int, default=200, help="conversations per run (default 200)")
    parser.add_argument("--k", type=int, default=5, help="tool rounds per conversation (default 5)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument(
        "--peer-sync",
        choices=["default", "normal", "full"],
        default="default",
        help="force PRAGMA synchronous on the peers' connections (default: their own setting)",
    )
    parser.add_argument("--skip-peers", action="store_true", help="floor and stead only")
    parser.add_argument("--only", action="append", default=[], help="run only workloads with this name")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-subprocess timeout, seconds")
    parser.add_argument("--out", type=Path, default=None, help="write raw and summarized results as JSON")
    parser.add_argument(
        "--stat",
        choices=["min", "median"],
        default="min",
        help="statistic the ratios use (default min: least disturbed by other load on the machine)",
    )
    parser.add_argument("--from-json", type=Path, default=None, help="re-render a table from --out JSON")
    args = parser.parse_args(argv)

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print(markdown(saved["summary"], args.stat))
        print(f"\n{_footer(args.stat)}")
        meta = saved.get("meta", {})
        if meta:
            print(", ".join(f"{k}={v}" for k, v in meta.items()))
        return 0

    todo = workloads(args.n, args.k, args.peer_sync, args.skip_peers)
    if args.only:
        todo = [w for w in todo if w.name in args.only]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    raw: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    for rnd in range(args.repeat):
        shift = rnd % len(todo)
        for w in todo[shift:] + todo[:shift]:
            for row in run_one(w, args.timeout):
                row["round"] = rnd
                raw.append(row)
                runs.setdefault(_key(row), []).append(row)
                us = row["overhead_us_per_response"]
                tag = f"[round {rnd + 1}/{args.repeat}] {w.name}"
                print(f"{tag}: {us} µs/response", file=sys.stderr, flush=True)
    summary = summarize(runs)
    meta = {
        "n": args.n,
        "k": args.k,
        "rounds": args.repeat,
        "peer_sync": args.peer_sync,
        "seconds": round(time.perf_counter() - t0),
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(markdown(summary, args.stat))
    print(f"\n{_footer(args.stat)}")
    print(", ".join(f"{k}={v}" for k, v in meta.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "raw": raw, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
