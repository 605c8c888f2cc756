"""Run records (docs/observability.md, issue #4 item 5): `runs`, `run_steps`, `prompt_runs`, parent→child
links and roll-ups, written inside the kernel's own transactions (no extra commits)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.extend import SettledInfo
from stead.observability import RunRecorder, record_guardrail
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import tool_results_since_last_user, url_of
from tests.fakes.tools import delegating_tool, hang, never_finishing

TIMEOUT = 5.0
USAGE = stead.Usage(input_tokens=100, output_tokens=20, cached_tokens=30, cost=0.25)


def tool_loop(tool: str, k: int, args: dict[str, Any] | None = None) -> Any:
    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        n = tool_results_since_last_user(request)
        if n < k:
            return ScriptedResponse(
                [stead.ToolCall(tool, args if args is not None else {"a": n, "b": 1})], USAGE
            )
        return ScriptedResponse([stead.Text(f"done after {n} calls")], USAGE)

    return respond


@stead.tool
async def add(a: int, b: int) -> int:
    "Add two integers."
    return a + b


async def fetch(system: stead.AgentSystem, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    async with system.store.transaction() as tx:
        return await tx.fetch(sql, params)


async def test_tool_loop_conversation_records_run_steps_and_prompt_runs(tmp_path: Path) -> None:
    provider = ScriptedProvider(tool_loop("add", 3))
    async with await stead.open(
        url_of(tmp_path / "r.db"), providers={"scripted": provider}, tools=[add]
    ) as system:
        agent = await system.create(provider="scripted", model="m1", tools=["add"], name="calc")
        await agent.send("add things")
        await agent.wait_idle(timeout=TIMEOUT)
        runs = await system.runs()
        assert len(runs) == 1
        run = await system.run(runs[0].id)
        prompt_runs = await fetch(
            system,
            "SELECT id, run_id, agent_id, model, provider, input_tokens, output_tokens, cached_tokens, cost, "
            "reason, error, latency_ms FROM prompt_runs ORDER BY started_at",
        )
        history = await agent.history()
    assert run.agent_id == agent.id and run.agent_name == "calc" and run.conversation_id == agent.id
    assert run.status == "completed" and run.error is None and run.completed_at is not None
    assert run.final_message == "done after 3 calls"
    assert run.iterations == 4
    assert (run.input_tokens, run.output_tokens, run.cached_tokens) == (400, 80, 120)
    assert run.cost == pytest.approx(1.0) and run.own_cost == pytest.approx(1.0)
    assert run.parent_run_id is None and run.children == []
    # steps: prompt, tool, prompt, tool, prompt, tool, prompt — numbered 1..7 in order
    assert [s.number for s in run.steps] == list(range(1, 8))
    assert [s.type for s in run.steps] == ["prompt", "tool"] * 3 + ["prompt"]
    assert all(s.status == "completed" and s.completed_at is not None for s in run.steps)
    tools = [s for s in run.steps if s.type == "tool"]
    assert [s.input for s in tools] == [{"a": 0, "b": 1}, {"a": 1, "b": 1}, {"a": 2, "b": 1}]
    assert [s.output for s in tools] == ["1", "2", "3"]
    assert all(s.name == "calc: add" and s.target == "add" for s in tools)
    call_ids = [b.id for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    assert [s.id for s in tools] == call_ids  # a tool step's id is its call id
    prompts = [s for s in run.steps if s.type == "prompt"]
    assert all(s.target == "m1" and s.target_log_id == s.id for s in prompts)
    assert [s.output["reason"] for s in prompts] == ["tool_call"] * 3 + ["stop"]
    # one prompt run per response, linked from its step
    assert [p[0] for p in prompt_runs] == [s.target_log_id for s in prompts]
    for p in prompt_runs:
        assert p[1:9] == (run.id, agent.id, "m1", "scripted", 100, 20, 30, 0.25)
        assert p[10] is None and p[11] >= 0
    assert [p[9] for p in prompt_runs] == ["tool_call"] * 3 + ["stop"]


async def test_runs_are_listed_newest_first_and_filtered_by_agent(tmp_path: Path) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("hi")])
    async with await stead.open(url_of(tmp_path / "l.db"), providers={"scripted": provider}) as system:
        a = await system.create(provider="scripted", model="m")
        b = await system.create(provider="scripted", model="m")
        for agent in (a, b, a):
            await agent.send("hello")
            await agent.wait_idle(timeout=TIMEOUT)
        all_runs = await system.runs()
        assert [r.agent_id for r in all_runs] == [a.id, b.id, a.id]
        assert all_runs[0].started_at >= all_runs[1].started_at >= all_runs[2].started_at
        assert [r.id for r in await system.runs(agent_id=a.id)] == [all_runs[0].id, all_runs[2].id]
        assert len(await system.runs(limit=1)) == 1
        assert all(r.steps == [] and r.final_message == "hi" for r in all_runs)
        with pytest.raises(stead.RunNotFound):
            await system.run("nosuchrun")


async def test_failed_run_records_status_failed_with_the_error(tmp_path: Path) -> None:
    provider = ScriptedProvider(lambda r: ScriptedResponse(error="model exploded", retryable=False))
    async with await stead.open(url_of(tmp_path / "f.db"), providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m")
        await agent.send("hello")
        await agent.wait_idle(timeout=TIMEOUT)
        (listed,) = await system.runs()
        run = await system.run(listed.id)
    assert run.status == "failed"
    assert run.error is not None and "model exploded" in run.error
    (step,) = run.steps
    assert step.type == "prompt" and step.status == "failed" and "model exploded" in (step.error or "")


async def test_abort_records_a_cancelled_run_and_cancels_open_tool_steps(tmp_path: Path) -> None:
    wait_forever, started = never_finishing()
    provider = ScriptedProvider(tool_loop("wait_forever", 1, {}))
    async with await stead.open(
        url_of(tmp_path / "a.db"), providers={"scripted": provider}, tools=[wait_forever]
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["wait_forever"])
        await agent.send("go")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        (running,) = await system.runs()
        assert running.status == "running" and running.completed_at is None
        await agent.abort()
        await agent.wait_idle(timeout=TIMEOUT)
        run = await system.run(running.id)
    assert run.status == "cancelled" and run.error == "aborted" and run.completed_at is not None
    assert [(s.type, s.status) for s in run.steps] == [("prompt", "completed"), ("tool", "cancelled")]


async def test_restart_mid_run_keeps_one_run_row_and_completes_it(tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    started = asyncio.Event()

    @stead.tool
    async def slow(a: int, b: int) -> int:
        "Hangs in the first process."
        await hang(started)
        return 0

    faults = stead.store.Faults()
    system = await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(tool_loop("slow", 1))},
        tools=[slow],
        faults=faults,
    )
    agent = await system.create(provider="scripted", model="m", tools=["slow"], name="worker")
    await agent.send("go")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    (before,) = await system.runs()
    # kill the process in place: the store dies at its next operation
    faults.crash_at = faults.ops
    system.abandon()
    with pytest.raises(stead.StoreCrashed):
        async with system.store.transaction() as tx:
            await tx.get("nobody", "pending")

    provider = ScriptedProvider(tool_loop("slow", 1))
    async with await stead.open(url_of(path), providers={"scripted": provider}, tools=[slow]) as system2:
        await (await system2.get(agent.id)).wait_idle(timeout=TIMEOUT)
        runs = await system2.runs()
        run = await system2.run(before.id)
    assert [r.id for r in runs] == [before.id]  # one run row, reused across the restart
    assert run.status == "completed" and run.restarts == 1
    assert run.final_message == "done after 1 calls"
    assert [(s.number, s.type, s.status) for s in run.steps] == [
        (1, "prompt", "completed"),
        (2, "tool", "failed"),  # not durable: in doubt after the crash
        (3, "prompt", "completed"),
    ]
    assert "interrupted" in (run.steps[1].error or "")


async def test_delegation_links_child_run_to_parent_step_and_rolls_up(tmp_path: Path) -> None:
    holder: dict[str, Any] = {}
    delegate = delegating_tool(holder)
    parent_provider = ScriptedProvider(tool_loop("delegate", 1, {"question": "what?"}))
    child_provider = ScriptedProvider(tool_loop("add", 2))
    recorder = RunRecorder(is_sub_agent=lambda name: name == "delegate")
    async with await stead.open(
        url_of(tmp_path / "d.db"),
        providers={"parent": parent_provider, "child": child_provider},
        tools=[delegate, add],
        hooks=[recorder],
    ) as system:
        holder["system"] = system
        parent = await system.create(provider="parent", model="big", tools=["delegate"], name="orchestrator")
        child = await system.create(provider="child", model="small", tools=["add"], name="researcher")
        holder["child"] = child.id
        await parent.send("research this", metadata={"stead.session_id": "session-1"})
        await parent.wait_idle(timeout=TIMEOUT)
        (child_listed,) = await system.runs(agent_id=child.id)
        (parent_listed,) = await system.runs(agent_id=parent.id)
        tree = await system.run(parent_listed.id)
        child_run = await system.run(child_listed.id)
    # the child run links to the parent run and step; the parent's step points at the child run
    assert child_run.parent_run_id == tree.id
    assert tree.session_id == child_run.session_id == "session-1"  # inherited from the parent run
    sub = [s for s in tree.steps if s.type == "sub_agent"]
    assert len(sub) == 1 and sub[0].target_run_id == child_run.id and sub[0].status == "completed"
    assert child_run.parent_step_id == sub[0].id
    # the breadcrumb names the hierarchy
    assert sub[0].name == "orchestrator: delegate"
    assert {s.name for s in child_run.steps if s.type == "tool"} == {"orchestrator → researcher: add"}
    # roll-ups: the child's 3 inferences are added to the parent's totals
    assert (child_run.own_input_tokens, child_run.input_tokens) == (300, 300)
    assert tree.own_input_tokens == 200 and tree.input_tokens == 500
    assert tree.own_cost == pytest.approx(0.5) and tree.cost == pytest.approx(1.25)
    assert tree.output_tokens == 100 and tree.cached_tokens == 150
    # the tree: the child (with its steps) under the parent
    assert [c.id for c in tree.children] == [child_run.id]
    assert [s.type for s in tree.children[0].steps] == ["prompt", "tool", "prompt", "tool", "prompt"]
    assert [r.id for r in tree.walk()] == [tree.id, child_run.id]


async def test_guardrail_steps_are_recorded_in_the_callers_transaction(tmp_path: Path) -> None:
    class Limit(stead.Hooks):
        async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
            assert ctx.tx is not None and ctx.run_id is not None
            await record_guardrail(ctx.tx, ctx.run_id, "max_iterations", "limit of 1 iteration exceeded")

    provider = ScriptedProvider(lambda r: [stead.Text("hi")])
    async with await stead.open(
        url_of(tmp_path / "g.db"), providers={"scripted": provider}, hooks=[Limit()]
    ) as system:
        agent = await system.create(provider="scripted", model="m")
        await agent.send("hello")
        await agent.wait_idle(timeout=TIMEOUT)
        (listed,) = await system.runs()
        run = await system.run(listed.id)
    assert [(s.number, s.type, s.status) for s in run.steps] == [
        (1, "prompt", "completed"),
        (2, "guardrail", "failed"),
    ]
    assert run.steps[1].error == "limit of 1 iteration exceeded"
    assert run.steps[1].output == {"violation": "limit of 1 iteration exceeded"}


async def _commits(path: Path, records: bool) -> tuple[int, int]:
    provider = ScriptedProvider(tool_loop("add", 5))
    async with await stead.open(
        url_of(path), providers={"scripted": provider}, tools=[add], records=records
    ) as system:
        agents = [await system.create(provider="scripted", model="m", tools=["add"]) for _ in range(3)]
        c0 = system.store.commits  # type: ignore[attr-defined]
        for a in agents:
            await a.send("go")
            await a.wait_idle(timeout=TIMEOUT)
        commits = system.store.commits - c0  # type: ignore[attr-defined]
        n_runs = len(await system.runs()) if records else 0
    return commits, n_runs


async def test_records_add_no_commits(tmp_path: Path) -> None:
    on, runs = await _commits(tmp_path / "on.db", True)
    off, _ = await _commits(tmp_path / "off.db", False)
    assert on == off == 3 * 12
    assert runs == 3


async def test_records_off_means_no_recorder(tmp_path: Path) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("hi")])
    async with await stead.open(
        url_of(tmp_path / "n.db"), providers={"scripted": provider}, records=False
    ) as system:
        assert not any(isinstance(h, RunRecorder) for h in system._env.hooks.hooks)
