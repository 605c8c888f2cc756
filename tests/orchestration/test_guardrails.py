"""Guardrails (docs/orchestration.md): a definition's per-run limits. Exceeding one ends the run `failed`
with the limit recorded on a guardrail step and as the run error, without calling the model again; a call
beyond `max_calls` gets an error result. Counters live in the run KV and survive a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import stead
from stead.orchestration import GUARD_KEY
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.orchestration.support import models, results_since_user, write_team

NOW = [1000.0]


@stead.tool
def tick() -> str:
    """Does a little work (and, in the wall-time test, lets the injected clock advance)."""
    NOW[0] += 100.0
    return "ticked"


HERE = "tests.orchestration.test_guardrails"


def looping(usage: stead.Usage | None = None) -> Any:
    """A model that calls `tick` forever (one call per response)."""

    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        return ScriptedResponse(blocks=[stead.ToolCall("tick", {})], usage=usage)

    return respond


def team(tmp_path: Path, limits: dict[str, Any]) -> Path:
    return write_team(tmp_path / "team", {"solo": {"tools": [f"{HERE}:tick"], "limits": limits}})


async def run_solo(
    directory: Path, db_url: str, respond: Any, **open_kw: Any
) -> tuple[stead.Run, ScriptedProvider, list[stead.Message]]:
    provider = ScriptedProvider(respond)
    async with await stead.open(
        db_url, definitions=directory, providers={"scripted/solo": provider}, **open_kw
    ) as system:
        agent = await system.create(definition="solo")
        await agent.send("go")
        await agent.wait_idle(timeout=20)
        assert not agent.active
        (summary,) = await system.runs()
        return await system.run(summary.id), provider, await agent.history()


def guard_steps(run: stead.Run) -> list[stead.Step]:
    return [s for s in run.steps if s.type == "guardrail"]


async def test_max_iterations(tmp_path: Path, db_url: str) -> None:
    run, provider, history = await run_solo(team(tmp_path, {"max_iterations": 2}), db_url, looping())
    assert len(provider.requests) == 2  # the third request was never made
    assert run.status == "failed"
    assert run.error == "guardrail max_iterations exceeded: 2 of 2 model requests used"
    (step,) = guard_steps(run)
    assert step.status == "failed" and step.target == "max_iterations" and step.error == run.error
    assert step.output == {"violation": run.error}
    assert history[-1].role == "system" and history[-1].text == f"The last turn failed: {run.error}"


async def test_max_tokens(tmp_path: Path, db_url: str) -> None:
    usage = stead.Usage(input_tokens=10, output_tokens=20)
    run, provider, _ = await run_solo(team(tmp_path, {"max_tokens": 50}), db_url, looping(usage))
    assert len(provider.requests) == 2  # 30, then 60 ≥ 50: no third request
    assert (
        run.status == "failed"
        and run.error is not None
        and run.error.startswith("guardrail max_tokens exceeded")
    )
    assert [s.target for s in guard_steps(run)] == ["max_tokens"]


async def test_max_cost(tmp_path: Path, db_url: str) -> None:
    usage = stead.Usage(input_tokens=1, output_tokens=1, cost=0.01)
    run, provider, _ = await run_solo(team(tmp_path, {"max_cost": 0.025}), db_url, looping(usage))
    assert len(provider.requests) == 3
    assert run.error == "guardrail max_cost exceeded: $0.0300 spent, the limit is $0.0250"
    assert [s.target for s in guard_steps(run)] == ["max_cost"]


async def test_max_wall_seconds_with_an_injected_clock(tmp_path: Path, db_url: str) -> None:
    NOW[0] = 1000.0
    directory = team(tmp_path, {"max_wall_seconds": 250})
    run, provider, _ = await run_solo(directory, db_url, looping(), clock=lambda: NOW[0])
    # each tool call advances the clock by 100 s: requests at t=0, 100, 200; at 300 ≥ 250 the run stops
    assert len(provider.requests) == 3
    assert run.error == "guardrail max_wall_seconds exceeded: the run has taken 300.0s, the limit is 250s"
    assert [s.target for s in guard_steps(run)] == ["max_wall_seconds"]


async def test_max_calls_per_tool(tmp_path: Path, db_url: str) -> None:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        results = results_since_user(request)
        if not results:
            return [stead.ToolCall("tick", {}) for _ in range(3)]
        if len(results) == 3:
            return [stead.ToolCall("tick", {})]
        return [stead.Text(" | ".join(("ERR " if r.is_error else "") + r.output[:40] for r in results))]

    run, _, history = await run_solo(team(tmp_path, {"max_calls": {"tick": 2}}), db_url, respond)
    assert run.status == "completed"
    refused = "ERR guardrail max_calls.tick exceeded: 'tick"
    assert history[-1].text == f"ticked | ticked | {refused} | {refused}"
    steps = guard_steps(run)
    assert [s.target for s in steps] == ["max_calls.tick", "max_calls.tick"]
    assert all(s.status == "failed" for s in steps)
    tool_steps = [s for s in run.steps if s.type == "tool"]
    assert [s.status for s in tool_steps] == ["completed", "completed", "failed", "failed"]


async def test_no_limits_no_guard_state(tmp_path: Path, db_url: str) -> None:
    directory = write_team(tmp_path / "free", {"solo": {"tools": [f"{HERE}:tick"]}})

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        return [stead.Text("free")]

    run, _, _ = await run_solo(directory, db_url, respond)
    assert run.status == "completed" and guard_steps(run) == []


async def test_counters_survive_a_restart(tmp_path: Path, db_url: str) -> None:
    """The counters are written in the kernel's transactions: work that committed before the process died
    counts after the restart, work that did not commit does not."""
    directory = team(tmp_path, {"max_iterations": 3})
    hang = asyncio.Event()

    async def first(request: stead.ProviderRequest) -> list[stead.Block]:
        if results_since_user(request):
            hang.set()
            await asyncio.Event().wait()  # the second request never returns: the process dies
        return [stead.ToolCall("tick", {})]

    system = await stead.open(db_url, definitions=directory, providers=models(solo=first))
    agent = await system.create(definition="solo")
    await agent.send("go")
    await asyncio.wait_for(hang.wait(), 10)
    async with system.store.transaction() as tx:
        state = json.loads(await tx.get(agent.id, GUARD_KEY) or "{}")
    assert state["it"] == 1 and "t0" in state
    system.abandon()
    await system.store.close()

    provider = ScriptedProvider(looping())
    async with await stead.open(
        db_url, definitions=directory, providers={"scripted/solo": provider}
    ) as system:
        agent = await system.get(agent.id)
        await agent.wait_idle(timeout=20)
        (summary,) = await system.runs()
        run = await system.run(summary.id)
    assert len(provider.requests) == 2  # inferences 2 and 3; the 4th is refused
    assert (
        run.status == "failed"
        and run.error == "guardrail max_iterations exceeded: 3 of 3 model requests used"
    )
