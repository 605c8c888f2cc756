"""Bounded input the kernel accepts or loads (docs/security.md): metadata depth (SEC6k1), template render
budgets (SEC6k2), YAML alias expansion (SEC6k3), and the SQLite store's file modes (SEC7k1)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.errors import DefinitionError, InvalidInput
from stead.testing import ScriptedProvider


def nested(levels: int) -> dict[str, Any]:
    """A dict nesting `levels` levels of objects and lists (the outermost counts as one)."""
    value: Any = "leaf"
    for i in range(levels - 1):
        value = {"k": value} if i % 2 else [value]
    return {"k": value}


async def test_SEC6k1_metadata_nested_past_32_levels_is_refused_before_any_write(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m")
        for levels in (33, 900, 100_000):  # 100,000 would exhaust any recursive walk
            with pytest.raises(InvalidInput, match="metadata nests more than 32 levels deep"):
                await agent.send("hi", metadata=nested(levels))
        assert await agent.history() == [] and await agent.queued() == []
        await agent.send("hi", metadata=nested(32))  # 32 levels are fine
        await agent.wait_idle(10)
        (first, _) = await agent.history()
        assert first.metadata == nested(32)


def _definition(directory: Path, instructions: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: ok\n")
    (directory / "writer.yaml").write_text(
        "name: writer\nmodel: scripted:model.yaml\ninstructions: |\n"
        + "".join(f"  {line}\n" for line in instructions.splitlines())
    )
    return directory


@pytest.mark.parametrize(
    ("template", "budget"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "longer than 2"),
        ("{% for i in range(100000) %}{{ 'abcdefghij' }}{% endfor %}", "past 500,000 characters"),
        ("{{ 'x' * 10**9 }}", "`*` would build 1,000,000,000 items"),
        ("{% for i in range(10**9) %}x{% endfor %}", "Range too big"),
    ],
)
async def test_SEC6k2_a_template_past_its_render_budget_ends_with_an_error(
    db_url: str, tmp_path: Path, template: str, budget: str
) -> None:
    team = _definition(tmp_path / "team", "Hello.\n" + template)
    async with stead.open(db_url, definitions=team) as system:
        started = time.monotonic()
        with pytest.raises(DefinitionError, match="instructions: ") as caught:
            await system.create(definition="writer")
        assert time.monotonic() - started < 5
        assert budget in str(caught.value)
        assert await system.agents() == []  # nothing was created


async def test_SEC6k2_an_ordinary_template_renders_unchanged(db_url: str, tmp_path: Path) -> None:
    team = _definition(tmp_path / "team", "{% for i in range(3) %}{{ i * 2 }},{% endfor %} {{ 'ab' * 2 }}")
    async with stead.open(db_url, definitions=team) as system:
        agent = await system.create(definition="writer")
        assert agent.config.instructions == "0,2,4, abab\n"


LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_SEC6k3_a_billion_laughs_definition_is_refused_at_once(tmp_path: Path) -> None:
    from stead.definitions import load_registry

    team = tmp_path / "team"
    team.mkdir()
    (team / "laughs.yaml").write_text("name: laughs\nmodel: scripted:x.yaml\n" + LAUGHS)
    assert len(LAUGHS) < 400
    started = time.monotonic()
    with pytest.raises(DefinitionError, match=r"more than 100,000 values once its aliases") as caught:
        load_registry(team)
    assert time.monotonic() - started < 1
    assert caught.value.path is not None and caught.value.path.endswith("laughs.yaml")


def test_SEC6k3_aliases_that_repeat_a_value_still_load(tmp_path: Path) -> None:
    from stead._yaml import read_yaml

    path = tmp_path / "ok.yaml"
    path.write_text("base: &base {a: 1, b: [1, 2]}\none: *base\ntwo: *base\n")
    assert read_yaml(path).data == {
        "base": {"a": 1, "b": [1, 2]},
        "one": {"a": 1, "b": [1, 2]},
        "two": {"a": 1, "b": [1, 2]},
    }
    path.write_text("deep: " + "[" * 150 + "]" * 150 + "\n")
    with pytest.raises(DefinitionError, match="nests more than 100 levels"):
        read_yaml(path)


@pytest.mark.sqlite_only
async def test_SEC7k1_the_sqlite_store_creates_its_files_0600_under_umask_022(tmp_path: Path) -> None:
    path = tmp_path / "private" / "stead.db"
    old = os.umask(0o022)
    try:
        provider = ScriptedProvider(lambda r: [stead.Text("ok")])
        async with stead.open(f"sqlite:///{path}", providers={"scripted": provider}) as system:
            agent = await system.create(provider="scripted", model="m")
            await agent.run("write something")
            files = sorted(p.name for p in path.parent.iterdir())
            assert files == ["stead.db", "stead.db-shm", "stead.db-wal", "stead.db.lock"]
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(files, 0o600)
