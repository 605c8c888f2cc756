"""OpenTelemetry GenAI spans (docs/observability.md, issue #4 item 6): names, attributes, nesting, resumed
work, and no message content unless asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stead
from stead.observability.tracing import TracingHooks
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import tool_results_since_last_user, url_of
from tests.fakes.tools import delegating_tool, hang, never_finishing

TIMEOUT = 5.0
SECRET = "the secret user text"


def tool_loop(tool: str, k: int, args: dict[str, Any]) -> Any:
    def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        n = tool_results_since_last_user(request)
        usage = stead.Usage(input_tokens=11, output_tokens=7)
        if n < k:
            return ScriptedResponse([stead.ToolCall(tool, args)], usage)
        return ScriptedResponse([stead.Text("final answer")], usage)

    return respond


@stead.tool
async def echo(text: str) -> str:
    "Echo."
    return text


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.span_id


def child_attributes(span: ReadableSpan, name: str, parent: ReadableSpan) -> Mapping[str, Any]:
    """The attributes of `span`, checked to be named `name`, a child of `parent`, and to have attributes."""
    assert span.name == name and parent_id(span) == span_id(parent)
    assert span.attributes is not None
    return span.attributes


async def test_spans_follow_genai_conventions_and_nest_under_the_run(tmp_path: Path) -> None:
    provider, exporter = tracing()
    scripted = ScriptedProvider(tool_loop("echo", 2, {"text": SECRET}))
    async with await stead.open(
        url_of(tmp_path / "t.db"), providers={"scripted": scripted}, tools=[echo], tracer_provider=provider
    ) as system:
        agent = await system.create(provider="scripted", model="m1", tools=["echo"], name="helper")
        await agent.send(SECRET)
        await agent.wait_idle(timeout=TIMEOUT)
        (run,) = await system.runs()
    spans = exporter.get_finished_spans()
    (root,) = by_name(spans, "invoke_agent")
    chats = by_name(spans, "chat")
    tools = by_name(spans, "execute_tool")
    assert root.name == "invoke_agent helper" and len(chats) == 3 and len(tools) == 2
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.id"] == agent.id
    assert root.attributes["gen_ai.agent.name"] == "helper"
    assert root.attributes["gen_ai.conversation.id"] == agent.id
    assert root.attributes["stead.run.id"] == run.id
    assert "stead.resumed" not in root.attributes
    for c in chats:
        a = child_attributes(c, "chat m1", root)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "scripted"
        assert a["gen_ai.request.model"] == "m1"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (11, 7)
        assert a["stead.run.id"] == run.id and a["stead.inference.id"] == a["stead.step.id"]
        assert "stead.turn.id" in a
    for t in tools:
        a = child_attributes(t, "execute_tool echo", root)
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == "echo"
        assert a["gen_ai.tool.call.id"] == a["stead.step.id"]
    # the tool call ids are the tool steps of the run record
    recorded = [s.id for s in await _steps(tmp_path / "t.db", run.id) if s.type == "tool"]
    assert len(recorded) == 2
    assert sorted(str((t.attributes or {})["gen_ai.tool.call.id"]) for t in tools) == sorted(recorded)
    # every span ends inside the run's span, all in one trace
    assert {s.context.trace_id for s in spans if s.context} == {root.context.trace_id if root.context else 0}
    # no message content by default
    for s in spans:
        for value in (s.attributes or {}).values():
            assert SECRET not in str(value)


async def _steps(path: Path, run_id: str) -> list[stead.Step]:
    async with await stead.open(url_of(path), providers={}, restore=False) as system:
        return (await system.run(run_id)).steps


async def test_content_is_captured_only_when_asked(tmp_path: Path) -> None:
    provider, exporter = tracing()
    scripted = ScriptedProvider(tool_loop("echo", 1, {"text": SECRET}))
    hooks = TracingHooks(provider, capture_content=True)
    async with await stead.open(
        url_of(tmp_path / "c.db"), providers={"scripted": scripted}, tools=[echo], hooks=[hooks]
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["echo"])
        await agent.send(SECRET)
        await agent.wait_idle(timeout=TIMEOUT)
    spans = exporter.get_finished_spans()
    (root,) = by_name(spans, "invoke_agent")
    assert root.name == "invoke_agent"  # an unnamed agent
    assert SECRET in str((root.attributes or {})["gen_ai.input.messages"])
    (tool,) = by_name(spans, "execute_tool")
    assert SECRET in str((tool.attributes or {})["gen_ai.tool.call.arguments"])
    assert (tool.attributes or {})["gen_ai.tool.call.result"] == SECRET
    final = [c for c in by_name(spans, "chat") if "gen_ai.output.messages" in (c.attributes or {})]
    assert len(final) == 1 and "final answer" in str((final[0].attributes or {})["gen_ai.output.messages"])


async def test_child_agent_span_nests_under_the_parents_execute_tool_span(tmp_path: Path) -> None:
    provider, exporter = tracing()
    holder: dict[str, Any] = {}
    delegate = delegating_tool(holder, traced=True)
    async with await stead.open(
        url_of(tmp_path / "n.db"),
        providers={
            "parent": ScriptedProvider(tool_loop("delegate", 1, {"question": "q"})),
            "child": ScriptedProvider(tool_loop("echo", 1, {"text": "x"})),
        },
        tools=[delegate, echo],
        tracer_provider=provider,
    ) as system:
        holder["system"] = system
        parent = await system.create(provider="parent", model="big", tools=["delegate"], name="boss")
        child = await system.create(provider="child", model="small", tools=["echo"], name="helper")
        holder["child"] = child.id
        await parent.send("go")
        await parent.wait_idle(timeout=TIMEOUT)
    spans = exporter.get_finished_spans()
    (boss,) = [s for s in spans if s.name == "invoke_agent boss"]
    (helper,) = [s for s in spans if s.name == "invoke_agent helper"]
    (delegation,) = [s for s in spans if s.name == "execute_tool delegate"]
    (echo_span,) = [s for s in spans if s.name == "execute_tool echo"]
    assert parent_id(delegation) == span_id(boss)
    assert parent_id(helper) == span_id(delegation)
    assert parent_id(echo_span) == span_id(helper)
    assert len({s.context.trace_id for s in spans if s.context}) == 1


async def test_resumed_run_is_marked_and_linked_to_the_original_trace(tmp_path: Path) -> None:
    path = tmp_path / "resume.db"
    provider, exporter = tracing()
    started = asyncio.Event()

    @stead.tool(durable=True)
    async def work(text: str) -> str:
        "Hangs in the first process, finishes in the second."
        if not holder.get("second"):
            await hang(started)
        return text

    holder: dict[str, Any] = {}
    faults = stead.store.Faults()
    system = await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(tool_loop("work", 1, {"text": "t"}))},
        tools=[work],
        faults=faults,
        tracer_provider=provider,
    )
    agent = await system.create(provider="scripted", model="m", tools=["work"], name="w")
    await agent.send("go")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    (first,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    faults.crash_at = faults.ops
    system.abandon()
    with pytest.raises(stead.StoreCrashed):
        async with system.store.transaction() as tx:
            await tx.get("nobody", "pending")
    # the first process's run span never ended (the process "died"): only its chat span was exported
    assert not by_name(exporter.get_finished_spans(), "invoke_agent")
    original_trace = first.context.trace_id if first.context else 0
    original_run_span = first.parent.span_id if first.parent else 0

    holder["second"] = True
    async with await stead.open(
        url_of(path),
        providers={"scripted": ScriptedProvider(tool_loop("work", 1, {"text": "t"}))},
        tools=[work],
        tracer_provider=provider,
    ) as system2:
        await (await system2.get(agent.id)).wait_idle(timeout=TIMEOUT)
    spans = exporter.get_finished_spans()
    (resumed,) = by_name(spans, "invoke_agent")
    assert (resumed.attributes or {})["stead.resumed"] is True
    assert len(resumed.links) == 1
    assert resumed.links[0].context.trace_id == original_trace
    assert resumed.links[0].context.span_id == original_run_span
    (tool,) = by_name(spans, "execute_tool")
    assert (tool.attributes or {}).get("stead.resumed") is True  # the call was dispatched before the crash
    assert parent_id(tool) == span_id(resumed)


async def test_abort_ends_spans_with_a_cancelled_status(tmp_path: Path) -> None:
    provider, exporter = tracing()
    wait_forever, started = never_finishing()
    async with await stead.open(
        url_of(tmp_path / "x.db"),
        providers={"scripted": ScriptedProvider(tool_loop("wait_forever", 1, {}))},
        tools=[wait_forever],
        tracer_provider=provider,
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["wait_forever"])
        await agent.send("go")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        await agent.abort()
        await agent.wait_idle(timeout=TIMEOUT)
    spans = exporter.get_finished_spans()
    (root,) = by_name(spans, "invoke_agent")
    (tool,) = by_name(spans, "execute_tool")
    assert (root.attributes or {})["stead.run.status"] == "cancelled"
    assert not root.status.is_ok and not tool.status.is_ok


async def test_tracing_is_off_by_default(tmp_path: Path) -> None:
    async with await stead.open(
        url_of(tmp_path / "o.db"), providers={"scripted": ScriptedProvider(lambda r: [stead.Text("hi")])}
    ) as system:
        assert not any(isinstance(h, TracingHooks) for h in system._env.hooks.hooks)
