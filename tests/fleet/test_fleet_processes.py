"""The decisive multi-process test of a PostgreSQL fleet (docs/postgres.md, reference §1.6).

Three real `stead worker` processes (A, B started at once on a fresh database: their migrations must not
race; C later) and a separate client. The client creates agents of three definitions — one tool each: a
default (at most once), a `durable` and a `transactional` one — and sends three messages to each (mixed
send/steer, client ids, one repeated). Every tool logs call id, pid and epoch before acting. A and B block
inside their tools (B's transactional tools inside their transaction, holding the agent's row lock); A is
SIGKILLed, B SIGSTOPped; once C owns every agent and has finished, B is continued and its tools released.
Every provider request any worker made is checked against the store (tests/chaos/requests.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.fleet import pg_available, run_fleet_chaos, run_fleet_scenario

pytestmark = pytest.mark.skipif(not pg_available(), reason="no PostgreSQL server (tests/fakes/fleet.py)")
CI_FLEET_SEED = 3
REPLAY = f"python scripts/chaos.py --pg-fleet --seed {CI_FLEET_SEED}"


@pytest.mark.timeout(300)
def test_W2_fleet_kill_and_stop_workers_lose_nothing_and_admit_no_zombie_write(tmp_path: Path) -> None:
    run_fleet_scenario(tmp_path, 12)


@pytest.mark.timeout(600)
def test_W2_fleet_of_sixty_agents_kill_and_stop_lose_nothing(tmp_path: Path) -> None:
    run_fleet_scenario(tmp_path, 60)


@pytest.mark.timeout(600)
def test_W2_fleet_chaos_seed_concurrent_runs_stops_and_approvals(tmp_path: Path) -> None:
    """One seed of `scripts/chaos.py --pg-fleet`'s chaos scenario (no PostgreSQL restart: CI has only the
    shared cluster): concurrent client `agent.run()`s, seeded SIGSTOP/SIGCONT inside tools, during re-runs
    and approvals, every provider request checked against the store (tests/fakes/fleet.py)."""
    result = run_fleet_chaos(tmp_path, CI_FLEET_SEED)
    assert result.ok, "\n".join([*result.violations, *result.events, f"replay: {REPLAY}"])
    assert result.stats["stops"] > 0 and result.stats["requests_checked"] > 0
