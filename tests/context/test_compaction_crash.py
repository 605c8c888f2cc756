"""K1: the replacement is atomic — the store dies at every operation of a compaction (crash points), and a
real process is SIGKILLed while its summary request is in flight. After each crash the history is wholly
the old one or wholly the new one, nothing is lost from the archive, and the compaction is re-run (the
request was durable) or was never accepted — never half done."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import stead
import stead.testing
from stead.core.records import full_records
from tests.fakes.context import WindowModel, fetch, stored, tool_pairs_ok
from tests.fakes.kill import run_and_kill

WORKER = Path(__file__).resolve().parent / "compact_worker.py"
AGENT = "crashcompact01"


async def _open(
    url: str, model: WindowModel, faults: stead.testing.Faults | None = None
) -> stead.AgentSystem:
    return await stead.open(url, providers={"m": model.provider}, tools=[fetch], faults=faults)


async def _prepare(url: str) -> list[dict[str, Any]]:
    model = WindowModel(window=10**6, rounds=6, enforce=False)
    async with await _open(url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], agent_id=AGENT, context_window=100_000)
        await agent.run("go", id="first", check=True)
        current, archive = await stored(system, AGENT)
    assert archive == []
    return current


def _check(
    current: list[dict[str, Any]], archive: list[tuple[str, str]], original: list[dict[str, Any]]
) -> bool:
    """Wholly old or wholly new; returns whether the compaction is in."""
    if current == original:
        assert archive == []
        return False
    assert current[0]["k"] == "c" and current[0]["n"] <= len(current)
    assert full_records(archive, current)[: len(original)] == original
    assert tool_pairs_ok([r for r in current if r["k"] != "c"])
    return True


async def test_K1_replacement_is_atomic_at_every_store_operation(tmp_path: Path) -> None:
    clean = tmp_path / "clean.db"
    url = f"sqlite:///{clean}"
    await _prepare(url)
    faults = stead.testing.Faults()
    model = WindowModel(window=10**6, enforce=False)
    system = await _open(url, model, faults)
    agent = await system.get(AGENT)
    start = faults.ops
    await agent.compact()
    total = faults.ops - start
    await system.close()
    assert total > 5
    outcomes = set()
    for i in range(total + 1):
        db = tmp_path / f"crash{i}.db"
        url = f"sqlite:///{db}"
        original = await _prepare(url)
        faults = stead.testing.Faults()
        system = await _open(url, model, faults)
        agent = await system.get(AGENT)
        faults.crash_at = faults.ops + i
        try:
            await asyncio.wait_for(agent.compact(), 10)
            crashed = False
        except (stead.StoreCrashed, stead.CompactionFailed):
            crashed = True
        if crashed:
            system.abandon()
        else:
            await system.close()
        # a new owner: the history is wholly old or wholly new; a durable request is run to the end
        async with await _open(url, model) as again:
            async with again.store.transaction() as tx:
                requested = await tx.get(AGENT, "q.compact") is not None
            current, archive = await stored(again, AGENT)
            done = _check(current, archive, original)
            assert not (done and requested), "a carried-out compaction left its request behind"
            a = await again.get(AGENT)
            await a.wait_idle(timeout=10)
            current, archive = await stored(again, AGENT)
            final = _check(current, archive, original)
            assert final == (done or requested)
            assert sum(1 for r in current if r["k"] == "c") <= 1
            assert not a.active
            outcomes.add((crashed, done, requested))
    assert (False, True, False) in outcomes and any(req for _, _, req in outcomes)


async def test_K1_sigkill_during_the_summary_request(tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    original = await _prepare(f"sqlite:///{db}")
    markers = await run_and_kill(WORKER, db, until="SUMMARY")
    assert markers == ["SUMMARY"]
    model = WindowModel(window=10**6, enforce=False)
    async with await _open(f"sqlite:///{db}", model) as system:
        current, archive = await stored(system, AGENT)
        assert current == original and archive == []  # wholly the old history
        assert system.restored == [AGENT]  # the durable request: the compaction is re-run
        agent = await system.get(AGENT)
        await agent.wait_idle(timeout=10)
        current, archive = await stored(system, AGENT)
        assert _check(current, archive, original)
        assert len(model.summaries) == 1 and not agent.active
        history = await agent.history(include_archived=True)
    assert [json.dumps(m.content, default=str) for m in history if not m.metadata] != []
