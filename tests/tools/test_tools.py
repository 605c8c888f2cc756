"""Tool-call promises T1–T7 (docs/promises.md), one focused test (or a few) per promise."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import stead
from stead._ids import is_valid_id
from stead.core.batch import IN_DOUBT_TEXT
from stead.extend import ToolResultInfo
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import tool_results_since_last_user, url_of
from tests.fakes.crash_points import crash, finish_restored
from tests.fakes.tools import hang

FAST_RETRY = stead.RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)
TIMEOUT = 10


def calls_then_text(*batches: list[stead.ToolCall]) -> Callable[[stead.ProviderRequest], list[stead.Block]]:
    """A responder issuing the given batches one response each (by number of results so far), then text."""
    starts: dict[int, list[stead.ToolCall]] = {}
    n = 0
    for batch in batches:
        starts[n] = batch
        n += len(batch)

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = tool_results_since_last_user(request)
        if done in starts:
            return list(starts[done])
        return [stead.Text(f"answered after {done} results")]

    return respond


def tool_blocks(history: list[stead.Message]) -> tuple[list[stead.ToolCall], list[stead.ToolResult]]:
    calls = [b for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    results = [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    return calls, results


def assert_one_result_per_call(history: list[stead.Message]) -> dict[str, stead.ToolResult]:
    calls, results = tool_blocks(history)
    assert Counter(r.call_id for r in results) == Counter(c.id for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    return {r.call_id: r for r in results}


async def open_system(
    path: Path,
    respond: Callable[[stead.ProviderRequest], Any],
    tools: list[stead.Tool],
    *,
    hooks: stead.Hooks | None = None,
    faults: stead.store.Faults | None = None,
) -> tuple[stead.AgentSystem, ScriptedProvider]:
    provider = ScriptedProvider(respond)
    system = await stead.open(
        url_of(path),
        providers={"scripted": provider},
        tools=tools,
        hooks=hooks,
        faults=faults,
        retry=FAST_RETRY,
    )
    return system, provider


@asynccontextmanager
async def after_go(
    path: Path, respond: Callable[[stead.ProviderRequest], Any], tools: list[stead.Tool], **settings: Any
) -> AsyncIterator[stead.Agent]:
    """A new agent offered `tools` (created with `settings`), once it has answered "go" and is idle; its
    system stays open inside the block."""
    system, _ = await open_system(path, respond, tools)
    async with system:
        agent = await system.create(provider="scripted", model="m", tools=[t.name for t in tools], **settings)
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        yield agent


def adder(ran: list[int]) -> stead.Tool:
    """An `add` tool that records the `a` of every call it runs in `ran`."""

    @stead.tool
    async def add(a: int, b: int) -> int:
        "Add."
        ran.append(a)
        return a + b

    return add


async def store_keys(system: stead.AgentSystem, agent_id: str, prefix: str = "") -> dict[str, str]:
    async with system.store.transaction() as tx:
        return dict(await tx.read_prefix(agent_id, prefix))


# ---------------------------------------------------------------------------------------------- T1
async def test_T1_batch_is_committed_before_any_call_runs(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    @stead.tool
    async def probe(n: int, ctx: stead.ToolContext) -> str:
        "Look at the durable state while running."
        async with ctx.store.transaction() as tx:
            entries = [json.loads(v) for _, v in await tx.read_prefix(ctx.agent_id, "tool.")]
            pending = json.loads(await tx.get(ctx.agent_id, "pending") or "null")
        seen.append({"n": n, "entries": entries, "pending": pending})
        return "ok"

    respond = calls_then_text([stead.ToolCall("probe", {"n": 0}), stead.ToolCall("probe", {"n": 1})])
    async with after_go(tmp_path / "t1.db", respond, [probe]) as agent:
        assert_one_result_per_call(await agent.history())
    assert len(seen) == 2
    for s in seen:
        assert s["pending"]["st"] == "tools"
    # the first call to run already found the whole batch durable, with the stage `tools`
    assert sorted(e["a"]["n"] for e in seen[0]["entries"]) == [0, 1]


# ---------------------------------------------------------------------------------------------- T2
async def test_T2_calls_run_concurrently_results_commit_in_call_order(tmp_path: Path) -> None:
    last_started = asyncio.Event()
    finished: list[int] = []

    @stead.tool
    async def step(n: int) -> str:
        "Call 0 waits for call 2 to start, so they can only finish if they run concurrently."
        if n == 2:
            last_started.set()
        if n == 0:
            await asyncio.wait_for(last_started.wait(), TIMEOUT)
        finished.append(n)
        return f"step {n}"

    batch = [stead.ToolCall("step", {"n": i}) for i in range(3)]
    async with after_go(tmp_path / "t2.db", calls_then_text(batch), [step]) as agent:
        history = await agent.history()
    assert finished[-1] == 0  # call 0 finished last ...
    calls, results = tool_blocks(history)
    assert [r.call_id for r in results] == [c.id for c in calls]  # ... yet results are in call order
    assert [r.output for r in results] == ["step 0", "step 1", "step 2"]


async def test_T2_concurrency_is_bounded(tmp_path: Path) -> None:
    running = 0
    peak = 0
    gate = asyncio.Event()
    started = 0

    @stead.tool
    async def slow(n: int) -> str:
        "Count how many run at once."
        nonlocal running, peak, started
        running += 1
        started += 1
        peak = max(peak, running)
        if started == 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), TIMEOUT)
        running -= 1
        return str(n)

    batch = [stead.ToolCall("slow", {"n": i}) for i in range(5)]
    async with after_go(tmp_path / "t2b.db", calls_then_text(batch), [slow], max_tool_concurrency=2) as agent:
        assert_one_result_per_call(await agent.history())
    assert peak == 2


# ---------------------------------------------------------------------------------------------- T3
async def test_T3_result_commit_is_one_transaction_and_first_result_wins(tmp_path: Path) -> None:
    executions = 0
    inspected: list[dict[str, Any]] = []
    failures = [1]  # the first result commit fails inside its transaction

    @stead.tool
    async def remember(ctx: stead.ToolContext) -> str:
        "Write call-bound state, then finish."
        nonlocal executions
        executions += 1
        await ctx.kv.set("note", "x")
        return "remembered"

    class Inspect(stead.Hooks):
        async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
            tx = ctx.tx
            assert tx is not None
            keys = [k for k, _ in await tx.read_prefix(ctx.agent_id, "")]
            records = [json.loads(r) for r in await tx.load(ctx.agent_id)]
            inspected.append(
                {
                    "entry": any(k.startswith("tool.") and k.endswith(info.call.id or "") for k in keys),
                    "kv": [k for k in keys if k.startswith(f"kv.c.{info.call.id}.")],
                    "results": [r for r in records if r["k"] == "t"],
                }
            )
            if failures:
                failures.pop()
                raise RuntimeError("refuse this commit")

    respond = calls_then_text([stead.ToolCall("remember", {})])
    system, _ = await open_system(tmp_path / "t3.db", respond, [remember], hooks=Inspect())
    system._env.store_retry_delay = 0.001
    async with system:
        agent = await system.create(provider="scripted", model="m", tools=["remember"])
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
        left = await store_keys(system, agent.id)
    # inside the commit: entry deleted, result appended, call KV erased — all in the same transaction
    assert len(inspected) == 2
    for seen in inspected:
        assert not seen["entry"] and seen["kv"] == [] and len(seen["results"]) == 1
    # the refused commit left nothing behind; the retry committed exactly one result; no re-execution
    results = assert_one_result_per_call(history)
    assert [r.output for r in results.values()] == ["remembered"]
    assert executions == 1
    assert not any(k.startswith(("tool.", "kv.c.")) for k in left)


# ---------------------------------------------------------------------------------------------- T4
async def test_T4_cut_off_response_settles_its_calls_with_error_results(tmp_path: Path) -> None:
    ran: list[str] = []

    @stead.tool
    async def act(n: int) -> str:
        "Act."
        ran.append(str(n))
        return "acted"

    attempts = 0

    def respond(request: stead.ProviderRequest) -> ScriptedResponse | list[stead.Block]:
        nonlocal attempts
        attempts += 1
        if attempts == 1:  # the stream stops right after the call completed, without a terminal event
            return ScriptedResponse(blocks=[stead.ToolCall("act", {"n": 1})], end_after=1)
        return [stead.Text("recovered")]

    async with after_go(tmp_path / "t4.db", respond, [act]) as agent:
        history = await agent.history()
    results = assert_one_result_per_call(history)
    assert len(results) == 1
    (result,) = results.values()
    assert result.is_error and "not run" in result.output.lower()
    assert ran == []
    assert history[-1].text == "recovered"


async def test_T4_failing_turn_that_owes_results_settles_them_first(tmp_path: Path) -> None:
    @stead.tool
    async def act(n: int) -> str:
        "Act."
        raise AssertionError("must not run")

    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        return ScriptedResponse(
            blocks=[stead.ToolCall("act", {"n": 1}), stead.ToolCall("act", {"n": 2})],
            error="provider exploded",
            end_after=2,
            retryable=False,
        )

    async with after_go(tmp_path / "t4b.db", respond, [act]) as agent:
        history = await agent.history()
        assert not agent.active
    results = assert_one_result_per_call(history)
    assert len(results) == 2
    assert all(r.is_error for r in results.values())
    assert history[-1].role == "system" and "The last turn failed" in history[-1].text


# ---------------------------------------------------------------------------------------------- T5
class _Blocking:
    """Tool bodies for the interrupted-call tests: the first execution blocks until the process dies."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.block = True
        self.runs: list[tuple[str, bool]] = []

    async def body(self, ctx: stead.ToolContext, effect: Callable[[], Any] | None = None) -> str:
        self.runs.append((ctx.call_id, ctx.resumed))
        if effect is not None:
            await effect()
        if self.block:
            await hang(self.started)  # the process "dies" here
        return f"finished {len(self.runs)}"


async def _interrupt_and_resume(
    tmp_path: Path, tool_obj: stead.Tool, state: _Blocking
) -> tuple[list[stead.Message], stead.ToolCall]:
    """Run one call of `tool_obj`, kill the process while it runs, resume in a new system."""
    path = tmp_path / "t5.db"
    respond = calls_then_text([stead.ToolCall(tool_obj.name, {})])
    faults = stead.store.Faults()
    system, _ = await open_system(path, respond, [tool_obj], faults=faults)
    agent = await system.create(provider="scripted", model="m", tools=[tool_obj.name])
    await agent.send("go")
    await asyncio.wait_for(state.started.wait(), TIMEOUT)
    await crash(system, faults)
    state.block = False
    system2, _ = await open_system(path, respond, [tool_obj])
    async with system2:
        history, left = await finish_restored(system2, agent.id, TIMEOUT)
    assert not any(k.startswith(("tool.", "kv.c.", "pending")) for k in left)
    assert_one_result_per_call(history)
    calls, _ = tool_blocks(history)
    assert history[-1].text == "answered after 1 results"
    return history, calls[0]


def _result(history: list[stead.Message], call: stead.ToolCall) -> stead.ToolResult:
    return assert_one_result_per_call(history)[call.id or ""]


async def test_T5_interrupted_non_durable_call_is_in_doubt(tmp_path: Path) -> None:
    state = _Blocking()

    @stead.tool
    async def charge(ctx: stead.ToolContext) -> str:
        "An effect that must happen at most once."
        return await state.body(ctx)

    history, call = await _interrupt_and_resume(tmp_path, charge, state)
    result = _result(history, call)
    assert result.is_error and result.output == IN_DOUBT_TEXT
    assert state.runs == [(call.id, False)]  # it ran once, and never again


async def test_T5_interrupted_durable_call_runs_again_with_the_same_id(tmp_path: Path) -> None:
    state = _Blocking()

    @stead.tool(durable=True)
    async def sync_repo(ctx: stead.ToolContext) -> str:
        "Safe to repeat."
        return await state.body(ctx)

    history, call = await _interrupt_and_resume(tmp_path, sync_repo, state)
    result = _result(history, call)
    assert not result.is_error and result.output == "finished 2"
    assert state.runs == [(call.id, False), (call.id, True)]


async def test_T5_interrupted_transactional_call_had_no_effect_and_runs_again(tmp_path: Path) -> None:
    state = _Blocking()
    effects: list[Any] = []

    @stead.tool(transactional=True)
    async def book(ctx: stead.ToolContext) -> str:
        "Writes in the result's transaction."
        tx = ctx.tx
        assert tx is not None

        async def effect() -> None:
            raw = await tx.get(ctx.agent_id, "kv.a.bookings")
            effects.append(raw)
            await tx.write(ctx.agent_id, "kv.a.bookings", json.dumps(json.loads(raw or "0") + 1))

        return await state.body(ctx, effect)

    history, call = await _interrupt_and_resume(tmp_path, book, state)
    result = _result(history, call)
    assert not result.is_error and result.output == "finished 2"
    assert [cid for cid, _ in state.runs] == [call.id, call.id]
    # the first execution's write died with its transaction: the second one saw nothing
    assert effects == [None, None]


@pytest.mark.parametrize("decision", ["value", "run_again", "in_doubt"])
async def test_T5_reconcile_decides_an_interrupted_call(tmp_path: Path, decision: str) -> None:
    state = _Blocking()
    reconciled: list[Any] = []

    @stead.tool
    async def send_email(ctx: stead.ToolContext) -> str:
        "Sends an email at most once."

        async def effect() -> None:
            if state.block:
                await ctx.kv.set("sent", "msg-42")  # durable evidence, then the process dies

        return await state.body(ctx, effect)

    @send_email.reconcile
    async def _reconcile(ctx: stead.ToolContext) -> Any:
        evidence = await ctx.kv.get("sent")
        reconciled.append(evidence)
        if decision == "value":
            return {"sent": evidence}
        return stead.RUN_AGAIN if decision == "run_again" else stead.IN_DOUBT

    history, call = await _interrupt_and_resume(tmp_path, send_email, state)
    result = _result(history, call)
    assert reconciled == ["msg-42"]  # reconcile saw the call-bound KV the interrupted run wrote
    if decision == "value":
        assert not result.is_error and json.loads(result.output) == {"sent": "msg-42"}
        assert len(state.runs) == 1
    elif decision == "run_again":
        assert not result.is_error and result.output == "finished 2"
        assert state.runs == [(call.id, False), (call.id, True)]
    else:
        assert result.is_error and result.output == IN_DOUBT_TEXT
        assert len(state.runs) == 1


# ---------------------------------------------------------------------------------------------- T6
async def test_T6_invalid_calls_get_error_results_and_the_batch_continues(tmp_path: Path) -> None:
    ran: list[int] = []
    add = adder(ran)

    @stead.tool
    async def explode() -> str:
        "Always fails."
        raise ValueError("kaboom")

    batch = [
        stead.ToolCall("nope", {}),  # unknown tool
        stead.ToolCall("add", "{not json"),  # invalid JSON arguments
        stead.ToolCall("add", {"a": "three", "b": 1}),  # schema mismatch
        stead.ToolCall("explode", {}),  # the tool raises
        stead.ToolCall("add", {"a": 2, "b": 3}),  # fine
    ]
    async with after_go(tmp_path / "t6.db", calls_then_text(batch), [add, explode]) as agent:
        history = await agent.history()
    calls, results = tool_blocks(history)
    assert_one_result_per_call(history)
    assert [r.call_id for r in results] == [c.id for c in calls]
    unknown, bad_json, mismatch, raised, fine = results
    assert unknown.is_error and "Unknown tool 'nope'" in unknown.output
    assert bad_json.is_error and "not valid JSON" in bad_json.output
    assert mismatch.is_error and "schema" in mismatch.output and "a" in mismatch.output
    assert raised.is_error and "ValueError" in raised.output and "kaboom" in raised.output
    assert not fine.is_error and fine.output == "5"
    assert ran == [2]
    assert history[-1].text == "answered after 5 results"


async def test_T6_duplicate_call_ids_in_one_response_are_kept_once(tmp_path: Path) -> None:
    ran: list[int] = []
    add = adder(ran)

    batch = [
        stead.ToolCall("add", {"a": 1, "b": 1}, id="dupcall"),
        stead.ToolCall("add", {"a": 9, "b": 9}, id="dupcall"),
    ]
    async with after_go(tmp_path / "t6b.db", calls_then_text(batch), [add]) as agent:
        history = await agent.history()
    calls, results = tool_blocks(history)
    assert [c.id for c in calls] == ["dupcall"]
    assert [r.call_id for r in results] == ["dupcall"]
    assert ran == [1]  # the duplicate never ran


# ---------------------------------------------------------------------------------------------- T7
async def test_T7_call_ids_are_stead_generated_cuid2(tmp_path: Path) -> None:
    seen: list[str] = []

    @stead.tool
    async def echo(ctx: stead.ToolContext) -> str:
        "Echo the call id."
        seen.append(ctx.call_id)
        return ctx.call_id

    batch = [stead.ToolCall("echo", {}), stead.ToolCall("echo", {})]
    async with after_go(tmp_path / "t7.db", calls_then_text(batch), [echo]) as agent:
        history = await agent.history()
    calls, results = tool_blocks(history)
    assert all(c.id is not None and is_valid_id(c.id) for c in calls)
    assert sorted(seen) == sorted(c.id for c in calls)
    assert [r.output for r in results] == [c.id for c in calls]


async def test_T7_call_kv_get_or_create_is_stable_across_a_resume_and_erased_after_the_result(
    tmp_path: Path,
) -> None:
    state = _Blocking()
    keys: list[str] = []
    factory_calls = 0
    handles: list[stead.CallKV] = []

    def new_key() -> str:
        nonlocal factory_calls
        factory_calls += 1
        return f"idem-{factory_calls}"

    @stead.tool(durable=True)
    async def pay(ctx: stead.ToolContext) -> str:
        "Pay with a retry-stable idempotency key."

        async def effect() -> None:
            keys.append(await ctx.kv.get_or_create("idempotency", new_key))
            handles.append(ctx.kv)

        return await state.body(ctx, effect)

    history, call = await _interrupt_and_resume(tmp_path, pay, state)
    assert _result(history, call).output == "finished 2"
    assert keys == ["idem-1", "idem-1"]  # the second execution got the first one's key
    assert factory_calls == 1
    # the KV of the finished call is gone (checked in _interrupt_and_resume) and its handle refuses use
    with pytest.raises(stead.StoreError):
        await handles[-1].get("idempotency")
