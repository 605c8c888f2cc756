"""Text no store can hold (issue 20, item 4): S5 repair at the boundary, A7 refusal of such input, and C7 the
poison-input breaker (docs/promises.md).

A lone surrogate (`"\\ud800"`: a Python `str` can hold it, UTF-8 cannot encode it) in a tool result or in
model output made every commit fail; the loop retried every 50 ms for ever, for model output with a new
(billed) model request each time, and again after a restart. Now such text is replaced with U+FFFD where it
comes in and the block is marked `repaired`; input from callers carrying it is refused; and a write that
keeps failing for the same input stops after `POISON_ATTEMPTS` attempts with a failed turn.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.agent import check_message
from stead.core.runtime import POISON_ATTEMPTS
from stead.extend import BeforeToolCallInfo, BlockInfo, ToolOutputInfo, ToolResultInfo
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import conversation_records, tool_results_since_last_user
from tests.core.test_abort_settle_close import EventLog
from tests.tools.test_tools import FAST_RETRY, TIMEOUT, assert_one_result_per_call

LONE = "\ud800"
FFFD = "\ufffd"


def blocks_of(history: list[stead.Message], role: str) -> list[stead.Block]:
    return [b for m in history for b in m.content if m.role == role]


def stored_blocks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["b"] for r in records if r["k"] in ("b", "t")]


async def run_once(
    db_url: str, provider: ScriptedProvider, tools: list[stead.Tool], hooks: Any = None
) -> tuple[stead.RunResult, list[stead.Message], list[dict[str, Any]], str]:
    """One agent offered `tools` runs "go": its result, history, stored records and id."""
    async with await stead.open(
        db_url, providers={"scripted": provider}, tools=tools, hooks=hooks, retry=FAST_RETRY
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=[t.name for t in tools])
        result = await asyncio.wait_for(agent.run("go"), TIMEOUT)
        return result, await agent.history(), await conversation_records(system, agent.id), agent.id


# ---------------------------------------------------------------------------------------------- S5
async def test_S5_a_lone_surrogate_in_model_output_is_repaired_and_marked(db_url: str) -> None:
    @stead.tool(effects="read")
    async def look(q: str) -> str:
        "Echo the query it got."
        return f"looked for {q}"

    def respond(request: stead.ProviderRequest) -> list[stead.Block] | ScriptedResponse:
        if tool_results_since_last_user(request) == 0:
            return ScriptedResponse(
                blocks=[
                    stead.Reasoning(f"think {LONE}", signature=f"sig{LONE}"),
                    stead.Text(f"calling \udfff{LONE} and a pair \ud83d\ude00"),
                    stead.ToolCall("look", {"q": f"x{LONE}", f"k{LONE}": 1}),
                    stead.ToolCall(f"look{LONE}", {}),
                ],
                chunk=3,
            )
        return [stead.Text(f"done {LONE}")]

    provider = ScriptedProvider(respond)
    log = EventLog()
    result, history, records, agent_id = await run_once(db_url, provider, [look], log)
    assert len(provider.requests) == 2  # no retry loop: every commit went through at once
    assert result.outcome is stead.Outcome.COMPLETED and result.text == f"done {FFFD}"
    reasoning, text, call, bad_name, answer = blocks_of(history, "assistant")
    assert reasoning == stead.Reasoning(f"think {FFFD}", f"sig{FFFD}", repaired=True)
    assert text == stead.Text(f"calling {FFFD}{FFFD} and a pair \U0001f600", repaired=True)
    assert isinstance(call, stead.ToolCall) and call.repaired
    assert call.arguments == {"q": f"x{FFFD}", f"k{FFFD}": 1}
    assert isinstance(bad_name, stead.ToolCall) and bad_name.name == f"look{FFFD}" and bad_name.repaired
    assert answer == stead.Text(f"done {FFFD}", repaired=True)
    results = assert_one_result_per_call(history)
    assert results[call.id or ""].output == f"looked for x{FFFD}"
    assert results[bad_name.id or ""].is_error  # an unknown tool, named as repaired
    # the mark is stored ("f": 1) on exactly the repaired blocks, and survives a reload
    assert [b.get("f") for b in stored_blocks(records)] == [1, 1, 1, 1, None, None, 1]
    async with await stead.open(db_url, providers={"scripted": provider}, tools=[look]) as again:
        assert await (await again.get(agent_id)).history() == history
    # observers saw the repaired blocks and deltas only
    ends = [e.block for e in log.events if isinstance(e, stead.BlockEnd)]
    assert ends == [reasoning, text, call, bad_name, answer]
    deltas = "".join(e.text for e in log.events if isinstance(e, stead.TextDelta | stead.ReasoningDelta))
    deltas.encode("utf-8")  # every delta can be encoded (and so shown, streamed, stored)


async def test_S5_a_lone_surrogate_in_a_tool_result_is_repaired_and_marked(db_url: str) -> None:
    runs: list[str] = []

    @stead.tool(effects="read")
    async def plain() -> str:
        "A result with a lone surrogate."
        runs.append("plain")
        return f"plain {LONE}"

    @stead.tool(effects="read", transactional=True)
    async def atomic(ctx: stead.ToolContext) -> dict[str, str]:
        "A transactional tool whose result holds one (a dict rendered as JSON)."
        runs.append("atomic")
        return {"k": f"v{LONE}"}

    @stead.tool(effects="read", durable=True)
    async def failing() -> str:
        "Raises with a lone surrogate in its message."
        runs.append("failing")
        raise ValueError(f"bad {LONE}")

    @stead.tool(effects="read")
    async def clean() -> str:
        "A result without one."
        runs.append("clean")
        return "clean é"

    names = ["plain", "atomic", "failing", "clean"]

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if tool_results_since_last_user(request) == 0:
            return [stead.ToolCall(n, {}) for n in names]
        return [stead.Text("done")]

    provider = ScriptedProvider(respond)
    result, history, records, _ = await run_once(db_url, provider, [plain, atomic, failing, clean])
    assert result.outcome is stead.Outcome.COMPLETED and len(provider.requests) == 2
    assert sorted(runs) == sorted(names)  # each ran once
    results = blocks_of(history, "tool")
    assert [(r.output, r.repaired) for r in results if isinstance(r, stead.ToolResult)] == [
        (f"plain {FFFD}", True),
        (json.dumps({"k": f"v{FFFD}"}, separators=(",", ":"), ensure_ascii=False), True),
        (f"Tool 'failing' failed: ValueError: bad {FFFD}", True),
        ("clean é", False),
    ]
    assert [b.get("f") for b in stored_blocks(records) if b["t"] == "r"] == [1, 1, 1, None]
    # the model's next request carried the repaired results
    sent = [b for m in provider.requests[1].messages for b in m.content if isinstance(b, stead.ToolResult)]
    assert sent == results


async def test_S5_a_lone_surrogate_from_tool_hooks_is_repaired(db_url: str) -> None:
    """A result a hook gives (`before_tool_call`, `tool_output`) is repaired as it commits."""

    class Answers(stead.Hooks):
        async def before_tool_call(
            self, ctx: stead.HookContext, info: BeforeToolCallInfo
        ) -> stead.ToolResult | None:
            if info.call.name == "answered":
                return stead.ToolResult(info.call.id or "", f"answered by a hook {LONE}", True)
            return None

        async def tool_output(self, ctx: stead.HookContext, info: ToolOutputInfo) -> stead.ToolResult:
            result = info.result
            return stead.ToolResult(result.call_id, f"{result.output} (see {LONE})", result.is_error)

    @stead.tool(effects="read")
    async def replaced() -> str:
        "Its output is replaced by a hook."
        return "ran"

    @stead.tool(effects="read")
    async def answered() -> str:
        "Never runs: a hook answers it."
        raise AssertionError("ran")

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if tool_results_since_last_user(request) == 0:
            return [stead.ToolCall("replaced", {}), stead.ToolCall("answered", {})]
        return [stead.Text("done")]

    provider = ScriptedProvider(respond)
    result, history, _, _ = await run_once(db_url, provider, [replaced, answered], Answers())
    assert result.outcome is stead.Outcome.COMPLETED and len(provider.requests) == 2
    outs = [(r.output, r.repaired) for r in blocks_of(history, "tool") if isinstance(r, stead.ToolResult)]
    assert outs == [(f"ran (see {FFFD})", True), (f"answered by a hook {FFFD}", True)]


async def test_S5_a_provider_error_with_a_lone_surrogate_fails_the_turn_once(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: ScriptedResponse(error=f"the server said {LONE}"))
    async with await stead.open(db_url, providers={"scripted": provider}, retry=FAST_RETRY) as system:
        agent = await system.create(provider="scripted", model="m")
        result = await asyncio.wait_for(agent.run("go"), TIMEOUT)
        history = await agent.history()
    assert len(provider.requests) == 1
    assert result.outcome is stead.Outcome.FAILED and result.error == f"the server said {FFFD}"
    assert history[-1].text == f"The last turn failed: the server said {FFFD}"


# ---------------------------------------------------------------------------------------------- A7
async def test_A7_a_message_with_a_lone_surrogate_is_refused_before_any_write(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with await stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m")
        refused = [
            agent.send(f"hi {LONE}"),
            agent.steer(f"hi {LONE}"),
            agent.send([stead.Text("hi"), stead.Reasoning(f"r{LONE}")]),
            agent.send("hi", metadata={"k": f"v{LONE}"}),
            agent.send("hi", metadata={f"k{LONE}": "v"}),
            agent.send("hi", payload={"k": [f"v{LONE}"]}),
            agent.send("hi", profile=f"p{LONE}"),
            agent.run(f"hi {LONE}"),
            agent.deliver([stead.Input("fine", id="fine1"), stead.Input(f"hi {LONE}")]),
        ]
        for call in refused:
            with pytest.raises(stead.InvalidInput, match="lone surrogate U\\+D800"):
                await call
        with pytest.raises(stead.InvalidInput, match="lone surrogate U\\+DCFF"):
            check_message("\udcff", max_payload_bytes=1000)  # an undecodable argv byte (CLI)
        assert not agent.active and await agent.history() == []
        assert len(provider.requests) == 0
        async with system.store.transaction() as tx:
            assert [
                k for k, _ in await tx.read_prefix(agent.id, "") if k.startswith(("q.", "msg.", "pending"))
            ] == []
        assert (await agent.run("fine é")).text == "ok"  # the agent takes valid input as ever


# ---------------------------------------------------------------------------------------------- C7
class Poison(stead.Hooks):
    """A plugin whose own write cannot be stored for some input (what the boundary repair cannot see)."""

    def __init__(self, marker: str = "POISON") -> None:
        self.marker = marker
        self.tries = 0

    async def _write(self, ctx: stead.HookContext, text: str) -> None:
        if self.marker in text:
            self.tries += 1
            assert ctx.tx is not None
            await ctx.tx.write(ctx.agent_id, "kv.a.poison", text + LONE)

    async def block_tx(self, ctx: stead.HookContext, info: BlockInfo) -> None:
        if isinstance(info.block, stead.Text):
            await self._write(ctx, info.block.text)

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        await self._write(ctx, info.result.output)


async def test_C7_model_output_the_store_keeps_refusing_fails_the_turn_after_a_few_attempts(
    db_url: str,
) -> None:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        last = request.messages[-1].text
        return [stead.Text("POISON answer" if last == "poison me" else f"answer to {last}")]

    provider = ScriptedProvider(respond)
    poison = Poison()
    log = EventLog()
    async with await stead.open(
        db_url, providers={"scripted": provider}, hooks=[poison, log], retry=FAST_RETRY
    ) as system:
        agent = await system.create(provider="scripted", model="m")
        result = await asyncio.wait_for(agent.run("poison me"), TIMEOUT)
        assert len(provider.requests) == POISON_ATTEMPTS  # a few model calls, not one every 50 ms for ever
        assert result.outcome is stead.Outcome.FAILED
        assert result.error is not None and "its output could not be stored" in result.error
        assert f"{POISON_ATTEMPTS} times in a row" in result.error
        history = await agent.history()
        assert [m.role for m in history] == ["user", "system"]  # the refused output is not kept
        assert history[-1].text == f"The last turn failed: {result.error}"
        assert agent.state == "idle"
        # not wedged: the next message is answered, and its request sees the failure note (C6)
        assert (await asyncio.wait_for(agent.run("next"), TIMEOUT)).text == "answer to next"
        assert "The last turn failed" in "".join(m.text for m in provider.requests[-1].messages)
    assert len([e for e in log.events if isinstance(e, stead.Settled)]) == 2


async def test_C7_after_a_restart_a_poisoned_turn_is_bounded_too(db_url: str) -> None:
    """The agent owes a turn whose output the store refuses when the process starts: the new process
    tries a few times and fails the turn; it does not loop (a restart used to start the loop again)."""
    hang = ScriptedProvider(lambda r: asyncio.Event().wait())  # type: ignore[arg-type, return-value]
    first = await stead.open(db_url, providers={"scripted": hang})
    agent = await first.create(provider="scripted", model="m")
    await agent.send("poison me")
    first.abandon()  # the process dies while its request is open
    await first.store.close()
    provider = ScriptedProvider(lambda r: [stead.Text("POISON answer")])
    async with await stead.open(
        db_url, providers={"scripted": provider}, hooks=Poison(), retry=FAST_RETRY
    ) as system:
        assert system.restored == [agent.id]
        again = await system.get(agent.id)
        await again.wait_idle(timeout=TIMEOUT)
        assert not again.active
        assert len(provider.requests) == POISON_ATTEMPTS
        history = await again.history()
    assert history[-1].text.startswith("The last turn failed: its output could not be stored")


@pytest.mark.parametrize("transactional", [False, True], ids=["default", "transactional"])
async def test_C7_a_tool_result_the_store_keeps_refusing_becomes_an_error_result(
    db_url: str, transactional: bool
) -> None:
    runs: list[int] = []

    async def body(n: int) -> str:
        "Its first result is one the store keeps refusing."
        runs.append(n)
        return "POISON result" if n == 0 else f"result {n}"

    produce = stead.tool(name="produce", effects="read", transactional=transactional)(body)

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if tool_results_since_last_user(request) == 0:
            return [stead.ToolCall("produce", {"n": 0}), stead.ToolCall("produce", {"n": 1})]
        return [stead.Text("done")]

    provider = ScriptedProvider(respond)
    poison = Poison()
    result, history, _, _ = await run_once(db_url, provider, [produce], poison)
    # a default call ran once; a transactional one runs in its refused commit, so again each attempt (its
    # writes roll back with it) — and never after the breaker answered it
    assert runs == ([0] * POISON_ATTEMPTS + [1] if transactional else [0, 1])
    assert poison.tries == POISON_ATTEMPTS
    assert result.outcome is stead.Outcome.COMPLETED and len(provider.requests) == 2
    first, second = (r for r in blocks_of(history, "tool") if isinstance(r, stead.ToolResult))
    assert first.is_error and first.output.startswith("The result of this call could not be stored (")
    assert f"{POISON_ATTEMPTS} times in a row" in first.output and "it is not run again" in first.output
    assert second.output == "result 1"


class Full(stead.store.Faults):
    """A disk that is full for the next `n` writes: reads work, every commit fails the same way."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.refused = 0

    def check(self, op: str) -> None:
        super().check(op)
        if op == "commit" and self.n > 0:
            self.n -= 1
            self.refused += 1
            raise stead.StoreError("commit failed: database or disk is full")


async def test_C7_an_outage_is_not_poison_the_turn_completes_when_the_store_recovers(tmp_path: Path) -> None:
    """Failing the same way while the store takes no write at all (a full disk) is retried as ever: the
    breaker's check write fails too, so nothing is failed for it."""
    faults = Full()
    asked = asyncio.Event()

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if not asked.is_set():
            asked.set()
            faults.n = 4 * POISON_ATTEMPTS  # the disk fills up while the model answers
        return [stead.Text("answer")]

    provider = ScriptedProvider(respond)
    async with await stead.open(
        f"sqlite:///{tmp_path / 'full.db'}", providers={"scripted": provider}, faults=faults, retry=FAST_RETRY
    ) as system:
        agent = await system.create(provider="scripted", model="m")
        result = await asyncio.wait_for(agent.run("go"), TIMEOUT)
    assert faults.refused == 4 * POISON_ATTEMPTS
    assert result.outcome is stead.Outcome.COMPLETED and result.text == "answer"
    assert len(provider.requests) > POISON_ATTEMPTS  # it kept trying (each attempt asks the model again)
