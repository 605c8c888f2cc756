"""Definition errors a new user hits (issue 9): YAML syntax errors at the line where the problem starts,
YAML files in a definitions directory that are not agent definitions, and tool parameter types without a
JSON schema — each one `DefinitionError` line naming the file (and the tool and parameter)."""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from stead.definitions import DefinitionError, load_definition, load_registry

MODEL = "scripted: true\nrules:\n  - responses:\n      - text: hi\n"


def write(directory: Path, name: str, text: str) -> Path:
    p = directory / name
    p.write_text(text)
    return p


def test_an_unterminated_quote_is_reported_where_it_starts(tmp_path: Path) -> None:
    p = write(tmp_path, "agent.yaml", 'name: x\nmodel: "scripted:model.yaml\ntools: []\ninstructions: hi\n')
    with pytest.raises(DefinitionError) as info:
        load_definition(p)
    assert info.value.line == 2
    assert str(info.value) == (
        f"{p}:2: YAML syntax error: a quoted scalar starts here and is never closed "
        "(found unexpected end of stream at line 5)"
    )
    p = write(tmp_path, "flow.yaml", "name: x\nmodel: scripted:model.yaml\ntools: [a, b\n\n\n")
    with pytest.raises(DefinitionError, match=r"flow.yaml:3: YAML syntax error: a flow sequence starts here"):
        load_definition(p)


def test_a_yaml_file_that_is_not_a_definition_is_named(tmp_path: Path) -> None:
    write(tmp_path, "model.yaml", MODEL)
    write(tmp_path, "agent.yaml", "name: a\nmodel: scripted:model.yaml\n")
    write(tmp_path, ".pre-commit-config.yaml", "repos: []\n")  # hidden files are skipped (documented)
    assert list(load_registry(tmp_path)) == ["a"]
    compose = write(tmp_path, "docker-compose.yaml", "services:\n  db:\n    image: postgres\n")
    with pytest.raises(DefinitionError) as info:
        load_registry(tmp_path)
    assert str(info.value) == (
        f"{compose}:1: not an agent definition: it has none of the keys name, model, instructions "
        "(its keys: services)"
    )
    with pytest.raises(DefinitionError, match=r"docker-compose\.yaml:1: not an agent definition"):
        load_definition(compose)
    with pytest.raises(DefinitionError, match=r"model.yaml:1: this is a scripted model file"):
        load_definition(tmp_path / "model.yaml")


class Thing:
    """A plain class: pydantic cannot make a JSON schema of it."""


def test_a_tool_parameter_without_a_schema_is_one_line() -> None:
    def lookup(query: str, thing: Thing) -> str:
        return query

    with pytest.raises(stead.ConfigurationError) as info:
        stead.tool(lookup)
    message = str(info.value)
    assert message.startswith("tool 'lookup': parameter 'thing' has type Thing, which cannot be turned into")
    assert "\n" not in message and "pydantic" in message  # names what works instead, in one line


@pytest.mark.parametrize("decorated", [True, False], ids=["@stead.tool", "plain-function"])
def test_a_tool_parameter_without_a_schema_fails_the_definition_at_load_time(
    tmp_path: Path, decorated: bool
) -> None:
    write(tmp_path, "model.yaml", MODEL)
    write(
        tmp_path,
        "tools.py",
        "import stead\n\nclass Thing:\n    pass\n\n"
        + ("@stead.tool\n" if decorated else "")
        + "def lookup(thing: Thing) -> str:\n    return ''\n",
    )
    p = write(tmp_path, "agent.yaml", "name: a\nmodel: scripted:model.yaml\ntools: [tools.py:lookup]\n")
    with pytest.raises(DefinitionError) as info:
        load_definition(p)
    message = str(info.value)
    assert message.startswith(f"{p}:3: tools[0]: ")
    assert "tool 'lookup': parameter 'thing' has type Thing, which cannot be turned into" in message
    assert "\n" not in message and "Traceback" not in message
