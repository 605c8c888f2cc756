"""Sub-agent delegation (docs/orchestration.md): each sub-agent is a durable tool; one child per call,
concurrent under a cap, results in call order, failures as error results, abort propagation, bounded depth,
no cycles."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import stead
from stead.orchestration import orchestrator_of
from stead.providers.scripted import ScriptedResponse
from tests.orchestration.support import Responder, last_user, models, results_since_user, run, write_team


def fan_out(target: str, requests: list[str]) -> Responder:
    """A parent: delegates every request to `target` in one response, then answers with the results."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        results = results_since_user(request)
        if not results:
            return [stead.ToolCall(target, {"request": r}) for r in requests]
        return [stead.Text(" | ".join(("ERR " if r.is_error else "") + r.output for r in results))]

    return respond


def echo(prefix: str = "done") -> Responder:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        return [stead.Text(f"{prefix}: {last_user(request)}")]

    return respond


async def until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    """Yield to the event loop until `predicate()` holds (no timed sleeps)."""

    async def spin() -> None:
        while not predicate():  # noqa: ASYNC110 - yields to the loop; no timed waiting
            await asyncio.sleep(0)

    await asyncio.wait_for(spin(), timeout)


async def children(system: stead.AgentSystem, name: str) -> list[stead.Agent]:
    return [await system.get(a.id) for a in await system.agents() if a.name == name]


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return write_team(
        tmp_path / "team",
        {
            "lead": {"sub_agents": ["worker"], "description": "Leads."},
            "worker": {"description": "Does one task."},
        },
    )


async def test_one_child_per_call_results_in_call_order(team: Path, db_url: str) -> None:
    gates = [asyncio.Event() for _ in range(3)]
    started: list[str] = []

    async def worker(request: stead.ProviderRequest) -> list[stead.Block]:
        task = last_user(request)
        started.append(task)
        await gates[int(task[-1])].wait()
        return [stead.Text(f"done: {task}")]

    providers = models(lead=fan_out("worker", ["task 0", "task 1", "task 2"]), worker=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        lead = await system.create(definition="lead")
        tool = system.tools["worker"]
        assert tool.durable and tool.parameters["required"] == ["request"]
        assert set(tool.parameters["properties"]) == {"request", "input"}
        await lead.send("go")
        await until(lambda: len(started) == 3)  # all three run concurrently
        for gate in reversed(gates):  # finish in reverse order
            gate.set()
        await lead.wait_idle(timeout=20)
        answer = (await lead.history())[-1]
        assert answer.text == "done: task 0 | done: task 1 | done: task 2"
        kids = await children(system, "worker")
        assert len(kids) == 3
        for kid in kids:
            history = await kid.history()
            assert [m.role for m in history] == ["user", "assistant"]
            link = history[0].metadata["stead.parent"]
            assert link["agent_id"] == lead.id and link["breadcrumb"] == "lead"
            assert kid._rt.config.extra["stead.chain"] == ["lead", "worker"]
        # run records: the parent's delegation steps are typed sub_agent and point at the child runs
        (root,) = [r for r in await system.runs() if r.parent_run_id is None]
        tree = await system.run(root.id)
        subs = [s for s in tree.steps if s.type == "sub_agent"]
        assert len(subs) == 3 and all(s.target_run_id for s in subs)
        assert sorted(c.id for c in tree.children) == sorted(s.target_run_id for s in subs)  # type: ignore[misc]


async def test_parallel_cap_is_respected(team: Path, db_url: str) -> None:
    gate = asyncio.Event()
    running = 0
    peak = 0

    async def worker(request: stead.ProviderRequest) -> list[stead.Block]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1
        return [stead.Text(f"done: {last_user(request)}")]

    tasks = [f"t{i}" for i in range(5)]
    providers = models(lead=fan_out("worker", tasks), worker=worker)
    async with await stead.open(
        db_url, definitions=team, providers=providers, max_concurrent_delegations=2
    ) as system:
        lead = await system.create(definition="lead")
        await lead.send("go")
        orchestrator = orchestrator_of(system)
        await until(lambda: lead.id in orchestrator._semaphores)
        sem = orchestrator._semaphores[lead.id]
        # two children run, the three other delegations wait on the orchestration semaphore
        await until(lambda: running == 2 and len(sem._waiters or ()) == 3)
        assert len(await children(system, "worker")) == 2
        gate.set()
        await lead.wait_idle(timeout=20)
        assert peak == 2
        assert (await lead.history())[-1].text == " | ".join(f"done: {t}" for t in tasks)
        assert len(await children(system, "worker")) == 5


async def test_failing_child_gives_an_error_result(team: Path, db_url: str) -> None:
    def worker(request: stead.ProviderRequest) -> ScriptedResponse | list[stead.Block]:
        if "bad" in last_user(request):
            return ScriptedResponse(error="the model broke")
        return [stead.Text("fine")]

    providers = models(lead=fan_out("worker", ["good", "bad"]), worker=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        lead = await system.create(definition="lead")
        answer = await run(lead, "go")
        assert answer.text.startswith("fine | ERR ")
        assert "the sub-agent 'worker' failed: the model broke" in answer.text
        results = [b for m in await lead.history() if m.role == "tool" for b in m.content]
        assert [r.is_error for r in results] == [False, True]  # type: ignore[union-attr]
        runs = {r.agent_name: r for r in await system.runs()}
        assert runs["lead"].status == "completed"


@pytest.mark.parametrize("calls", [1, 2])
async def test_abort_of_the_parent_aborts_its_children(team: Path, db_url: str, calls: int) -> None:
    started = 0

    async def worker(request: stead.ProviderRequest) -> list[stead.Block]:
        nonlocal started
        started += 1
        await asyncio.Event().wait()  # never answers
        return []

    providers = models(lead=fan_out("worker", [f"t{i}" for i in range(calls)]), worker=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        lead = await system.create(definition="lead")
        await lead.send("go")
        await until(lambda: started == calls)
        kids = await children(system, "worker")
        assert len(kids) == calls and all(k.active for k in kids)
        await lead.abort()
        for kid in kids:
            await until(lambda kid=kid: not kid.active)  # type: ignore[misc]
            await kid.wait_idle(timeout=10)
        assert not lead.active
        statuses = {r.agent_id: r.status for r in await system.runs()}
        assert statuses[lead.id] == "cancelled"
        assert all(statuses[k.id] == "cancelled" for k in kids)


async def test_depth_is_bounded(tmp_path: Path, db_url: str) -> None:
    team = write_team(
        tmp_path / "chain",
        {"a": {"sub_agents": ["b"]}, "b": {"sub_agents": ["c"]}, "c": {}},
    )
    providers = models(a=fan_out("b", ["to b"]), b=fan_out("c", ["to c"]), c=echo("c did it"))
    async with await stead.open(
        db_url, definitions=team, providers=providers, max_delegation_depth=1
    ) as system:
        a = await system.create(definition="a")
        answer = await run(a, "go")
        assert "ERR" in answer.text and "delegation depth limit (1) is reached (a → b)" in answer.text
        assert await children(system, "c") == []
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        a = await system.create(definition="a")
        assert (await run(a, "go")).text == "c did it: to c"


async def test_a_cycle_at_runtime_is_refused(tmp_path: Path, db_url: str) -> None:
    team = write_team(tmp_path / "cyc", {"a": {"sub_agents": ["b"]}, "b": {}})
    providers = models(a=fan_out("b", ["to b"]), b=fan_out("a", ["back to a"]))
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        a = await system.create(definition="a")
        change = stead.RuntimeChange(action="add", kind="sub_agent", name="a", scope="all-subagents")
        answer = await run(a, "go", changes=[change])
        assert "refused: delegating to 'a' would form a cycle (a → b → a)" in answer.text
        assert len(await children(system, "a")) == 1  # the root only


async def test_redelegation_reattaches_to_the_same_child(team: Path, db_url: str) -> None:
    """Running the delegation again with the same call (as after a crash) finds the same child and the same
    message: no second child, no second request, the same answer."""
    calls = 0

    def worker(request: stead.ProviderRequest) -> list[stead.Block]:
        nonlocal calls
        calls += 1
        return [stead.Text(f"answer {calls}")]

    providers = models(lead=echo(), worker=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        lead = await system.create(definition="lead")
        kv = stead.CallKV(system.store, lead.id, "callzero00001")
        ctx = stead.ToolContext("callzero00001", "worker", lead.id, None, "auto", kv, system.store)
        first = await orchestrator_of(system).delegate("worker", ctx, "do it", None)
        again = await orchestrator_of(system).delegate("worker", ctx, "do it", None)
        assert first == again == "answer 1" and calls == 1
        assert len(await children(system, "worker")) == 1


GATE: asyncio.Event | None = None


@stead.tool(durable=True)
async def slow_step() -> str:
    """Waits for the test's gate."""
    assert GATE is not None
    await GATE.wait()
    return "slow done"


async def test_close_while_delegating_leaves_the_work_for_the_next_owner(tmp_path: Path, db_url: str) -> None:
    global GATE
    GATE = asyncio.Event()
    team = write_team(
        tmp_path / "team",
        {
            "lead": {"sub_agents": ["worker"]},
            "worker": {"tools": ["tests.orchestration.test_delegation:slow_step"]},
        },
    )
    in_tool = asyncio.Event()

    def worker(request: stead.ProviderRequest) -> list[stead.Block]:
        results = results_since_user(request)
        if not results:
            in_tool.set()
            return [stead.ToolCall("slow_step", {})]
        return [stead.Text(f"worker: {results[-1].output}")]

    providers = models(lead=fan_out("worker", ["one"]), worker=worker)
    system = await stead.open(db_url, definitions=team, providers=providers)
    lead = await system.create(definition="lead")
    await lead.send("go")
    await asyncio.wait_for(in_tool.wait(), 10)
    closing = asyncio.get_running_loop().create_task(system.close())
    await until(lambda: system.closing)
    GATE.set()  # the worker's tool finishes; the worker stops before its next request; so does the lead
    await asyncio.wait_for(closing, 10)
    assert lead.active  # durable work left for the next owner, not an error result
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        lead = await system.get(lead.id)
        await lead.wait_idle(timeout=10)
        assert (await lead.history())[-1].text == "worker: slow done"
        assert len(await children(system, "worker")) == 1
