"""`stead worker`: one worker process of a fleet sharing a PostgreSQL database (docs/postgres.md).

It registers, prints one `ready` line on stdout, claims owed agents up to `--capacity`, runs them, and logs
every claim, release, eviction and lost lease on stderr (with the agents it runs after each change). The
first SIGTERM or Ctrl-C drains: every agent stops before its next provider request and is handed to the
fleet (epoch + 1), then the process exits 0. A second Ctrl-C exits at once (as a `kill -9`: nothing
committed is lost, the other workers take over after the lease TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

import stead
from stead.cli._common import fail
from stead.cli._options import RetryForOption, retry_policy
from stead.core.fleet import FleetConfig

__all__ = ["worker"]


def _line(text: str) -> None:
    sys.stderr.write(f"stead worker: {text}\n")
    sys.stderr.flush()


async def _run(db: str, definitions: Path | None, config: FleetConfig, retry_for: float | None = None) -> int:
    system = await stead.open(db, definitions=definitions, fleet=config, retry=retry_policy(retry_for))
    fleet = system.fleet
    if fleet is None:  # pragma: no cover - guarded by the URL check
        await system.close()
        fail("stead worker needs a PostgreSQL database (--db postgresql://…)", 2)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    forced = 0

    def on_signal() -> None:
        nonlocal forced
        forced += 1
        if forced > 1:
            os._exit(130)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal)

    def report() -> None:  # SIGUSR1: what this worker runs, and where each of its tasks waits
        _line(f"runs {len(fleet.owned())} agent(s): {', '.join(fleet.owned()) or '-'}")
        for task in asyncio.all_tasks():
            frames = []
            coro: Any = task.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None)
                if frame is not None:
                    frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None)
            _line(f"task {task.get_name()}: {' > '.join(frames)}")

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, AttributeError):
        loop.add_signal_handler(signal.SIGUSR1, report)

    shown: list[str] = []

    def show() -> None:
        owned = fleet.owned()
        if owned != shown:
            shown[:] = owned
            _line(f"runs {len(owned)} agent(s): {', '.join(owned) if owned else '-'}")

    def on_change(what: str, subject: str) -> None:
        _line(f"{what} {subject}")
        loop.call_soon(show)

    fleet.on_change = on_change
    for aid in system.restored:
        _line(f"claimed {aid}")
    sys.stdout.write(f"ready {fleet.me} pid={os.getpid()} capacity={config.capacity}\n")
    sys.stdout.flush()
    show()
    try:
        await stop.wait()
        _line("draining: handing every agent to the fleet")
    finally:
        await system.close()
    _line(f"stopped ({fleet.lease_losses} lease(s) lost while running)")
    return 0


def worker(
    db: Annotated[
        str,
        typer.Option(
            "--db", help="The PostgreSQL database of the fleet (postgresql://…).", envvar="STEAD_DB"
        ),
    ],
    definitions: Annotated[
        Path | None,
        typer.Option("--definitions", help="A directory of agent definitions (their tools and models)."),
    ] = None,
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", help="Seconds without a heartbeat before a worker is evicted.")
    ] = 10.0,
    heartbeat: Annotated[float, typer.Option("--heartbeat", help="Seconds between heartbeats.")] = 2.0,
    capacity: Annotated[int, typer.Option("--capacity", help="At most this many agents at once.")] = 1000,
    sweep: Annotated[float, typer.Option("--sweep", help="Seconds between sweeps (± 20 %).")] = 2.0,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between fallback polls.")] = 2.0,
    no_listen: Annotated[
        bool, typer.Option("--no-listen", help="Poll only, no LISTEN (PgBouncer transaction pooling).")
    ] = False,
    retry_for: RetryForOption = None,
) -> None:
    """Run agents of a PostgreSQL database as one worker of a fleet, until SIGTERM/Ctrl-C (drains)."""
    if not db.startswith(("postgresql://", "postgres://")):
        fail("stead worker needs a PostgreSQL database: --db postgresql://user@host/dbname", 2)
    try:
        config = FleetConfig(
            lease_ttl=lease_ttl,
            heartbeat=heartbeat,
            sweep=sweep,
            capacity=capacity,
            poll=poll,
            listen=not no_listen,
        )
    except ValueError as e:
        fail(str(e), 2)
    from stead.cli._common import execute

    code = execute(lambda: _run(db, definitions, config, retry_for))
    raise typer.Exit(code)
