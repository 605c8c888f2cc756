"""One model-string grammar (issue 8, item 6; issue 9, item 8 and two error lines), end to end.

The same strings — a catalog vendor (`ollama:`, its endpoint moved by a catalog override or by `@URL`),
`openai-compatible:MODEL@URL`, a bare catalog name and a provider registered with
`stead.open(providers={"mine": ...})` — load from a definition and run, and work through
`create(model=)`, `send(model=)` and `stead run ... --model` (a real subprocess), all against the loopback
fake servers. Unknown names give one error listing what is known; a candidate list falls back to the next
candidate when the first cannot be used; a scripted model file is found again by a process that never saw
its definition; `stead models` names the default that `create()` without a model uses; a local server that
is not running is one line naming the URL, after the configured retries.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.definitions import load_definition
from stead.messages import Text
from stead.providers.openai import OpenAIProvider
from stead.providers.scripted import ScriptedProvider
from tests.fakes import Reply
from tests.fakes.openai_server import OpenAIFakeServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "calculator" / "agent.yaml"
FAST = stead.RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
SCRIPT = "scripted: true\nrules:\n  - responses:\n      - text: 'scripted says: {user}'\n"


@dataclass(frozen=True)
class Case:
    """One model string of the grammar, and what the fake server must see for it."""

    spec: str  # `{url}`: the fake server's base URL
    wire: str  # the model name the server receives
    catalog: str | None = None  # a STEAD_CATALOG override (`{url}` as above)
    env: tuple[tuple[str, str], ...] = ()
    registered: bool = False  # served by providers={"mine": OpenAIProvider(base_url=fake)}
    key: str | None = None  # the bearer token the server must receive


CASES = {
    "ollama-vendor-moved-by-the-catalog": Case(
        "ollama:llama3.2", "llama3.2", catalog="vendors:\n  ollama:\n    base_url: {url}\n"
    ),
    "ollama-vendor-at-url": Case("ollama:qwen2.5:7b@{url}", "qwen2.5:7b"),
    "openai-compatible-at-url": Case("openai-compatible:gpt-x@{url}", "gpt-x"),
    "bare-catalog-name": Case(
        "gpt-4.1-mini",
        "gpt-4.1-mini",
        catalog="vendors:\n  openai:\n    base_url: {url}\n",
        env=(("OPENAI_API_KEY", "sk-dummy"),),
        key="Bearer sk-dummy",
    ),
    "registered-custom-provider": Case("mine:any", "any", registered=True, key="Bearer sk-mine"),
}


class Setup:
    """A case applied to a test: the model string, the environment and the providers to register."""

    def __init__(self, case: Case, server: OpenAIFakeServer, tmp_path: Path, mp: pytest.MonkeyPatch) -> None:
        self.case = case
        self.server = server
        self.spec = case.spec.format(url=server.base_url)
        self.env: dict[str, str] = dict(case.env)
        if case.catalog is not None:
            path = tmp_path / "models.yaml"
            path.write_text(case.catalog.format(url=server.base_url))
            self.env["STEAD_CATALOG"] = str(path)
        for name, value in self.env.items():
            mp.setenv(name, value)
        self.mine = OpenAIProvider(base_url=server.base_url, api_key="sk-mine") if case.registered else None

    def providers(self, **more: stead.Provider) -> dict[str, stead.Provider]:
        return {**more, **({"mine": self.mine} if self.mine is not None else {})}

    def check_request(self) -> None:
        request = self.server.requests[-1]
        assert request.body["model"] == self.case.wire
        if self.case.key is not None:
            assert request.headers["authorization"] == self.case.key

    async def aclose(self) -> None:
        if self.mine is not None:
            await self.mine.aclose()


@pytest.fixture(params=list(CASES))
async def case(
    request: pytest.FixtureRequest, oai: OpenAIFakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    setup = Setup(CASES[request.param], oai, tmp_path, monkeypatch)
    yield setup
    await setup.aclose()


@pytest.fixture(params=[name for name, c in CASES.items() if not c.registered])
async def cli_case(
    request: pytest.FixtureRequest, oai: OpenAIFakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Setup:
    """The cases the command line can name (it registers no custom provider)."""
    return Setup(CASES[request.param], oai, tmp_path, monkeypatch)


def write_definition(directory: Path, model: str, name: str = "helper") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "script.yaml").write_text(SCRIPT)
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\ninstructions: Be brief.\nmodel: {json.dumps(model)}\n")
    return path


async def ask(agent: stead.Agent, text: str, **settings: Any) -> str:
    await agent.send(text, **settings)
    await agent.wait_idle(timeout=20)
    return (await agent.history())[-1].text


async def stead_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the `stead` command in a real subprocess (the fake servers keep serving on this loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from stead.cli import main; main()",
        *args,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


# ---------------------------------------------------------------------------- the same strings, everywhere
async def test_model_string_in_a_definition_loads_and_runs(case: Setup, tmp_path: Path, db_url: str) -> None:
    team = tmp_path / "team"
    write_definition(team, case.spec)
    case.server.push(Reply([Text("from the fake")]))
    async with await stead.open(db_url, definitions=team, providers=case.providers(), retry=FAST) as system:
        agent = await system.create(definition="helper")
        assert await ask(agent, "hi") == "from the fake"
        stored = agent.settings
    case.check_request()
    if case.case.registered:
        assert (stored["provider"], stored["model"]) == ("mine", "any")
    else:
        assert (stored["provider"], stored["model"]) == ("catalog", case.spec)


async def test_model_string_through_create(case: Setup, db_url: str) -> None:
    case.server.push(Reply([Text("created on it")]))
    async with await stead.open(db_url, providers=case.providers(), retry=FAST) as system:
        agent = await system.create(model=case.spec, instructions="Be brief.")
        assert await ask(agent, "hi") == "created on it"
    case.check_request()


async def test_model_string_through_send(case: Setup, tmp_path: Path, db_url: str) -> None:
    case.server.push(Reply([Text("switched to it")]))
    script = tmp_path / "first.yaml"
    script.write_text(SCRIPT)
    async with await stead.open(db_url, providers=case.providers(), retry=FAST) as system:
        agent = await system.create(model=f"scripted:{script}")  # a scripted file: not a registered provider
        assert await ask(agent, "one") == "scripted says: one"
        assert await ask(agent, "two", model=case.spec) == "switched to it"
        assert agent.settings["provider"] == ("mine" if case.case.registered else "catalog")
    case.check_request()


async def test_model_string_through_run_model(cli_case: Setup, tmp_path: Path) -> None:
    case = cli_case
    case.server.push(Reply([Text("the command used it")]))
    db = tmp_path / "cli.db"
    code, out, err = await stead_cli(
        "run", str(EXAMPLE), "hi", "--model", case.spec, "--db", str(db), cwd=tmp_path, env=case.env
    )
    assert code == 0, err
    assert "the command used it" in out
    case.check_request()


# ---------------------------------------------------------------------------------------- unknown names
def assert_lists_what_is_known(message: str, registered: str) -> None:
    assert f"registered providers: {registered}" in message
    assert "catalog vendors: anthropic, ollama, openai, openai-compatible" in message
    assert "driver kinds: openai, anthropic, openai-compatible" in message
    assert "scripted:FILE.yaml" in message
    assert "openai:nosuchvendor" not in message  # no suggestion that glues a vendor onto an unknown one
    assert "\n" not in message


async def test_unknown_names_give_one_error_listing_what_is_known(tmp_path: Path, db_url: str) -> None:
    mine = ScriptedProvider(lambda r: [Text("mine")])
    async with await stead.open(db_url, providers={"mine": mine}) as system:
        with pytest.raises(stead.ConfigurationError, match="unknown provider 'nosuchvendor'") as info:
            await system.create(model="nosuchvendor:foo")
        assert_lists_what_is_known(str(info.value), "mine")
        with pytest.raises(stead.ConfigurationError, match="unknown provider 'nope'") as info:
            await system.create(provider="nope")
        assert_lists_what_is_known(str(info.value), "mine")
        with pytest.raises(stead.ConfigurationError, match="unknown model 'gpt-nope'") as info:
            await system.create(model="gpt-nope")
        assert_lists_what_is_known(str(info.value), "mine")
        agent = await system.create(model="mine:any")
        with pytest.raises(stead.ConfigurationError, match="unknown provider 'nosuchvendor'"):
            await agent.send("hi", model="nosuchvendor:foo", provider="catalog")
        assert await agent.history() == []  # refused before anything was written

    # in a definition: a file:line error, knowing the providers that will be registered
    path = write_definition(tmp_path / "defs", "nosuchvendor:foo")
    with pytest.raises(stead.DefinitionError) as err:
        load_definition(path, providers=["mine"])
    assert str(err.value).startswith(f"{path}:3: model: unknown provider 'nosuchvendor'")
    assert_lists_what_is_known(str(err.value), "mine")
    write_definition(tmp_path / "defs", "mine:any")
    with pytest.raises(stead.DefinitionError, match="unknown provider 'mine'"):
        load_definition(path)  # nobody said "mine" would be registered
    assert load_definition(path, providers=["mine"]).candidates == ["mine:any"]


async def test_unknown_vendor_on_the_command_line_is_one_line_that_makes_sense(tmp_path: Path) -> None:
    code, out, err = await stead_cli(
        "run", str(EXAMPLE), "hi", "--model", "nosuchvendor:foo", "--db", str(tmp_path / "x.db"), cwd=tmp_path
    )
    assert code == 1 and out == ""
    (line,) = error_lines(err)
    assert line.startswith("error: --model nosuchvendor:foo: unknown provider 'nosuchvendor'")
    assert "Traceback" not in err
    assert_lists_what_is_known(line, "none")


# ---------------------------------------------------------------------------------------- candidate lists
async def test_candidate_list_falls_back_when_the_first_key_is_missing(
    oai: OpenAIFakeServer, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = f"openai-compatible:gpt-x@{oai.base_url}"
    oai.push(Reply([Text("from the second candidate")]), Reply([Text("again")]), Reply([Text("third")]))
    team = tmp_path / "team"
    write_definition(team, ["openai:gpt-4.1-mini", local])  # OPENAI_API_KEY is not set
    write_definition(team, ["anthropic:claude-haiku-4-5", "scripted:script.yaml"], name="scripter")
    async with await stead.open(db_url, definitions=team, retry=FAST) as system:
        agent = await system.create(definition="helper")
        assert await ask(agent, "hi") == "from the second candidate"
        assert agent.settings["model"] == local  # the chosen candidate is what is stored
        direct = await system.create(model=["anthropic:claude-sonnet-4-6", local])
        assert await ask(direct, "hi") == "again"
        scripter = await system.create(definition="scripter")
        assert await ask(scripter, "hi") == "scripted says: hi"
        agent_id = agent.id
    monkeypatch.setenv("OPENAI_API_KEY", "sk-now-set")  # a restart with the key: the agent keeps its model
    async with await stead.open(db_url, definitions=team, retry=FAST) as system:
        agent = await system.get(agent_id)
        assert await ask(agent, "more") == "third"
    assert [r.body["model"] for r in oai.requests] == ["gpt-x", "gpt-x", "gpt-x"]


async def test_candidate_list_that_nobody_can_serve_lists_each_candidate(tmp_path: Path, db_url: str) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "helper.yaml").write_text(
        "name: helper\nmodel: [openai:gpt-4.1-mini, anthropic:claude-haiku-4-5]\n"
    )
    async with await stead.open(db_url, definitions=team) as system:
        with pytest.raises(stead.ConfigurationError) as info:
            await system.create(definition="helper")
    lines = str(info.value).splitlines()
    assert lines[0] == "definition 'helper': none of the models given can be used:"
    assert lines[1] == "  - openai:gpt-4.1-mini: no API key for openai: set OPENAI_API_KEY"
    assert lines[2] == "  - anthropic:claude-haiku-4-5: no API key for anthropic: set ANTHROPIC_API_KEY"


# ------------------------------------------------------------------------------------ scripted model files
async def test_scripted_model_file_is_found_again_without_its_definition(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "team"
    write_definition(team, "scripted:script.yaml")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "own.yaml").write_text(SCRIPT.replace("scripted says", "own script says"))
    monkeypatch.chdir(tmp_path / "cwd")
    async with await stead.open(db_url, definitions=team) as system:
        from_definition = await system.create(definition="helper")
        assert from_definition.settings["model"] == f"scripted:{(team / 'script.yaml').resolve()}"
        plain = await system.create(model="scripted:own.yaml")  # relative to the working directory
        assert plain.settings["provider"] == "scripted-file"
        assert plain.settings["model"] == f"scripted:{(tmp_path / 'cwd' / 'own.yaml').resolve()}"
        ids = from_definition.id, plain.id
    monkeypatch.chdir(tmp_path)
    async with await stead.open(db_url) as system:  # no definitions=, another working directory
        first, second = [await system.get(i) for i in ids]
        assert await ask(first, "one") == "scripted says: one"
        assert await ask(second, "two") == "own script says: two"
        with pytest.raises(stead.ConfigurationError, match=r"scripted model file .*nope\.yaml not found"):
            await system.create(model="scripted:nope.yaml")


# ---------------------------------------------------------------------------------------- the default model
async def test_create_without_a_model_uses_the_default_stead_models_names(
    oai: OpenAIFakeServer, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"vendors:\n  openai:\n    base_url: {oai.base_url}\n")
    env = {"OPENAI_API_KEY": "sk-dummy", "STEAD_CATALOG": str(catalog)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = await stead_cli("models", cwd=tmp_path, env=env)
    assert code == 0, err
    named = err.split("the default model now is ", 1)[1].split()[0]
    oai.push(Reply([Text("the default answers")]))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(instructions="Be brief.")
        assert agent.settings["model"] == named  # the very model `stead models` named
        assert await ask(agent, "hi") == "the default answers"
    assert oai.requests[-1].body["model"] == named.partition(":")[2]


async def test_create_without_a_model_and_none_usable_says_what_to_set(tmp_path: Path, db_url: str) -> None:
    async with await stead.open(db_url) as system:
        with pytest.raises(stead.ConfigurationError, match="model=") as info:
            await system.create()
    assert "set ANTHROPIC_API_KEY or OPENAI_API_KEY" in str(info.value) and "\n" not in str(info.value)
    code, _, err = await stead_cli("models", cwd=tmp_path)
    assert code == 0 and "create() without model= refuses" in err and "default model now" not in err


# ------------------------------------------------------------------------------------ a server not running
async def free_port() -> int:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port: int = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    return port


class CountAttempts(stead.Hooks):
    def __init__(self) -> None:
        self.attempts = 0

    async def before_inference(self, ctx: stead.HookContext) -> str | None:
        self.attempts += 1
        return None


async def test_local_server_not_running_is_one_line_after_the_retries(db_url: str) -> None:
    url = f"http://127.0.0.1:{await free_port()}/v1"
    count = CountAttempts()
    async with await stead.open(db_url, retry=FAST, hooks=[count]) as system:
        agent = await system.create(model=f"openai-compatible:llama3.2@{url}")
        settled: list[stead.Settled] = []

        async def watch() -> None:
            async for event in agent.events():
                if isinstance(event, stead.Settled):
                    settled.append(event)
                    return

        watcher = asyncio.get_running_loop().create_task(watch())
        await ask(agent, "hi")
        await asyncio.wait_for(watcher, 10)
    assert count.attempts == FAST.max_attempts
    (event,) = settled
    assert event.error is not None and "\n" not in event.error
    assert f"connection failed to {url}" in event.error and event.error.endswith("is the server running?")


async def test_local_server_not_running_on_the_command_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{await free_port()}/v1"
    spec = f"openai-compatible:llama3.2@{url}"
    code, out, err = await stead_cli("run", str(EXAMPLE), "hi", "--model", spec, "--db", "x.db", cwd=tmp_path)
    assert code == 1 and out == "" and "Traceback" not in err
    (line,) = error_lines(err)
    assert f"connection failed to {url}" in line and line.endswith("is the server running?")
