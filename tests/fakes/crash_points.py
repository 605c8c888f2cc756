"""The crash-point driver: the store dies at each of its operations in turn (`Faults(crash_at=N)` rolls back
the open transaction and releases the database like a dead process), and a new process finishes.

A suite measures N, the store operations of one clean run, once per session at collection
(`measured_once`), makes one test per crash point (`parametrize_crash_at`: a `crash_at` argument, ids
`op000`, `op001`, ...), and runs each process lifetime that may die at any store operation with
`run_until_crash`. `crash` kills a running system in place; `KVLedger` hooks record what happened durably.

    op_count = measured_once(_count_ops, "stead-count-")

    def pytest_generate_tests(metafunc):
        parametrize_crash_at(metafunc, lambda: range(op_count() + 1))
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import stead
from stead.store import Faults

__all__ = ["KVLedger", "crash", "finish_restored", "measured_once", "parametrize_crash_at", "run_until_crash"]

T = TypeVar("T")


def measured_once(measure: Callable[[Path], Coroutine[Any, Any, T]], prefix: str) -> Callable[[], T]:
    """A function returning `measure(directory)`'s value, run the first time it is called (in a fresh
    temporary directory named `prefix...`, on its own event loop: at collection no loop runs) and cached for
    the session."""
    cache: list[T] = []

    def value() -> T:
        if not cache:
            with tempfile.TemporaryDirectory(prefix=prefix) as d:
                cache.append(asyncio.run(measure(Path(d))))
        return cache[0]

    return value


def parametrize_crash_at(metafunc: pytest.Metafunc, points: Callable[[], Iterable[int]]) -> None:
    """From a module's `pytest_generate_tests`: one test per crash point for the tests that take `crash_at`
    (`points()` is called only then: it may measure a clean run)."""
    if "crash_at" in metafunc.fixturenames:
        metafunc.parametrize("crash_at", points(), ids=lambda i: f"op{i:03d}")


async def run_until_crash(
    opening: Awaitable[stead.AgentSystem],
    faults: Faults,
    act: Callable[[stead.AgentSystem], Awaitable[object]],
    *,
    close_store: bool = False,
) -> None:
    """One process lifetime that may die at any store operation: open the system (`opening` was given
    `faults`), run `act` on it until it returns or the store crashes, then close the system — or, if the
    store crashed, abandon it as a killed process would (and with `close_store` close its store too)."""
    try:
        system = await opening
    except stead.StoreCrashed:
        return
    try:
        await act(system)
    except stead.StoreCrashed:
        pass
    finally:
        if faults.crashed:
            system.abandon()
            if close_store:
                await system.store.close()
        else:
            await system.close()


async def crash(system: stead.AgentSystem, faults: Faults) -> None:
    """Kill the process in place: drop everything in memory and let the store die at its next operation
    (the open transaction rolls back; file and lock are released, as on SIGKILL)."""
    faults.crash_at = faults.ops
    system.abandon()
    with pytest.raises(stead.StoreCrashed):
        async with system.store.transaction() as tx:
            await tx.get("nobody", "pending")


async def finish_restored(
    system: stead.AgentSystem, agent_id: str, timeout: float
) -> tuple[list[stead.Message], list[str]]:
    """In `system`, opened after a crash (a new owner): check it restored `agent_id` alone, let the agent
    finish its work and check it settled; returns its history and the keys left in its KV."""
    assert system.restored == [agent_id]
    agent = await system.get(agent_id)
    await agent.wait_idle(timeout=timeout)
    assert not agent.active
    history = await agent.history()
    async with system.store.transaction() as tx:
        keys = [k for k, _ in await tx.read_prefix(agent_id, "")]
    return history, keys


class KVLedger(stead.Hooks):
    """Hooks that append events to the agent's `kv.a.ledger` list inside the transaction that describes them
    (so an event is durable exactly when what it describes is); subclasses choose the hooks and events."""

    async def _log(self, ctx: stead.HookContext, event: list[Any]) -> None:
        tx = ctx.tx
        assert tx is not None
        raw = await tx.get(ctx.agent_id, "kv.a.ledger")
        items = json.loads(raw) if raw else []
        items.append(event)
        await tx.write(ctx.agent_id, "kv.a.ledger", json.dumps(items))
