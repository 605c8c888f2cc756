"""A chaos worker process: one incarnation of a seed's workload, until the driver SIGKILLs it.

    python tests/chaos/worker.py DBPATH SEED INCARNATION run|final

It prints marker lines (flushed, one per line) that the driver reads: READY, SEND/ACC/REF for every
acceptance, ABORT/ABORTED, TOOL and EV lines from tool bodies and hooks, WORKDONE, IDLE, and — in `final`
mode, which is never killed — FINAL after a clean close. See tests/chaos/harness.py.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `stead` and `tests` importable the same way
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from tests.chaos import harness as H


def marker(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    db, seed, inc, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    asyncio.run(H.incarnation(db, seed, inc, mode == "final", marker))


if __name__ == "__main__":
    main()
