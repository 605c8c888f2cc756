"""`remember` happens exactly once: under a store crash at every operation of the conversation around it
(`Faults(crash_at=N)`), and under a real SIGKILL right after the tool body ran (inside its transaction) or
right after that transaction committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import stead
from stead.memory import AgentMemory, HashEmbedder, MemoryConfig
from stead.testing import ScriptedProvider
from tests.fakes.crash_points import measured_once, parametrize_crash_at, run_until_crash
from tests.fakes.kill import run_and_kill
from tests.memory import kill_worker as W


class CountingEmbedder(HashEmbedder):
    """Records the store's operation count when the note is embedded (the start of the call)."""

    def __init__(self, faults: stead.testing.Faults | None) -> None:
        super().__init__()
        self.faults = faults
        self.at: int | None = None

    async def embed(self, texts: Any, *, kind: str = "document") -> list[list[float]]:
        if self.faults is not None and W.NOTE in texts and self.at is None:
            self.at = self.faults.ops
        return await super().embed(texts, kind=kind)


def _open(url: str, faults: stead.testing.Faults | None = None, embedder: Any = None) -> stead.system.Opening:
    return stead.open(
        url,
        providers={"scripted": ScriptedProvider(W.respond)},
        faults=faults,
        memory=MemoryConfig(embedder=embedder or HashEmbedder()),
    )


async def _prepare(url: str) -> None:
    async with _open(url) as system:
        await system.create(
            provider="scripted", model="m", agent_id=W.AGENT_ID, extra=AgentMemory(write=True).as_extra()
        )


async def _run_once(url: str, faults: stead.testing.Faults, embedder: Any = None) -> None:
    async def act(system: stead.AgentSystem) -> None:
        agent = await system.get(W.AGENT_ID)
        await agent.send("remember my seat", id=W.MESSAGE_ID, user="u1")
        await agent.wait_idle(timeout=10)

    await run_until_crash(_open(url, faults, embedder), faults, act, close_store=True)


async def assert_written_once(url: str) -> None:
    async with _open(url) as system:
        agent = await system.get(W.AGENT_ID)
        await agent.send("remember my seat", id=W.MESSAGE_ID, user="u1")  # accepted once, whatever happened
        await agent.wait_idle(timeout=10)
        history = await agent.history()
        notes = await system.memory.notes()
        events = await system.memory.events()
        runs = await system.runs(W.AGENT_ID)
        steps = [s for r in runs for s in (await system.run(r.id)).steps if s.type == "memory"]
    results = [b.output for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    assert [n.text for n in notes] == [W.NOTE]
    assert notes[0].user == "u1" and notes[0].status == "provisional"
    assert [e.event for e in events] == ["written"]
    assert len(steps) == 1 and steps[0].output["disposition"] == "written"
    assert len(results) == 1 and results[0].startswith("Memory write: written")
    assert history[-1].text == "noted"


async def _measure(d: Path) -> tuple[int, int]:
    url = f"sqlite:///{d}/count.db?synchronous=off"
    await _prepare(url)
    faults = stead.testing.Faults()
    emb = CountingEmbedder(faults)
    await _run_once(url, faults, emb)
    assert emb.at is not None and not faults.crashed
    return emb.at, faults.ops


call_ops = measured_once(_measure, "stead-mem-")
"""(the store operation at which the remember call starts, the conversation's last operation + 1)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_crash_at(metafunc, lambda: range(call_ops()[0], call_ops()[1] + 1))


async def test_M1_remember_exactly_once_under_a_crash_at_every_store_operation(
    crash_at: int, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/crash.db?synchronous=off"
    await _prepare(url)
    faults = stead.testing.Faults(crash_at=crash_at)
    await _run_once(url, faults)
    await assert_written_once(url)


def test_M1_the_crash_points_cover_the_call() -> None:
    start, end = call_ops()
    assert end - start >= 8, (start, end)


async def _kill(db: Path, mode: str) -> None:
    markers = await run_and_kill(Path(W.__file__), db, mode, until="KILL", kill=False, timeout=60)
    assert markers == ["KILL"]  # the child killed itself at that point


@pytest.mark.parametrize("mode", ["in-tx", "after-commit"])
async def test_M1_remember_exactly_once_across_a_real_sigkill(mode: str, tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    await _kill(db, mode)
    await assert_written_once(f"sqlite:///{db}")
