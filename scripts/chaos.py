"""Run the chaos harness over many seeds (see docs/chaos.md).

    python scripts/chaos.py --seeds 1000 [--start S] [--flaky] [--jobs 2]
    python scripts/chaos.py --seed N [--flaky]          # replay one seed, printing every violation
    python scripts/chaos.py --pg-fleet --seeds 10        # PostgreSQL fleet mode (docs/chaos.md)
    python scripts/chaos.py --pg-fleet --seeds 10 --pg-admin postgresql://postgres@127.0.0.1:5433/postgres \\
        --pg-cluster 15/chaos                            # ... with restarts of a cluster of its own

Each seed runs in its own process (at most --jobs at a time). Prints progress, a summary, and for every
failing seed a one-line command that replays it; exits non-zero on any invariant violation.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos import harness as H

DEFAULT_ADMIN = os.environ.get("STEAD_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
DEFAULT_CLUSTER = "none"


def _quiet_run(seed: int, flaky: bool) -> H.SeedResult:
    logging.disable(logging.WARNING)  # the kernel logs every retried store error in flaky mode
    return H.run_seed_sync(seed, flaky)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=None, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--seed", type=int, default=None, help="replay exactly this seed")
    ap.add_argument("--flaky", action="store_true", help="flaky-store mode (in-process, no kills)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    ap.add_argument(
        "--pg-fleet",
        action="store_true",
        help="PostgreSQL fleet mode: three `stead worker` processes, random SIGKILL/SIGSTOP (sequential)",
    )
    ap.add_argument(
        "--pg-admin",
        default=DEFAULT_ADMIN,
        help=f"--pg-fleet: admin URL of the server the throwaway databases live on (default {DEFAULT_ADMIN})",
    )
    ap.add_argument(
        "--pg-cluster",
        default=DEFAULT_CLUSTER,
        help="--pg-fleet: the cluster (VERSION/NAME for pg_ctlcluster) the chaos restarts — the one "
        "--pg-admin names; 'none' (the default) restarts nothing",
    )
    args = ap.parse_args(argv)
    if args.pg_fleet:
        return _pg_fleet(args)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        seeds = list(range(args.start, args.start + (args.seeds if args.seeds is not None else 20)))
    mode = "flaky-store" if args.flaky else "kill -9"
    print(f"chaos ({mode}): {len(seeds)} seed(s) from {seeds[0]}, {args.jobs} job(s)", flush=True)
    t0 = time.monotonic()
    failed: list[H.SeedResult] = []
    totals: Counter[str] = Counter()
    kills = 0
    done = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(_quiet_run, s, args.flaky) for s in seeds]
        for fut in as_completed(futures):
            r = fut.result()
            done += 1
            kills += r.kills
            totals.update(r.stats)
            if not r.ok:
                failed.append(r)
                print(f"FAIL seed {r.seed}: {len(r.violations)} violation(s); first: {r.violations[0][:500]}")
                print(f"  replay: {H.replay_command(r.seed, args.flaky)}", flush=True)
                if len(seeds) == 1:
                    for v in r.violations:
                        print(f"  - {v}")
            if done % 25 == 0 or done == len(seeds):
                rate = done / (time.monotonic() - t0)
                print(f"  {done}/{len(seeds)} seeds, {len(failed)} failing, {rate:.2f} seeds/s", flush=True)
    wall = time.monotonic() - t0
    print(
        f"summary: {len(seeds)} seeds ({mode}), {kills} kills, {len(failed)} failing seeds, "
        f"{sum(len(r.violations) for r in failed)} violations, wall {wall:.0f}s"
    )
    print("  exercised: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    for r in sorted(failed, key=lambda r: r.seed):
        print(f"  failing: {H.replay_command(r.seed, args.flaky)}")
    return 1 if failed else 0


def _pg_fleet(args: argparse.Namespace) -> int:
    """Each seed: (1) the decisive scenario with seeded parameters — 6–15 agents on three workers; A is
    SIGKILLed or SIGSTOPped, B SIGSTOPped (half of the seeds also inside a transaction); (2) the chaos
    scenario — concurrent `agent.run()` clients and seeded SIGSTOP/SIGCONT, SIGKILL and (with --pg-cluster)
    PostgreSQL restarts (tests/fakes/fleet.py). Both check every provider request."""
    import random
    import tempfile
    import traceback

    from tests.fakes.fleet import make_fleet_plan, pg_available, run_fleet_chaos, run_fleet_scenario

    if not pg_available(args.pg_admin):
        print(f"no PostgreSQL server at {args.pg_admin}", file=sys.stderr)
        return 2
    cluster = None if args.pg_cluster in ("", "none") else args.pg_cluster
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)  # the client's pool reconnecting after restarts
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + (args.seeds or 5)))
    print(
        f"chaos (PostgreSQL fleet): {len(seeds)} seed(s) from {seeds[0]}, server {args.pg_admin}, "
        f"restarting {cluster or 'nothing'}",
        flush=True,
    )
    failed = []
    totals: Counter[str] = Counter()
    kinds: Counter[str] = Counter()  # seeds with a violation of each kind
    t0 = time.monotonic()
    for seed in seeds:
        rng = random.Random(seed)
        n, a_action, b_in_tx = rng.randrange(6, 16), rng.choice(["kill", "stop"]), rng.random() < 0.5
        replay = _pg_replay(seed, args)
        t_seed = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="stead-chaos-pg-") as tmp:
            violations: list[str] = []
            try:
                run_fleet_scenario(
                    Path(tmp) / "decisive", n, a_action=a_action, b_in_tx=b_in_tx, admin=args.pg_admin
                )
            except Exception as e:
                violations.append(f"decisive scenario ({n} agents, A {a_action}, B tx={b_in_tx}): {e!r}")
                traceback.print_exc(limit=3)
            t_mid = time.monotonic()
            try:
                r = run_fleet_chaos(Path(tmp) / "chaos", seed, admin=args.pg_admin, cluster=cluster)
                violations += r.violations
                totals.update(r.stats)
                events = r.events
            except Exception as e:
                violations.append(f"chaos scenario: harness error {e!r}")
                traceback.print_exc(limit=5)
                events = []
        took = f"{t_mid - t_seed:.0f}+{time.monotonic() - t_mid:.0f}s"
        kinds.update({_kind(v) for v in violations})
        plan = make_fleet_plan(seed, restarts=cluster is not None)
        if violations:
            failed.append(seed)
            print(f"FAIL seed {seed} ({took}; {plan.describe()}): {len(violations)} violation(s)")
            for v in violations[: None if len(seeds) == 1 else 20]:
                print(f"  - {v[:1500]}")
            if len(seeds) == 1:
                print("  events:\n    " + "\n    ".join(events))
            print(f"  replay: {replay}", flush=True)
        else:
            print(
                f"  seed {seed}: ok ({took}; decisive {n} agents, A {a_action}, B tx={b_in_tx}; "
                f"{plan.describe()})"
            )
            if len(seeds) == 1:
                print("  events:\n    " + "\n    ".join(events), flush=True)
    wall = time.monotonic() - t0
    print(f"summary: {len(seeds)} seeds (PostgreSQL fleet), {len(failed)} failing, wall {wall:.0f}s")
    print("  exercised: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    print("  seeds failing by kind: " + (", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "-"))
    for seed in failed:
        print(f"  failing: {_pg_replay(seed, args)}")
    return 1 if failed else 0


def _kind(violation: str) -> str:
    """A violation's kind, for the summary."""
    for needle, kind in (
        ("RunNotFound", "RunNotFound"),
        ("did not return awaiting_input", "run() without awaiting_input"),
        ("request ", "request checker"),
        ("decisive scenario", "decisive scenario"),
        ("harness error", "harness error"),
    ):
        if needle in violation:
            return kind
    return "other"


def _pg_replay(seed: int, args: argparse.Namespace) -> str:
    extra = "" if args.pg_admin == DEFAULT_ADMIN else f" --pg-admin {args.pg_admin}"
    extra += "" if args.pg_cluster == DEFAULT_CLUSTER else f" --pg-cluster {args.pg_cluster or 'none'}"
    return f"python scripts/chaos.py --pg-fleet --seed {seed}{extra}"


if __name__ == "__main__":
    sys.exit(main())
