"""Agent definition files and scripted model files: loading, and `file:line:` errors (issue #2, item 7)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import stead
from stead.definitions import AgentDefinition, load_definition
from stead.messages import Message, Text, ToolCall, ToolResult
from stead.providers.base import ProviderRequest
from stead.providers.scripted import ScriptedResponse
from stead.providers.scripted_file import ScriptedModelFile, load_scripted_model, scripted_responder

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "agent.yaml"

MODEL = """\
# SCRIPTED MODEL
scripted: true
rules:
  - responses:
      - text: "hello {user}"
"""

TOOLS = """\
import stead

@stead.tool
def add(a: int, b: int) -> int:
    "Add."
    return a + b

def plain(x: str) -> str:
    "Echo."
    return x

NOT_A_TOOL = 42
"""


def write(directory: Path, name: str, text: str) -> Path:
    p = directory / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, "model.yaml", MODEL)
    write(tmp_path, "tools.py", TOOLS)
    return tmp_path


def error_of(path: Path) -> stead.DefinitionError:
    with pytest.raises(stead.DefinitionError) as info:
        load_definition(path)
    return info.value


def test_example_loads() -> None:
    d = load_definition(EXAMPLE)
    assert isinstance(d, AgentDefinition)
    assert d.name == "calculator"
    assert d.type == "loop"
    assert d.provider_name == "scripted" and d.model_name == "model.yaml"
    assert [t.name for t in d.resolved_tools] == ["add", "multiply"]
    assert d.resolved_tools[0].fn(2, 3) == 5
    assert d.source == EXAMPLE


def test_plain_function_and_module_import(project: Path) -> None:
    write(project, "mymod.py", "def shout(text: str) -> str:\n    'Shout.'\n    return text.upper()\n")
    p = write(
        project,
        "agent.yaml",
        """\
        name: a-1
        model: scripted:model.yaml
        tools: ["tools.py:plain", "mymod:shout", "tools.py:add"]
        """,
    )
    d = load_definition(p)
    assert [t.name for t in d.resolved_tools] == ["plain", "shout", "add"]
    assert all(isinstance(t, stead.Tool) for t in d.resolved_tools)


def test_yaml_syntax_error_points_at_line(project: Path) -> None:
    p = write(project, "agent.yaml", "name: x\nmodel: scripted:model.yaml\ntools: [a,\n  b: : c\n")
    e = error_of(p)
    assert str(e).startswith(f"{p}:4: YAML syntax error")
    assert e.line == 4 and e.path == str(p)


def test_unknown_key(project: Path) -> None:
    p = write(project, "agent.yaml", "name: x\nmodel: scripted:model.yaml\n\ninstructons: hi\n")
    e = error_of(p)
    assert str(e).startswith(f"{p}:4: ")
    assert "unknown key 'instructons'" in str(e)


def test_wrong_type_in_list(project: Path) -> None:
    p = write(
        project, "agent.yaml", "name: x\nmodel: scripted:model.yaml\ntools:\n  - tools.py:add\n  - 12\n"
    )
    e = error_of(p)
    assert str(e).startswith(f"{p}:5: tools[1]: ")
    assert "string" in str(e)


# (file text, line, what the error says after `file:line: `): one test each
ERRORS = [
    pytest.param(
        "name: x\ninstructions:\n  a: 1\nmodel: scripted:model.yaml\n",
        3,
        "instructions: ",
        id="wrong_type_of_field",
    ),
    pytest.param(
        "# no name\ndescription: d\nmodel: scripted:model.yaml\n",
        2,
        "name: required field is missing",
        id="missing_name",
    ),
    pytest.param(
        "name: Bad Name\nmodel: scripted:model.yaml\n",
        1,
        "name: 'Bad Name' is not a valid name",
        id="bad_name",
    ),
    pytest.param("name: ok\n\nmodel: gpt-4\n", 3, "model: must look like 'provider:model'", id="bad_model"),
    pytest.param("- a\n- b\n", 1, "agent definition must be a YAML mapping", id="not_a_mapping"),
    pytest.param("", 1, "agent definition is empty", id="empty"),
    pytest.param(
        "name: a\nmodel: scripted:model.yaml\nname: b\n", 3, "duplicate key 'name'", id="duplicate_key"
    ),
    pytest.param(
        "name: x\nmodel: scripted:model.yaml\ntools:\n  - no_such_module_xyz:add\n",
        4,
        "tools[0]: module 'no_such_module_xyz' not found",
        id="unknown_tool_module",
    ),
    pytest.param(
        "name: x\nmodel: scripted:model.yaml\ntools: [missing.py:add]\n",
        3,
        "tools[0]: tool file 'missing.py' not found",
        id="missing_tool_file",
    ),
    pytest.param(
        "name: x\nmodel: scripted:model.yaml\ntools:\n  - tools.py:add\n  - tools.py:sub\n",
        5,
        "tools[1]: tools.py has no attribute 'sub'",
        id="missing_attribute",
    ),
    pytest.param(
        "name: x\nmodel: scripted:model.yaml\ntools: [just_a_name]\n",
        3,
        "tools[0]: 'just_a_name' must look like",
        id="bad_reference",
    ),
    pytest.param(
        "name: x\nmodel: scripted:model.yaml\ntools:\n - tools.py:add\n - tools.py:add\n",
        5,
        "tools[1]: a tool named 'add' is already listed",
        id="duplicate_tools",
    ),
    pytest.param(
        "name: x\ndescription: d\nmodel: scripted:nope.yaml\n",
        3,
        "model: scripted model file 'nope.yaml' not found",
        id="missing_scripted_model_file",
    ),
]


@pytest.mark.parametrize(("text", "line", "message"), ERRORS)
def test_errors_name_file_line_and_field(project: Path, text: str, line: int, message: str) -> None:
    p = write(project, "agent.yaml", text)
    assert str(error_of(p)).startswith(f"{p}:{line}: {message}")


def test_unknown_provider_and_the_flow_type(project: Path) -> None:
    p = write(project, "agent.yaml", "name: ok\nmodel: acme:x\n")
    assert "unknown provider 'acme'" in str(error_of(p))
    p = write(
        project,
        "agent.yaml",
        "name: ok\nmodel: scripted:model.yaml\ntype: flow\nsteps: [{name: a, prompt: hi}]\n",
    )
    assert load_definition(p).type == "flow"  # (flows are implemented since issue 16: tests/flows/)


def test_not_a_tool(project: Path) -> None:
    p = write(project, "agent.yaml", "name: x\nmodel: scripted:model.yaml\ntools: [tools.py:NOT_A_TOOL]\n")
    assert "is a int, not a tool or a function" in str(error_of(p))


def test_tool_module_that_fails_to_import(project: Path) -> None:
    write(project, "broken.py", "raise RuntimeError('kaput')\n")
    p = write(project, "agent.yaml", "name: x\nmodel: scripted:model.yaml\ntools: [broken.py:f]\n")
    e = error_of(p)
    assert str(e).startswith(f"{p}:3: tools[0]: importing broken.py failed: RuntimeError: kaput")


def test_bad_scripted_model_file(project: Path) -> None:
    m = write(project, "bad.yaml", "scripted: true\nrules:\n  - responses:\n      - txt: hi\n")
    p = write(project, "agent.yaml", "name: x\nmodel: scripted:bad.yaml\n")
    e = error_of(p)
    assert e.path is not None and Path(e.path).resolve() == m.resolve()
    assert e.line == 4
    assert "unknown key 'txt' in rules[0].responses[0]" in str(e)


def test_scripted_model_file_must_be_labelled(project: Path) -> None:
    m = write(project, "bad.yaml", "rules:\n  - responses:\n      - text: hi\n")
    with pytest.raises(stead.DefinitionError, match=r"bad\.yaml:1: scripted: required field is missing"):
        load_scripted_model(m)
    m = write(project, "bad.yaml", "scripted: true\nrules:\n  - responses:\n      - chunk: 3\n")
    with pytest.raises(
        stead.DefinitionError, match=r"bad\.yaml:4: rules\[0\]\.responses\[0\]: a response needs"
    ):
        load_scripted_model(m)


def test_definition_file_not_found(tmp_path: Path) -> None:
    e = error_of(tmp_path / "missing.yaml")
    assert "agent definition not found" in str(e)


# ------------------------------------------------------------------ scripted model semantics
def _request(*messages: Message) -> ProviderRequest:
    return ProviderRequest(model="m", instructions="", messages=list(messages), tools=[])


SCRIPT = ScriptedModelFile.model_validate(
    {
        "scripted": True,
        "chunk": 3,
        "rules": [
            {
                "when": {"user_contains": "PARALLEL"},
                "responses": [
                    {"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]},
                    {"text": "both done"},
                ],
            },
            {
                "when": {"user_matches": r"^\d+$"},
                "responses": [
                    {"tool_call": {"name": "sq", "arguments": {"n": "{user}"}}},
                    {
                        "tool_call": {
                            "name": "sq",
                            "arguments": {"n": "{last_tool_result}", "s": "r={last_tool_result}"},
                        }
                    },
                    {"text": "result {last_tool_result}"},
                ],
            },
            {"responses": [{"text": "you said {user}"}]},
        ],
    }
)


def test_scripted_responses_follow_the_request() -> None:
    respond = scripted_responder(SCRIPT)
    user = Message("user", [Text("7")])
    r = respond(_request(user))
    assert isinstance(r, ScriptedResponse) and r.chunk == 3
    assert r.blocks == [ToolCall("sq", {"n": 7})]
    call = Message("assistant", [ToolCall("sq", {"n": 7}, "c1")])
    result = Message("tool", [ToolResult("c1", "49")])
    r = respond(_request(user, call, result))
    assert r.blocks == [ToolCall("sq", {"n": 49, "s": "r=49"})]
    r = respond(_request(user, call, result, call, Message("tool", [ToolResult("c1", "2401")])))
    assert r.blocks == [Text("result 2401")]
    # a new user message starts the count again
    r = respond(
        _request(user, call, result, Message("assistant", [Text("x")]), Message("user", [Text("hey")]))
    )
    assert r.blocks == [Text("you said hey")]


def test_parallel_calls_and_running_out() -> None:
    respond = scripted_responder(SCRIPT)
    user = Message("user", [Text("do it in PARALLEL")])
    r = respond(_request(user))
    assert [b.name for b in r.blocks if isinstance(b, ToolCall)] == ["a", "b"]
    a1 = Message("assistant", [Text("both done")])
    r = respond(_request(user, Message("assistant", r.blocks), a1))
    assert r.error is not None and "all were used" in r.error
