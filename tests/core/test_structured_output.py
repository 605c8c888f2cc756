"""Structured output and model options on the wire (issue 24, item 1), against the loopback fake servers.

An output schema — a flow prompt step's `output_schema`, `agent.run(..., output_schema=...)`, a definition's
`output:` — is sent as the vendor's native structured output (OpenAI / compatible `response_format`
`json_schema`; Anthropic a forced synthetic tool) and checked on return. A definition's `model_options:` is
mapped to each vendor's names, and refused when the file loads if it is wrong.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import stead
import stead.testing
from stead.messages import Text, ToolCall
from stead.providers.anthropic import AnthropicProvider
from stead.providers.openai import OpenAIProvider
from tests.fakes import FakeServer, Reply
from tests.fakes.openai_server import OpenAIFakeServer

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["refund", "other"]}},
    "required": ["label"],
    "additionalProperties": False,
}


@stead.tool
async def lookup(order: int) -> str:
    "Look an order up."
    return f"order {order}: delivered"


def providers(oai: FakeServer | None = None, ant: FakeServer | None = None) -> dict[str, stead.Provider]:
    out: dict[str, stead.Provider] = {}
    if oai is not None:
        out["oai"] = OpenAIProvider(base_url=oai.base_url, api_key="sk-test", timeout=10.0)
    if ant is not None:
        out["ant"] = AnthropicProvider(base_url=ant.base_url, api_key="sk-ant-test", timeout=10.0)
    return out


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/db.sqlite"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


FLOW = """
name: classify
type: flow
model: {model}
model_options: {{temperature: 0.2, seed: 7}}
steps:
  - name: classify
    prompt: "Classify the message."
    output_schema:
      type: object
      properties: {{label: {{type: string, enum: [refund, other]}}}}
      required: [label]
      additionalProperties: false
"""


async def classify(tmp_path: Path, oai: OpenAIFakeServer, answer: str) -> stead.RunResult:
    """The `classify` flow run once on the fake OpenAI server answering `answer`."""
    team = tmp_path / "team"
    write(team, "classify", FLOW.format(model="oai:gpt-x"))
    oai.push(Reply([Text(answer)]))
    async with await stead.open(db(tmp_path), definitions=team, providers=providers(oai)) as system:
        agent = await system.create(definition="classify")
        return await agent.run("it arrived broken")


# ------------------------------------------------------------------------------------ structured output
async def test_SO1_flow_prompt_step_sends_response_format_json_schema(tmp_path: Path, oai: Any) -> None:
    result = await classify(tmp_path, oai, '{"label": "refund"}')
    assert result.ok, result.error
    body = oai.requests[-1].body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "classify", "schema": LABEL, "strict": True},
    }
    assert body["temperature"] == 0.2 and body["seed"] == 7
    assert "tool_choice" not in body and "tools" not in body  # a prompt step offers no tools


async def test_SO1_a_schema_outside_openai_strict_rules_is_sent_not_strict(tmp_path: Path, oai: Any) -> None:
    oai.push(Reply([Text('{"label": "other"}')]))
    loose = {"type": "object", "properties": {"label": {"type": "string"}, "why": {"type": "string"}}}
    async with await stead.open(db(tmp_path), providers=providers(oai)) as system:
        agent = await system.create(model="oai:gpt-x")
        result = await agent.run("classify", output_schema=loose)
    assert result.ok, result.error
    assert result.output == {"label": "other"}
    assert oai.requests[-1].body["response_format"]["json_schema"] == {
        "name": "result",
        "schema": loose,
        "strict": False,
    }


async def test_SO2_anthropic_gets_a_forced_tool_whose_input_is_the_answer(tmp_path: Path, ant: Any) -> None:
    team = tmp_path / "team"
    write(team, "classify", FLOW.format(model="ant:claude-x").replace(", seed: 7", ""))
    ant.push(Reply([ToolCall("classify", {"label": "refund"})]))
    async with await stead.open(db(tmp_path), definitions=team, providers=providers(ant=ant)) as system:
        agent = await system.create(definition="classify")
        result = await agent.run("it arrived broken")
    assert result.ok, result.error
    body = ant.requests[-1].body
    assert body["tools"] == [
        {
            "name": "classify",
            "description": "Give your final answer: call this tool with the answer as its input.",
            "input_schema": LABEL,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "classify"}
    assert body["temperature"] == 0.2
    assert json.loads(result.text) == {"label": "refund"}  # the flow's result: the step's output


async def test_SO2_loop_agent_with_tools_answers_through_the_output_tool(tmp_path: Path, ant: Any) -> None:
    ant.push(
        Reply([ToolCall("lookup", {"order": 3})]),
        Reply([Text("Done."), ToolCall("result", {"label": "refund"})]),
    )
    async with await stead.open(db(tmp_path), providers=providers(ant=ant), tools=[lookup]) as system:
        agent = await system.create(model="ant:claude-x", tools=["lookup"], output_schema=LABEL)
        result = await agent.run("order 3 broke: refund?")
        history = await agent.history()
    assert result.ok, result.error
    assert result.output == {"label": "refund"}
    for request in ant.requests:
        assert [t["name"] for t in request.body["tools"]] == ["lookup", "result"]
        assert request.body["tool_choice"] == {"type": "any"}  # a real tool first, the output tool to answer
    calls = [b for m in history for b in m.content if isinstance(b, ToolCall)]
    assert [c.name for c in calls] == ["lookup"]  # the output tool's call is the answer, not a call


async def test_SO3_an_answer_outside_the_schema_fails_the_run_saying_why(tmp_path: Path, oai: Any) -> None:
    oai.push(Reply([Text('{"label": "maybe"}')]), Reply([Text("I think it is a refund")]))
    async with await stead.open(db(tmp_path), providers=providers(oai)) as system:
        agent = await system.create(model="oai:gpt-x", output_schema=LABEL)
        wrong = await agent.run("classify")
        prose = await agent.run("classify again")
    assert wrong.outcome is stead.Outcome.FAILED and wrong.output is None
    assert wrong.error is not None
    assert (
        'the answer does not match the output schema: the answer.label should be one of ["refund", "other"]'
        in (wrong.error)
    )
    assert prose.outcome is stead.Outcome.FAILED
    assert prose.error is not None and "the answer is not JSON" in prose.error


async def test_SO3_flow_step_answer_outside_the_schema_is_a_failed_step(tmp_path: Path, oai: Any) -> None:
    result = await classify(tmp_path, oai, '{"kind": "refund"}')
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "the answer is missing 'label'" in result.error


async def test_SO4_a_runs_own_schema_applies_to_that_run_only(tmp_path: Path, oai: Any) -> None:
    oai.push(
        Reply([ToolCall("lookup", {"order": 3})]),
        Reply([Text('{"label": "refund"}')]),
        Reply([Text("plain prose is fine now")]),
    )
    async with await stead.open(db(tmp_path), providers=providers(oai), tools=[lookup]) as system:
        agent = await system.create(model="oai:gpt-x", tools=["lookup"])
        typed = await agent.run("classify order 3", output_schema=LABEL)
        plain = await agent.run("thanks")
    assert typed.ok and typed.output == {"label": "refund"}
    assert plain.ok and plain.output is None and plain.text == "plain prose is fine now"
    first, second, third = (r.body for r in oai.requests)
    assert first["response_format"]["json_schema"]["schema"] == LABEL
    assert second["response_format"] == first["response_format"]  # every request of the run
    assert "response_format" not in third


@stead.tool(effects="read", approval="always")
async def checked(order: int) -> str:
    "Look an order up (each call needs an approval)."
    return f"order {order}: delivered"


async def test_SO4_a_runs_own_schema_survives_a_restart_mid_run(tmp_path: Path, oai: Any) -> None:
    oai.push(Reply([ToolCall("checked", {"order": 3})]), Reply([Text('{"label": "refund"}')]))
    kit = {"providers": providers(oai), "tools": [checked], "approvals": True}
    async with await stead.open(db(tmp_path), **kit) as system:  # type: ignore[arg-type]
        agent = await system.create(model="oai:gpt-x", tools=["checked"], agent_id="typed")
        waiting = await agent.run("classify order 3", output_schema=LABEL)
        assert waiting.outcome is stead.Outcome.AWAITING_INPUT
    async with await stead.open(db(tmp_path), **kit) as system:  # type: ignore[arg-type]
        (approval,) = await system.approvals()
        await system.approve(approval.id)
        agent = await system.get("typed")
        await agent.wait_idle(timeout=30)
        history = await agent.history()
    schemas = [r.body.get("response_format", {}).get("json_schema", {}).get("schema") for r in oai.requests]
    assert schemas == [LABEL, LABEL]  # the second request was made by the new process
    assert history[-1].text == '{"label": "refund"}'


async def test_SO4_a_definitions_output_makes_every_run_typed(tmp_path: Path, oai: Any) -> None:
    team = tmp_path / "team"
    write(
        team,
        "typed",
        """
        name: typed
        model: oai:gpt-x
        instructions: Classify.
        output:
          type: object
          properties: {label: {type: string, enum: [refund, other]}}
          required: [label]
          additionalProperties: false
        """,
    )
    oai.push(Reply([Text('{"label": "other"}')]))
    async with await stead.open(db(tmp_path), definitions=team, providers=providers(oai)) as system:
        agent = await system.create(definition="typed")
        result = await agent.run("hello")
    assert result.ok and result.output == {"label": "other"}
    assert oai.requests[-1].body["response_format"]["json_schema"]["schema"] == LABEL


async def test_SO5_a_bad_output_schema_is_refused_before_any_write(tmp_path: Path) -> None:
    scripted = {"s": stead.testing.ScriptedProvider(lambda request: [Text("{}")])}
    async with await stead.open(db(tmp_path), providers=scripted) as system:
        agent = await system.create(model="s:x")
        with pytest.raises(
            stead.InvalidInput, match=r"output_schema.properties.a: unsupported schema keyword"
        ):
            await agent.send("hi", output_schema={"type": "object", "properties": {"a": {"pattern": "x"}}})
        assert await agent.history() == []
        with pytest.raises(stead.ConfigurationError, match="unknown type 'text'"):
            await system.create(model="s:x", output_schema={"type": "text"})


# ------------------------------------------------------------------------------------ model options
async def test_MO1_openai_wire_names_tool_choice_and_sampling(tmp_path: Path, oai: Any) -> None:
    oai.push(Reply([ToolCall("lookup", {"order": 1})]), Reply([Text("delivered")]))
    options = {"tool_choice": "required", "temperature": 0.0, "top_p": 0.9, "seed": 42, "stop": ["END"]}
    async with await stead.open(db(tmp_path), providers=providers(oai), tools=[lookup]) as system:
        agent = await system.create(model="oai:gpt-x", tools=["lookup"], model_options=options)
        result = await agent.run("order 1?")
        named = await system.create(
            model="oai:gpt-x", tools=["lookup"], model_options={"tool_choice": "lookup", "max_tokens": 64}
        )
        oai.push(Reply([Text("ok")]))
        await named.run("order 2?")
    assert result.ok, result.error
    body = oai.requests[0].body
    assert {k: body[k] for k in ("tool_choice", "temperature", "top_p", "seed", "stop")} == {
        "tool_choice": "required",
        "temperature": 0.0,
        "top_p": 0.9,
        "seed": 42,
        "stop": ["END"],
    }
    last = oai.requests[-1].body
    assert last["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert last["max_tokens"] == 64  # a server at a base_url: llama.cpp reads only max_tokens


async def test_MO1_anthropic_wire_names_tool_choice_and_stop_sequences(tmp_path: Path, ant: Any) -> None:
    ant.push(Reply([ToolCall("lookup", {"order": 1})]), Reply([Text("delivered")]), Reply([Text("ok")]))
    async with await stead.open(db(tmp_path), providers=providers(ant=ant), tools=[lookup]) as system:
        agent = await system.create(
            model="ant:claude-x",
            tools=["lookup"],
            model_options={"tool_choice": "required", "temperature": 0.5, "top_k": 20, "stop": "END"},
        )
        await agent.run("order 1?")
        named = await system.create(
            model="ant:claude-x", tools=["lookup"], model_options={"tool_choice": "lookup", "max_tokens": 300}
        )
        await named.run("order 2?")
    body = ant.requests[0].body
    assert body["tool_choice"] == {"type": "any"}
    assert (body["temperature"], body["top_k"], body["stop_sequences"]) == (0.5, 20, ["END"])
    last = ant.requests[-1].body
    assert last["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert last["max_tokens"] == 300


async def test_MO1_an_option_the_vendor_lacks_fails_the_turn_clearly(tmp_path: Path, ant: Any) -> None:
    async with await stead.open(db(tmp_path), providers=providers(ant=ant)) as system:
        agent = await system.create(model="ant:claude-x", model_options={"seed": 1})
        result = await agent.run("hi")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "anthropic does not support the model option(s) seed" in result.error
    assert ant.requests == []  # refused before anything was sent


@pytest.mark.parametrize(
    ("options", "line", "message"),
    [
        ("{temprature: 0.2}", 5, "model_options.temprature: unknown option (known: tool_choice, temperature"),
        ("{temperature: hot}", 5, "model_options.temperature must be a number, not 'hot'"),
        ("{temperature: 3}", 5, "model_options.temperature must be between 0 and 2, not 3"),
        ("{seed: -1}", 5, "model_options.seed must be an integer of at least 0, not -1"),
        ("{stop: []}", 5, "model_options.stop must be a string or a list of 1-16 non-empty strings"),
        (
            "{tool_choice: search}",
            5,
            "model_options.tool_choice: 'search' is not auto, required, none or one of the agent's tools "
            "(lookup)",
        ),
        ("[temperature]", 5, "model_options: Input should be a valid dictionary"),
    ],
)
def test_MO2_bad_model_options_are_refused_at_load_naming_file_line_and_key(
    tmp_path: Path, options: str, line: int, message: str
) -> None:
    path = write(
        tmp_path,
        "bad",
        f"""
        name: bad
        model: openai-compatible:m@http://127.0.0.1:9/v1
        tools: [tests.core.test_structured_output:lookup]
        instructions: hi
        model_options: {options}
        """,
    )
    with pytest.raises(stead.DefinitionError) as caught:
        stead.definitions.load_definition(path)
    text = str(caught.value)
    assert f"{path}:{line}" in text, text
    assert message in text, text


def test_MO2_an_option_a_candidates_vendor_does_not_take_is_refused_at_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "seeded",
        """
        name: seeded
        model: [openai-compatible:m@http://127.0.0.1:9/v1, anthropic:claude-haiku-4-5]
        instructions: hi
        model_options:
          temperature: 0.1
          seed: 3
        """,
    )
    with pytest.raises(stead.DefinitionError) as caught:
        stead.definitions.load_definition(path)
    text = str(caught.value)
    assert f"{path}:6" in text, text
    assert "model_options.seed: anthropic (anthropic:claude-haiku-4-5) does not support this option" in text


def test_MO2_good_model_options_load_checked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "good",
        """
        name: good
        model: openai-compatible:m@http://127.0.0.1:9/v1
        tools: [tests.core.test_structured_output:lookup]
        instructions: hi
        model_options: {tool_choice: lookup, temperature: 1, stop: END, max_tokens: 100, top_k: 40}
        """,
    )
    definition = stead.definitions.load_definition(path)
    assert definition.model_options == {
        "tool_choice": "lookup",
        "temperature": 1.0,
        "top_k": 40,
        "max_tokens": 100,
        "stop": ["END"],
    }
