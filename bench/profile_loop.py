"""Profile stead on the tool-loop workload (``bench/stead_loop.py``'s workload, one process).

Prints the top entries by own time (tottime) and by cumulative time, with run records on or off:

    python bench/profile_loop.py --n 200 [--no-records] [--sync normal] [--top 30] [--sort tottime]

``--callgrind`` runs no profiler: it runs the workload once (``--n``) so that
``valgrind --tool=callgrind python bench/profile_loop.py --callgrind`` counts its instructions
(repeatable under machine load, unlike wall time); ``--out FILE`` saves the raw cProfile stats.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stead_loop import _workload


def _callgrind(state: str) -> None:
    """Switch callgrind's instrumentation of this process on or off (no-op outside valgrind)."""
    if shutil.which("callgrind_control"):
        subprocess.run(
            ["callgrind_control", f"--instr={state}", str(os.getpid())], capture_output=True, check=False
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cProfile of the stead tool-loop workload")
    parser.add_argument("--n", type=int, default=200, help="conversations (default 200)")
    parser.add_argument("--k", type=int, default=5, help="tool rounds per conversation (default 5)")
    parser.add_argument("--sync", choices=["normal", "full"], default="normal")
    parser.add_argument("--no-records", action="store_true", help="stead.open(records=False)")
    parser.add_argument("--top", type=int, default=30, help="entries to print per table")
    parser.add_argument("--sort", action="append", default=[], help="tottime and/or cumtime (default: both)")
    parser.add_argument("--callgrind", action="store_true", help="no profiler: for valgrind")
    parser.add_argument("--out", type=Path, default=None, help="save raw cProfile stats")
    args = parser.parse_args(argv)
    records = not args.no_records
    with tempfile.TemporaryDirectory(prefix="stead-profile-") as tmp:
        # warm-up: imports, first-use caches
        asyncio.run(_workload(Path(tmp) / "warmup.db", 5, args.k, args.sync, records))
        path = Path(tmp) / "stead.db"
        if args.callgrind:
            # with `valgrind --tool=callgrind --instr-atstart=no`, count only the measured workload
            wall, inside, commits, _ = asyncio.run(
                _workload(path, args.n, args.k, args.sync, records, around=_callgrind)
            )
            print(f"wall {wall:.3f} s, commits/conv {commits / args.n}")
            return 0
        prof = cProfile.Profile()
        prof.enable()
        wall, inside, commits, _ = asyncio.run(_workload(path, args.n, args.k, args.sync, records))
        prof.disable()
    responses = args.n * (args.k + 1)
    print(
        f"records={'on' if records else 'off'} n={args.n} k={args.k} sync={args.sync}: "
        f"wall {wall:.3f} s under cProfile, {(wall - inside) / responses * 1e6:.0f} µs/response, "
        f"commits/conv {commits / args.n}"
    )
    if args.out:
        prof.dump_stats(str(args.out))
    for key in args.sort or ["tottime", "cumtime"]:
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats(key).print_stats(args.top)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(f"\n## top {args.top} by {key}\n")
        print(text[start:].rstrip() if start >= 0 else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
