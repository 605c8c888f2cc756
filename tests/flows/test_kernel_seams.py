"""The kernel seams the flow layer added (docs/flows.md, "Kernel seams"): `Done(model_call=False)`, the
`instructions` and `tool_output` hooks — each usable by any plugin, and free when nobody overrides them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import stead
from stead.extend import InstructionsInfo, ToolOutputInfo, ToolResultInfo
from stead.providers.base import ProviderRequest, StreamEvent
from tests.fakes import flows as F


class Router:
    """A provider that answers without calling a model (`model_call=False`)."""

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        yield stead.BlockEnd(stead.Text("routed"))
        yield stead.Done("stop", model_call=False)


async def test_a_response_that_called_no_model_records_no_prompt_step(db_url: str) -> None:
    async with await stead.open(db_url, providers={"router": Router()}) as system:
        agent = await system.create(provider="router", model="none")
        result = await agent.run("hi")
        run = await system.run(result.run_id)
    assert result.text == "routed"
    assert run.steps == [] and run.iterations == 0 and run.status == "completed"


class Rewrite(stead.Hooks):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def instructions(self, ctx: stead.HookContext, info: InstructionsInfo) -> str:
        return f"{info.instructions} [run {ctx.run_id is not None}]"

    async def tool_output(self, ctx: stead.HookContext, info: ToolOutputInfo) -> stead.ToolResult:
        return stead.ToolResult(info.result.call_id, f"short version of {len(info.result.output)} characters")

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        self.seen.append(info.result.output)


async def test_the_instructions_and_tool_output_hooks(db_url: str) -> None:
    requests: list[ProviderRequest] = []

    def respond(request: ProviderRequest) -> list[stead.Block]:
        requests.append(request)
        if not any(m.role == "tool" for m in request.messages):
            return [stead.ToolCall("echo", {"text": "x" * 500})]
        return [stead.Text("done")]

    hooks = Rewrite()
    providers = {"p": stead.testing.ScriptedProvider(respond)}
    async with await stead.open(db_url, providers=providers, tools=[F.echo], hooks=[hooks]) as system:
        agent = await system.create(provider="p", model="m", instructions="Be brief.", tools=["echo"])
        await agent.run("go")
        history = await agent.history()
    assert [r.instructions for r in requests] == ["Be brief. [run True]", "Be brief. [run True]"]
    (result,) = [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    assert result.output == "short version of 500 characters"  # what the conversation keeps
    assert hooks.seen == ["short version of 500 characters"]  # and what tool_result_tx hooks see


class Broken(stead.Hooks):
    async def tool_output(self, ctx: stead.HookContext, info: ToolOutputInfo) -> stead.ToolResult:
        raise RuntimeError("bug in a plugin")


async def test_a_failing_tool_output_hook_keeps_the_tools_result(db_url: str) -> None:
    def respond(request: ProviderRequest) -> list[stead.Block]:
        if not any(m.role == "tool" for m in request.messages):
            return [stead.ToolCall("echo", {"text": "kept"})]
        return [stead.Text("done")]

    providers = {"p": stead.testing.ScriptedProvider(respond)}
    async with await stead.open(db_url, providers=providers, tools=[F.echo], hooks=[Broken()]) as system:
        agent = await system.create(provider="p", model="m", tools=["echo"])
        result = await agent.run("go")
        history = await agent.history()
    assert result.ok
    assert [b.output for m in history for b in m.content if isinstance(b, stead.ToolResult)] == ["kept"]
    assert F.EXECUTIONS["echo:kept"] == 1  # the call ran once; its outcome was not lost


async def test_queued_messages_start_new_flow_executions(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "again",
        """
        steps:
          - name: one
            tool: echo
            input: {text: "join(' ', ['got', input.text])"}
        """,
        tools=["echo"],
    )
    async with await stead.open(db_url, definitions=team) as system:
        agent = await system.create(definition="again")
        # both queued before the agent runs: the second is consumed when the first flow has ended
        await agent.send("first", payload={"n": 1})
        await agent.send("second", payload={"n": 2})
        await agent.wait_idle()
        history = await agent.history()
    assert [m.text for m in history if m.role == "assistant" and m.text] == ["got first", "got second"]
    assert F.EXECUTIONS["echo:got first"] == 1 and F.EXECUTIONS["echo:got second"] == 1
