"""Flow definitions are checked when they load: every error is `file:line: field: message` (issue 16:
expression errors at load with file:line; length and nesting caps), and the expression language reaches
nothing but the JSON it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from stead.definitions import load_definition, load_registry
from stead.flows._expr import MAX_EXPRESSION_CHARS, ExpressionError, compile_expression, truthy
from tests.fakes import flows as F

TOOLS = "tools: [tests.fakes.flows:lookup, tests.fakes.flows:echo]\n"
USE = ["lookup", "echo"]


def error_of(path: Path) -> str:
    with pytest.raises(stead.DefinitionError) as e:
        if path.is_dir():
            load_registry(path)
        else:
            load_definition(path)
    return str(e.value)


def test_F4_a_condition_that_does_not_compile_names_its_file_and_line(team: Path) -> None:
    p = F.write_flow(
        team,
        "bad",
        """
        steps:
          - {name: a, tool: echo, input: {text: "'a'"}}
          - {name: b, tool: echo, input: {text: "'b'"}}
        paths:
          - from: a
            to: b
            when: "step.output == "
        """,
        tools=USE,
    )
    assert error_of(p) == (
        f"{p}:10: paths[0].when: invalid expression 'step.output == ': "
        "the expression ends too early (something is missing at the end)"
    )


@pytest.mark.parametrize(
    ("yaml_body", "line", "field"),
    [
        (
            'steps:\n  - name: a\n    tool: echo\n    input:\n      text: "a ||| b"\n',
            8,
            "steps[0].input.text",
        ),
        (
            'steps:\n  - name: a\n    tool: echo\n    input: {text: "\'a\'"}\n    output:\n      x: "["\n',
            9,
            "steps[0].output.x",
        ),
        (
            'steps:\n  - name: a\n    for_each:\n      items: "payload.("\n      do: {tool: echo}\n',
            7,
            "steps[0].for_each.items",
        ),
        (
            'steps:\n  - name: a\n    while:\n      when: "a =="\n      do: {tool: echo}\n',
            7,
            "steps[0].while.when",
        ),
        ('steps:\n  - {name: a, tool: echo, input: {text: "\'a\'"}}\nresult: "`unclosed"\n', 6, "result"),
    ],
)
def test_F4_every_expression_is_compiled_at_load(team: Path, yaml_body: str, line: int, field: str) -> None:
    p = F.write(team, "bad.yaml", "name: bad\ntype: flow\n" + TOOLS + yaml_body)
    assert error_of(p).startswith(f"{p}:{line}: {field}: ")


def test_F4_names_tools_sub_agents_and_paths_are_checked_at_load(team: Path) -> None:
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, tool: nope}\n")
    assert error_of(p).startswith(
        f"{p}:5: steps[0].tool: 'nope' is not one of this flow's tools (tools: echo, lookup)"
    )
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, sub_agent: ghost}\n")
    assert error_of(p).startswith(f"{p}:5: steps[0].sub_agent: 'ghost' is not listed under sub_agents")
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, tool: echo}\npaths:\n  - {from: a, to: z}\n")
    assert error_of(p).startswith(f"{p}:7: paths[0].to: no step is named 'z' (steps: a)")
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, tool: echo}\n  - {name: a, tool: echo}\n")
    assert error_of(p).startswith(f"{p}:6: steps[1].name: another step is named 'a' (steps[0])")
    p = F.write_flow(
        team,
        "bad",
        TOOLS + "steps:\n  - {name: a, tool: echo, start: true}\n  - {name: b, tool: echo, start: true}\n",
    )
    assert error_of(p).startswith(f"{p}:6: steps[1].start: only one step can be the start (found: a, b)")
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, tool: echo, prompt: hi}\n")
    assert (
        "steps[0]: a step does exactly one of tool, sub_agent, prompt, for_each, while (found: tool, prompt)"
        in (error_of(p))
    )
    p = F.write_flow(team, "bad", "steps:\n  - {name: a, prompt: hi}\n")
    assert error_of(p).startswith(
        f"{p}:4: steps[0].prompt: a prompt step needs a model: set the flow's 'model'"
    )
    p = F.write_flow(
        team,
        "bad",
        "steps:\n  - name: a\n    prompt: |\n      line one\n      {{ oops(\n",
        model="scripted:model.yaml",
    )
    assert error_of(p).startswith(f"{p}:8: steps[0].prompt: template syntax error:")
    p = F.write_flow(team, "bad", TOOLS + "steps:\n  - {name: a, tool: echo, output: {'a..b': \"'x'\"}}\n")
    assert error_of(p).startswith(f"{p}:5: steps[0].output.a..b: 'a..b' has an empty segment")


def test_a_flow_needs_steps_and_no_model_unless_it_has_prompt_steps(team: Path) -> None:
    p = F.write(team, "bad.yaml", "name: bad\ntype: flow\n")
    assert error_of(p).startswith(f"{p}:1: steps: a flow (type: flow) needs at least one step")
    p = F.write(
        team,
        "bad.yaml",
        "name: bad\ntype: flow\ninstructions: be nice\nsteps: [{name: a, tool: echo}]\n" + TOOLS,
    )
    assert error_of(p).startswith(f"{p}:3: instructions: a flow has no instructions of its own")
    p = F.write(team, "bad.yaml", "name: bad\nmodel: scripted:model.yaml\nsteps: [{name: a, tool: echo}]\n")
    assert error_of(p).startswith(f"{p}:3: steps: only a flow (type: flow) has steps")
    p = F.write(team, "bad.yaml", "name: bad\ninstructions: hi\n")
    assert error_of(p).startswith(f"{p}:1: model: required field is missing")
    ok = F.write_flow(team, "ok", TOOLS + "steps: [{name: a, tool: echo, input: {text: \"'x'\"}}]\n")
    assert load_definition(ok).model is None


def test_payload_patterns_are_checked_at_load(team: Path) -> None:
    p = F.write(
        team,
        "bad.yaml",
        "name: bad\nmodel: scripted:model.yaml\npayload:\n  read: [order]\n  write:\n"
        "    - order.status:update\n    - order.*:rename\n",
    )
    assert error_of(p).startswith(
        f"{p}:7: payload.write[1]: 'order.*:rename': operations must be some of add"
    )
    p = F.write(team, "bad.yaml", "name: bad\nmodel: scripted:model.yaml\npayload:\n  read: ['a.b*']\n")
    assert error_of(p).startswith(f"{p}:4: payload.read[0]: 'a.b*': a wildcard must be a whole segment")


def test_F5_expressions_longer_than_the_cap_are_refused_at_load(team: Path) -> None:
    long = " || ".join(["payload.x"] * 100)
    assert len(long) > MAX_EXPRESSION_CHARS
    p = F.write_flow(
        team,
        "long",
        TOOLS
        + "steps:\n  - {name: a, tool: echo}\n  - {name: b, tool: echo}\n"
        + f'paths:\n  - {{from: a, to: b, when: "{long}"}}\n',
    )
    assert error_of(p) == f"{p}:8: paths[0].when: the expression is 1,296 characters long; the limit is 1,000"


@pytest.mark.parametrize("depth", [40, 3000])
def test_F5_deep_nesting_is_refused_cleanly(team: Path, depth: int) -> None:
    nested = "(" * depth + "payload.x" + ")" * depth
    p = F.write_flow(
        team, "deep", TOOLS + f'steps:\n  - {{name: a, tool: echo, input: {{text: "{nested}"}}}}\n'
    )
    message = error_of(p)
    assert message.startswith(f"{p}:5: steps[0].input.text: ")
    assert "limit" in message  # the length or the nesting cap, never a RecursionError


def test_F5_the_nesting_cap_counts_brackets_outside_literals_only() -> None:
    assert compile_expression("'" + "(" * 100 + "'").evaluate({}) == "(" * 100
    with pytest.raises(ExpressionError, match="nests 33 levels deep; the limit is 32"):
        compile_expression("[" * 33 + "`1`" + "]" * 33)
    deep = "[" * 32 + "`1`" + "]" * 32
    assert compile_expression(deep).evaluate({}) is not None


def test_expressions_reach_only_the_json_they_are_given() -> None:
    class Secret:
        token = "s3cr3t"

    context = {"payload": {"a": 1}, "obj": Secret()}
    # field access reads JSON objects only: no attributes, no dunders (the engine passes JSON alone)
    for source in ("obj.token", "obj.__class__", "payload.__class__.__name__", "payload.a.real"):
        assert compile_expression(source).evaluate(context) is None
    assert compile_expression("payload.missing.deeper").evaluate(context) is None
    assert not truthy(None) and not truthy("") and not truthy([]) and not truthy({}) and truthy(0)
    with pytest.raises(ExpressionError, match="an expression must be a string"):
        compile_expression(42)
