"""Tool results larger than a limit are cut in the conversation, with a marker saying how much was cut
(issue 9): 100,000 characters by default, `@stead.tool(max_result_chars=N)` per tool, `create(...,
max_tool_result_chars=N)` per agent (the tool's own limit wins). `tool_result_tx` hooks — so the run
record's tool step — get the full output."""

from __future__ import annotations

import json

import pytest

import stead
from stead.core.batch import cut_output
from stead.extend import ToolResultInfo
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 5.0
BIG = "x" * 112_403


@stead.tool
async def dump() -> str:
    """Return a very long text."""
    return BIG


@stead.tool(max_result_chars=10)
async def short(n: int) -> str:
    """Return n characters."""
    return "y" * n


class FullResults(stead.Hooks):
    def __init__(self) -> None:
        self.outputs: list[str] = []

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        self.outputs.append(info.result.output)


def call_then_answer(name: str, args: dict[str, int]) -> ScriptedProvider:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].role == "tool":
            return [stead.Text("seen")]
        return [stead.ToolCall(name, args)]

    return ScriptedProvider(respond)


def test_cut_output_marker() -> None:
    r = stead.ToolResult("c1", BIG)
    cut = cut_output(r, 100_000)
    assert cut.output == "x" * 100_000 + "…[cut: 12,403 of 112,403 characters]"
    assert cut.call_id == "c1" and not cut.is_error
    assert cut_output(r, 200_000) is r


async def test_long_tool_results_are_cut_in_the_conversation_with_a_marker(db_url: str) -> None:
    provider = call_then_answer("dump", {})
    hook = FullResults()
    async with await stead.open(db_url, providers={"p": provider}, tools=[dump], hooks=hook) as system:
        agent = await system.create(provider="p", tools=["dump"])
        events = agent._rt.subscribe()
        result = await agent.run("dump it")
        history = await agent.history()
        (tool_msg,) = [m for m in history if m.role == "tool"]
        (kept,) = tool_msg.content
        assert isinstance(kept, stead.ToolResult)
        assert kept.output == "x" * 100_000 + "…[cut: 12,403 of 112,403 characters]"
        # the model saw the cut result; the live mirror equals the store
        assert provider.requests[-1].messages[-1].content == [kept]
        assert agent._rt.messages() == history
        assert result.messages == history
        # the full output went to the hook and to the run record's tool step
        assert hook.outputs == [BIG]
        run = await system.run(result.run_id)
        (step,) = [s for s in run.steps if s.type == "tool"]
        assert step.output == BIG
        # observers see what the conversation keeps
        finished = []
        while not events.empty():
            ev = events.get_nowait()
            if isinstance(ev, stead.ToolFinished):
                finished.append(ev.result)
        assert finished == [kept]


async def test_tool_limit_wins_over_the_agent_limit(db_url: str) -> None:
    async with await stead.open(
        db_url, providers={"p": call_then_answer("short", {"n": 25})}, tools=[short], records=False
    ) as system:
        agent = await system.create(provider="p", tools=["short"], max_tool_result_chars=20)
        await agent.run("go")
        (tool_msg,) = [m for m in await agent.history() if m.role == "tool"]
        assert tool_msg.content[0].output == "y" * 10 + "…[cut: 15 of 25 characters]"  # type: ignore[union-attr]


async def test_agent_limit_applies_to_tools_without_their_own(db_url: str) -> None:
    async with await stead.open(
        db_url, providers={"p": call_then_answer("dump", {})}, tools=[dump], records=False
    ) as system:
        agent = await system.create(provider="p", tools=["dump"], max_tool_result_chars=1_000)
        assert agent.config.max_tool_result_chars == 1_000
        await agent.run("go")
        async with system.store.transaction() as tx:
            recs = [json.loads(r) for r in await tx.load(agent.id)]
        (rec,) = [r for r in recs if r["k"] == "t"]
        assert rec["b"]["o"] == "x" * 1_000 + "…[cut: 111,403 of 112,403 characters]"


def test_max_result_chars_must_be_positive() -> None:
    async def f() -> str:
        """A tool."""
        return ""

    for bad in (0, -1, True):
        with pytest.raises(stead.ConfigurationError, match="max_result_chars"):
            stead.tool(max_result_chars=bad)(f)
