"""Realtime model resolution (preference first, then realtime catalog models by power; vendor with a key and
a driver), layered settings (definition < target agent < runtime override), `type: realtime` definitions,
and the run-record helpers the plugin writes its session run with."""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from stead.definitions import DefinitionError, load_definition, load_registry
from stead.errors import ConfigurationError, InvalidInput
from stead.extend import end_run, record_run, record_step, update_step
from stead.messages import Usage
from stead.realtime import OpenAIRealtimeDriver, RealtimePlugin, TextDuplexDriver, resolve_realtime
from stead.realtime._config import deep_merge, effective_settings
from tests.realtime.support import FakeClock, open_team, write_team

CATALOG = """\
models:
  rt-small: {vendor: openai, power: 10, realtime: true}
  rt-big: {vendor: openai, power: 90, realtime: true}
"""


def test_resolution_takes_the_preference_first(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: hi\n")
    choice = resolve_realtime("text-duplex:s.yaml", base_dir=tmp_path, clock=FakeClock(), env={})
    assert choice.spec == "text-duplex:s.yaml" and isinstance(choice.make(), TextDuplexDriver)
    choice = resolve_realtime(
        ["openai:gpt-realtime", "text-duplex:s.yaml"],
        base_dir=tmp_path,
        clock=FakeClock(),
        env={"OPENAI_API_KEY": "k"},
    )
    model = choice.make()
    assert isinstance(model, OpenAIRealtimeDriver) and model.name == "openai:gpt-realtime"
    assert model.url == "wss://api.openai.com/v1/realtime?model=gpt-realtime"


def test_resolution_walks_realtime_models_by_power_and_needs_a_key(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    env = {"STEAD_CATALOG": str(catalog), "OPENAI_API_KEY": "k"}
    assert resolve_realtime(None, base_dir=tmp_path, clock=FakeClock(), env=env).spec == "rt-big"
    # a preference without a key falls through to the walk; without any key nothing resolves
    with pytest.raises(ConfigurationError) as e:
        resolve_realtime(
            "openai:gpt-realtime", base_dir=tmp_path, clock=FakeClock(), env={"STEAD_CATALOG": str(catalog)}
        )
    message = str(e.value)
    assert "openai:gpt-realtime: no API key for openai: set OPENAI_API_KEY" in message
    assert message.index("rt-big") < message.index("rt-small")


def test_resolution_refuses_a_text_model_and_uses_registered_ones(tmp_path: Path) -> None:
    env = {"OPENAI_API_KEY": "k"}
    with pytest.raises(ConfigurationError, match=r"gpt-4\.1: not a realtime model"):
        resolve_realtime(
            "gpt-4.1", base_dir=tmp_path, clock=FakeClock(), env={**env, "STEAD_CATALOG": _empty(tmp_path)}
        )
    made: list[str] = []

    def factory(model: str) -> TextDuplexDriver:
        made.append(model)
        from stead.realtime import DuplexScript

        return TextDuplexDriver(
            DuplexScript.model_validate({"scripted": True, "rules": [{"responses": [{"text": "x"}]}]})
        )

    choice = resolve_realtime(
        "mine:any-model", base_dir=tmp_path, clock=FakeClock(), registered={"mine": factory}, env={}
    )
    choice.make()
    assert made == ["any-model"]


def _empty(tmp_path: Path) -> str:
    p = tmp_path / "no-realtime.yaml"
    p.write_text("models:\n  gpt-realtime: null\n")
    return str(p)


def test_settings_layers_merge_objects_and_replace_lists(tmp_path: Path) -> None:
    assert deep_merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "d": 2}) == {
        "a": {"b": 1, "c": [3]},
        "d": 2,
    }
    team = write_team(
        tmp_path / "team",
        voice={
            "realtime": {
                "voice": "marin",
                "narration": {"every": 10, "max_items": 2},
                "session": {"x": [1, 2]},
            }
        },
    )
    worker = team / "worker.yaml"
    worker.write_text(
        worker.read_text()[:-1] + ', "realtime": {"narration": {"every": 12}, "session": {"x": [3]}}}'
    )
    registry = load_registry(team)
    s = effective_settings(registry["voice"], [registry["worker"]], {"voice": "cedar"})
    assert s.voice == "cedar"  # runtime override > target agent > definition
    assert s.narration.every == 12 and s.narration.max_items == 2 and s.narration.first_after == 5
    assert s.session == {"x": [3]}  # lists replace
    assert s.model == "text-duplex:voice-model.yaml"  # the definition's model is the first layer's
    with pytest.raises(InvalidInput, match=r"narration\.every"):
        effective_settings(registry["voice"], [], {"narration": {"every": -1}})


def test_realtime_definitions_are_checked(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.yaml").write_text("name: a\ntype: realtime\nmodel: text-duplex:x.yaml\n")
    with pytest.raises(DefinitionError, match="needs target_agents"):
        load_definition(d / "a.yaml")
    (d / "b.yaml").write_text("name: b\nmodel: text-duplex:x.yaml\n")
    with pytest.raises(DefinitionError, match="unknown provider 'text-duplex'"):  # only realtime agents
        load_definition(d / "b.yaml")
    (d / "c.yaml").write_text("name: c\nmodel: scripted:x.yaml\ntarget_agents: [a]\n")
    with pytest.raises(DefinitionError, match="target_agents is for realtime agents"):
        load_definition(d / "c.yaml")


async def test_unknown_target_agents_are_refused_at_open(tmp_path: Path, db_url: str) -> None:
    team = write_team(tmp_path / "team", voice={"target_agents": ["ghost"]})
    with pytest.raises(ConfigurationError, match="target_agents: unknown agent 'ghost'"):
        await stead.open(db_url, definitions=team, plugins=[RealtimePlugin()])


async def test_system_realtime_needs_the_plugin_and_a_realtime_definition(
    tmp_path: Path, db_url: str
) -> None:
    team = write_team(tmp_path / "team")
    async with await stead.open(db_url, definitions=team) as system:
        with pytest.raises(ConfigurationError, match="needs the realtime plugin"):
            await system.realtime(definition="voice")
    async with open_team(db_url, team) as system:
        with pytest.raises(ConfigurationError, match="has type 'loop'"):
            await system.realtime(definition="worker")
        with pytest.raises(ConfigurationError, match="no realtime definition named 'nobody'"):
            await system.realtime(definition="nobody")


async def test_record_run_update_step_end_run(db_url: str) -> None:
    async with await stead.open(db_url) as system:
        async with system.store.transaction() as tx:
            await record_run(tx, "r1", "a1", agent_name="voice", session_id="s1")
            step = await record_step(tx, "r1", "prompt", "session", status="running", target="m")
        async with system.store.transaction() as tx:
            await update_step(tx, "r1", step, usage=Usage(10, 5, 2, 0.5), provider="openai")
            await end_run(tx, "r1", final_message="bye")
        run = await system.run("r1")
    assert run.status == "completed" and run.session_id == "s1" and run.final_message == "bye"
    assert (run.own_input_tokens, run.own_output_tokens, run.own_cached_tokens, run.own_cost) == (
        10,
        5,
        2,
        0.5,
    )
    assert run.steps[0].status == "completed"  # still-running steps end with the run


async def test_run_record_helpers_are_no_ops_with_records_off(db_url: str) -> None:
    async with await stead.open(db_url, records=False) as system, system.store.transaction() as tx:
        await record_run(tx, "r1", "a1")
        await update_step(tx, "r1", "s", status="completed")
        await end_run(tx, "r1")


async def test_creating_a_realtime_definition_as_an_agent_points_at_system_realtime(
    tmp_path: Path, db_url: str
) -> None:
    team = write_team(tmp_path / "team")
    async with open_team(db_url, team) as system:
        with pytest.raises(
            ConfigurationError, match=r"open a session with system\.realtime\(definition='voice'\)"
        ):
            await system.create(definition="voice")
