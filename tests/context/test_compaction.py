"""K1: compaction at safe boundaries, one-transaction replacement, the archive, overflow recovery, the
circuit breaker (docs/context.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stead
from stead.core.compaction import BREAKER
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.fakes.context import WindowModel, fetch, stored, tool_pairs_ok

WINDOW = 3000


async def _open(url: str, model: WindowModel, **kw: object) -> stead.AgentSystem:
    return await stead.open(url, providers={"m": model.provider}, tools=[fetch], **kw)  # type: ignore[arg-type]


async def test_K1_automatic_compaction_keeps_every_request_within_the_window(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=30)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        result = await agent.run("read thirty pages", check=True)
        assert result.text == "done after 30 fetches"
        current, archive = await stored(system, agent.id)
    assert model.overflows == 0 and model.largest <= WINDOW
    assert model.summaries, "the conversation outgrew the window: it must have been compacted"
    assert current[0]["k"] == "c" and current[0]["x"].startswith("summary #")
    assert archive and tool_pairs_ok([r for r in current if r["k"] != "c"])


async def test_K1_compaction_runs_only_at_safe_boundaries(db_url: str) -> None:
    seen: list[tuple[str, list[str], str | None]] = []

    class Watch(stead.Hooks):
        async def before_compaction(
            self, ctx: stead.HookContext, compaction: stead.extend.CompactionInfo
        ) -> None:
            assert ctx.tx is not None
            entries = [k for k, _ in await ctx.tx.read_prefix(ctx.agent_id, "tool.")]
            raw = await ctx.tx.load(ctx.agent_id)
            seen.append((json.loads(raw[-1])["k"], entries, ctx.inference_id))

    model = WindowModel(window=WINDOW, rounds=25)
    async with await _open(db_url, model, hooks=[Watch()]) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        await agent.run("go", check=True)
    assert seen
    for last, entries, _ in seen:
        assert entries == []  # no batch outstanding: every call has its result
        assert last in ("t", "u", "e")  # after a batch settled, or before a turn's first inference


async def test_K1_reload_equals_memory(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=25)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        await agent.run("go", check=True)
        live = agent._rt.messages()
        assert live == await agent.history()
        aid = agent.id
    async with await _open(db_url, model) as system:
        again = await system.get(aid)
        assert await again.history() == live


async def test_K1_summary_includes_the_previous_summary(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=40)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        await agent.run("go", check=True)
    assert len(model.summaries) >= 2
    for n, request in enumerate(model.summaries[1:], start=1):
        assert f"summary #{n} of" in request.messages[-1].text
    assert "(none yet)" in model.summaries[0].messages[-1].text


async def test_K1_archive_keeps_every_original_record(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=30)
    uncompacted = WindowModel(window=10**9, rounds=30, enforce=False)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW, agent_id="small")
        await agent.run("go", id="msg1", check=True)
        full = await agent.history(include_archived=True)
        current = await agent.history()
    async with await _open(db_url.replace("stead.db", "big.db"), uncompacted) as system:
        agent = await system.create(provider="m", tools=["fetch"], agent_id="big")
        await agent.run("go", id="msg1", check=True)
        reference = await agent.history()
    originals = [m for m in full if not (m.metadata or {}).get("stead.compaction")]
    assert [(m.role, [type(b).__name__ for b in m.content]) for m in originals] == [
        (m.role, [type(b).__name__ for b in m.content]) for m in reference
    ]
    results = [b.output for m in originals for b in m.content if isinstance(b, stead.ToolResult)]
    assert results == [b.output for m in reference for b in m.content if isinstance(b, stead.ToolResult)]
    assert len(current) < len(full)
    markers = {(m.metadata or {}).get("stead.compaction") for m in full} - {None}
    assert len(markers) >= len(model.summaries)  # one marker per compaction (stub-only ones too)


@pytest.mark.sqlite_only(
    "asserts the agent is already settled when compact() returns: SQLite's store never yields to the "
    "event loop, so the settlement runs before the caller resumes; on PostgreSQL it may still be settling"
)
async def test_K1_idle_agent_compacts_on_request_without_an_inference(db_url: str) -> None:
    model = WindowModel(window=10**6, rounds=6, enforce=False)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=100_000)
        await agent.run("go", check=True)
        turns = len(model.turns)
        first, second = await agent.compact(), None
        assert first.reason == "requested" and "summary" in first.passes
        assert first.tokens_after < first.tokens_before
        assert len(model.turns) == turns  # no inference, only the summary
        assert not agent.active
        history = await agent.history()
        assert history[0].role == "system" and "summary #1" in history[0].text
        second = await agent.compact()
        assert second.previous_summary is not None and "summary #1" in second.previous_summary
        runs = await system.runs(agent.id)
        compaction_run = await system.run(runs[0].id)
        kinds = [s.type for s in compaction_run.steps]
        assert kinds == ["prompt", "compaction"]
        step = compaction_run.steps[-1]
        assert step.output["tokens_before"] == second.tokens_before
        assert step.target_log_id == compaction_run.steps[0].id


async def test_K1_concurrent_requests_share_one_compaction(db_url: str) -> None:
    import asyncio

    model = WindowModel(window=10**6, rounds=6, enforce=False)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=100_000)
        await agent.run("go", check=True)
        a, b = await asyncio.gather(agent.compact(), agent.compact())
        assert a.id == b.id and len(model.summaries) == 1


async def test_K1_a_compaction_nobody_will_run_is_rejected(db_url: str) -> None:
    import asyncio

    gate, entered = asyncio.Event(), asyncio.Event()
    model = WindowModel(window=10**6, rounds=3, enforce=False)
    inner = model.respond
    hold = {"purpose": "compaction"}

    async def slow(request: stead.ProviderRequest) -> ScriptedResponse:
        if request.purpose == hold["purpose"]:
            entered.set()
            await gate.wait()
        return inner(request)

    model.provider = ScriptedProvider(slow)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=100_000)
        await agent.run("go", check=True)
        # abort while the summary is being written: rejected, and nothing is left pending
        waiting = asyncio.ensure_future(agent.compact())
        await entered.wait()
        await agent.abort()
        with pytest.raises(stead.CompactionFailed) as info:
            await waiting
        assert info.value.rejected
        async with system.store.transaction() as tx:
            assert await tx.get(agent.id, "q.compact") is None
            assert await tx.get(agent.id, "pending") is None
        assert len(await agent.history()) > 2 and (await agent.history())[0].role == "user"  # unchanged
        # close while a turn runs: the loop stops before the compaction; the waiter is rejected, never left
        # pending (the durable request stays for the next owner, which runs it)
        hold["purpose"], model.rounds = "turn", 0
        entered.clear()
        gate.clear()
        await agent.send("one more")
        await entered.wait()
        waiting = asyncio.ensure_future(agent.compact())
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(system.close())
        await asyncio.sleep(0)
        gate.set()
        await closing
        with pytest.raises(stead.CompactionFailed) as info:
            await waiting
        assert info.value.rejected
    hold["purpose"] = "none"
    async with await _open(db_url, model) as system:
        again = await system.get(agent.id)
        await again.wait_idle()
        assert (await again.history())[0].metadata == {
            "stead.compaction": (await again.history())[0].metadata["stead.compaction"]
        }


async def test_K1_overflow_error_compacts_then_retries_once(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=30)
    async with await _open(db_url, model) as system:
        # no window known: no automatic compaction; the server's refusal triggers the recovery
        agent = await system.create(provider="m", tools=["fetch"])
        result = await agent.run("go", check=True)
        assert result.text == "done after 30 fetches"
        run = await system.run(result.run_id)
    assert model.overflows >= 1 and model.summaries
    failed_prompts = [s for s in run.steps if s.type == "prompt" and s.status == "failed"]
    assert len(failed_prompts) >= 1
    assert any(s.type == "compaction" and s.input["reason"] == "overflow" for s in run.steps)


async def test_K1_overflow_twice_in_a_run_fails_naming_the_largest_record(db_url: str) -> None:
    model = WindowModel(window=600, rounds=3)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"])
        result = await agent.run("x" * 4000)
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "largest record is the user message" in result.error


async def test_K1_oversized_single_result_is_clamped(db_url: str) -> None:
    @stead.tool(name="fetch")
    async def huge(n: int) -> str:
        "A result larger than a quarter of the window."
        return "y " * 6000

    model = WindowModel(window=WINDOW, rounds=2)
    async with await stead.open(db_url, providers={"m": model.provider}, tools=[huge]) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        result = await agent.run("go", check=True)
        current, _ = await stored(system, agent.id)
    assert result.text == "done after 2 fetches" and model.overflows == 0
    clamped = [r for r in current if r["k"] == "t" and "cut" in r]
    assert clamped and all(len(r["b"]["o"]) < 12_000 for r in clamped)
    assert "…[cut: " in clamped[0]["b"]["o"]


async def test_K1_circuit_breaker_stops_automatic_compaction_after_3_failures(db_url: str) -> None:
    model = WindowModel(window=WINDOW, rounds=30, enforce=False, summary_error="summarizer down")
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        result = await agent.run("go", check=True)
        assert result.text == "done after 30 fetches"  # the run goes on without compaction
        run = await system.run(result.run_id)
        failed = [s for s in run.steps if s.type == "compaction" and s.status == "failed"]
        assert len(failed) == BREAKER
        assert len(model.summaries) == BREAKER
        # a requested compaction still runs (and fails here, saying why)
        with pytest.raises(stead.CompactionFailed, match="summarizer down") as info:
            await agent.compact()
        assert not info.value.rejected


async def test_K1_archived_run_results_stay_readable(db_url: str, tmp_path: Path) -> None:
    model = WindowModel(window=WINDOW, rounds=30)
    async with await _open(db_url, model) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=WINDOW)
        first = await agent.run("go", id="first", check=True)
        await agent.compact()
        again = await agent.run("go", id="first")
        assert again.run_id == first.run_id and again.text == first.text
