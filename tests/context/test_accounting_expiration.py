"""Token accounting (estimated usage shown as such), expiration with `recall_tool_result`, the `context:`
section of a definition, and scripted model files answering summary requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stead
from stead.cli._runs import runs_table
from stead.core.expire import RECALL_TOOL
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.fakes.context import BIG, WindowModel, fetch


async def test_S4_estimated_usage_is_recorded_and_shown_as_estimated(db_url: str) -> None:
    model = WindowModel(window=10**6, rounds=2, enforce=False)  # reports no usage, like llama.cpp streams
    async with await stead.open(db_url, providers={"m": model.provider}, tools=[fetch]) as system:
        agent = await system.create(provider="m", tools=["fetch"])
        result = await agent.run("go", check=True)
        assert result.usage.input_tokens > 0 and result.usage.estimated
        run = await system.run(result.run_id)
        assert run.usage_estimated and not run.usage_unknown and run.input_tokens > 0
        prompt = next(s for s in run.steps if s.type == "prompt")
        assert prompt.output["usage"]["estimated"] is True
        table = runs_table(await system.runs())
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert f"~{run.input_tokens:,}/~{run.output_tokens:,}" in text and " 0/0" not in text


async def test_S4_reported_usage_is_not_marked_estimated(db_url: str) -> None:
    usage = stead.Usage(input_tokens=1200, output_tokens=30)
    provider = ScriptedProvider(lambda r: ScriptedResponse(blocks=[stead.Text("hi")], usage=usage))
    async with await stead.open(db_url, providers={"m": provider}) as system:
        agent = await system.create(provider="m")
        result = await agent.run("hello")
        run = await system.run(result.run_id)
    assert not result.usage.estimated and not run.usage_estimated and run.input_tokens == 1200


async def test_expired_tool_results_are_stubbed_and_recalled(db_url: str) -> None:
    seen: list[stead.ProviderRequest] = []
    rounds = 4

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        seen.append(request)
        last = request.messages[-1]
        asked = request.messages[-2] if len(request.messages) > 1 else last
        recalled = any(isinstance(b, stead.ToolCall) and b.name == RECALL_TOOL for b in asked.content)
        if recalled and any(
            isinstance(b, stead.ToolResult) and b.output.startswith("page 0:") and len(b.output) == BIG
            for b in last.content
        ):
            return [stead.Text("recalled page 0")]
        calls = sum(1 for m in request.messages if m.role == "assistant")
        if calls < rounds:
            return [stead.ToolCall("fetch", {"n": calls})]
        first = next(b for m in request.messages for b in m.content if isinstance(b, stead.ToolResult))
        return [stead.ToolCall(RECALL_TOOL, {"call_id": first.call_id})]

    async with await stead.open(db_url, providers={"m": ScriptedProvider(respond)}, tools=[fetch]) as system:
        agent = await system.create(
            provider="m", tools=["fetch"], context={"expire_tool_results_after_turns": 1}
        )
        result = await agent.run("read", check=True)
        assert result.text == "recalled page 0"
        history = await agent.history()
    assert RECALL_TOOL in [t.name for t in seen[0].tools]
    late = seen[rounds]  # the request after four fetches
    outputs = [b.output for m in late.messages for b in m.content if isinstance(b, stead.ToolResult)]
    assert "…[expired: " in outputs[0] and RECALL_TOOL in outputs[0]  # older than one response
    assert len(outputs[-1]) == BIG  # the newest result is whole
    stored = [b.output for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    assert all("expired" not in o for o in stored)  # the history keeps the originals (R4: a pure view)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


async def test_definition_context_section_reaches_the_agent(tmp_path: Path, db_url: str) -> None:
    _write(
        tmp_path / "summarizer.yaml",
        "scripted: true\nrules:\n  - when: {purpose: compaction}\n"
        "    responses:\n      - text: 'short summary'\n"
        "  - responses:\n      - text: 'unused'\n",
    )
    _write(tmp_path / "model.yaml", "scripted: true\nrules:\n  - responses:\n      - text: 'hello {user}'\n")
    _write(
        tmp_path / "helper.yaml",
        "name: helper\nmodel: scripted:model.yaml\ncontext:\n  window: 8000\n  reserve: 1000\n"
        "  keep_recent_tokens: 500\n  compaction_model: scripted:summarizer.yaml\n"
        "  expire_tool_results_after_turns: 3\n  max_tool_result_chars: 2000\n",
    )
    async with await stead.open(db_url, definitions=tmp_path) as system:
        agent = await system.create(definition="helper")
        policy = agent.config.context
        assert (policy.window, policy.reserve, policy.keep_recent_tokens) == (8000, 1000, 500)
        assert policy.expire_tool_results_after_turns == 3 and agent.config.max_tool_result_chars == 2000
        assert policy.compaction_model is not None
        for n in range(3):
            await agent.run(f"message {n} " + "x" * 300, check=True)
        info = await agent.compact()
        assert info.summary == "short summary"
        assert (await agent.history())[0].text.endswith("short summary")


def test_definition_context_errors_name_file_and_line(tmp_path: Path) -> None:
    from stead.definitions import load_definition

    _write(tmp_path / "m.yaml", "scripted: true\nrules:\n  - responses:\n      - text: hi\n")
    bad = _write(tmp_path / "bad.yaml", "name: bad\nmodel: scripted:m.yaml\ncontext:\n  windw: 100\n")
    with pytest.raises(stead.DefinitionError, match=r"bad.yaml:4"):
        load_definition(bad)
    bad2 = _write(
        tmp_path / "bad2.yaml",
        "name: bad\nmodel: scripted:m.yaml\ncontext:\n  window: 1000\n  reserve: 2000\n",
    )
    with pytest.raises(stead.DefinitionError, match=r"bad2.yaml:\d+: .*reserve"):
        load_definition(bad2)


async def test_create_refuses_a_bad_context_policy(db_url: str) -> None:
    async with await stead.open(db_url, providers={"m": ScriptedProvider(lambda r: [])}) as system:
        with pytest.raises(stead.ConfigurationError, match="unknown context setting"):
            await system.create(provider="m", context={"windw": 5})
        with pytest.raises(stead.ConfigurationError, match="reserve"):
            await system.create(provider="m", context_window=1000, context={"reserve": 1000})
        agent = await system.create(provider="m", context_window=4000)
        assert agent.config.context.window == 4000
        again = await system.get(agent.id)
        assert json.loads(again.config.__class__.encode(again.config))["context"]["window"] == 4000
