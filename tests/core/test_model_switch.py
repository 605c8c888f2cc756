"""K2 through the kernel: per-message model switches keep or reset the conversation, atomically.

`compatible()` decides: a switch within one vendor and driver keeps the history (tool-call ids and thinking
signatures stay valid); a switch to another vendor, driver or registered provider resets it, in the same
transaction that consumes the switching message. An old route that no longer resolves never blocks a switch
(it counts as incompatible). A crash at any store operation of the switching turn lands on one side: the old
history with the message still queued (or never accepted), or the reset history with the message consumed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.core import records as R
from stead.extend import ModelChangedInfo
from stead.messages import Text, ToolCall
from stead.providers.catalog import compatible, parse_model
from stead.providers.router import ModelRouter
from stead.providers.scripted import ScriptedProvider
from tests.fakes import Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.cli import invoke
from tests.fakes.crash_points import run_until_crash
from tests.fakes.openai_server import OpenAIFakeServer
from tests.providers.test_kernel_providers import (
    FAST,
    ask,
    assert_calls_settled_once,
    lookup,
    shape,
)

pytestmark = pytest.mark.usefixtures("fake_api_keys")


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text of each wire message (both vendors' shapes)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.append(" ".join(str(p.get("text", "")) for p in content if isinstance(p, dict)))
    return out


# -------------------------------------------------------------------------------------------- compatible()
def test_compatible_is_same_vendor_and_driver() -> None:
    mini, big = parse_model("openai:gpt-4.1-mini"), parse_model("openai:gpt-4.1")
    assert compatible(mini, big)
    assert compatible(mini, parse_model("openai:gpt-4.1@https://proxy.internal/v1"))
    assert not compatible(mini, parse_model("anthropic:claude-sonnet-4-6"))
    assert not compatible(mini, parse_model("openai-compatible:gpt-4.1@http://localhost:8000/v1"))
    assert compatible(
        parse_model("ollama:llama3.2"), parse_model("ollama:qwen2.5:7b-instruct")
    )  # one server, two models
    assert not compatible(None, mini) and not compatible(mini, None)


def test_router_compatible_on_settings() -> None:
    router = ModelRouter({"a": ScriptedProvider(lambda r: []), "b": ScriptedProvider(lambda r: [])}, env={})
    cat = {"provider": "catalog"}
    assert router.compatible({"provider": "a", "model": "x"}, {"provider": "a", "model": "y"})
    assert not router.compatible({"provider": "a"}, {"provider": "b"})
    assert not router.compatible({"provider": "a", "profile": "p"}, {"provider": "a", "profile": "q"})
    local = "openai-compatible:m@http://127.0.0.1:1/v1"
    assert router.compatible(
        {**cat, "model": local}, {**cat, "model": "openai-compatible:n@http://127.0.0.1:1/v1"}
    )
    # no key in this router's env: the old route is unknown, so the switch resets (it is never refused)
    assert not router.compatible({**cat, "model": "openai:gpt-4.1"}, {**cat, "model": local})
    assert not router.compatible({"provider": "a"}, {**cat, "model": local})


# -------------------------------------------------------------------------------------------- keep / reset
@asynccontextmanager
async def answered_first(db_url: str, model: str) -> AsyncIterator[stead.Agent]:
    """An agent on `model` (a catalog model string) that has answered "first"."""
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model=model)
        await ask(agent, "first")
        yield agent


async def test_compatible_switch_keeps_history(oai: OpenAIFakeServer, db_url: str) -> None:
    oai.push(Reply([Text("one")]), Reply([Text("two")]))
    async with answered_first(db_url, f"openai:gpt-4.1-mini@{oai.base_url}") as agent:
        await ask(agent, "second", model=f"openai:gpt-4.1@{oai.base_url}")
        history = await agent.history()
        assert agent.settings["model"] == f"openai:gpt-4.1@{oai.base_url}"
    assert [m.text for m in history] == ["first", "one", "second", "two"]
    assert [r.body["model"] for r in oai.requests] == ["gpt-4.1-mini", "gpt-4.1"]
    assert texts(oai.requests[-1].body["messages"])[-3:] == ["first", "one", "second"]


async def test_incompatible_switch_resets_history_at_consumption(
    oai: OpenAIFakeServer, ant: AnthropicFakeServer, db_url: str
) -> None:
    oai.push(Reply([Text("one")]))
    ant.push(Reply([Text("two")]))
    async with answered_first(db_url, f"openai-compatible:gpt-x@{oai.base_url}") as agent:
        watch = await ask(agent, "second", model=f"anthropic:claude-haiku-4-5@{ant.url}")
        history = await agent.history()
        assert agent.settings["provider"] == "catalog"
        assert agent.settings["model"] == f"anthropic:claude-haiku-4-5@{ant.url}"
        agent_id = agent.id
    assert shape(history) == [("user", [("text", "second")]), ("assistant", [("text", "two")])]
    assert texts(ant.requests[-1].body["messages"]) == ["second"]
    consumed = watch.of(stead.MessageConsumed)
    assert [m.message.text for m in consumed] == ["second"]
    # durable: a reopened system sees the reset conversation and the new settings
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.get(agent_id)
        assert agent.settings["model"] == f"anthropic:claude-haiku-4-5@{ant.url}"
        assert shape(await agent.history()) == shape(history)


async def test_switch_between_registered_providers(db_url: str) -> None:
    a = ScriptedProvider(lambda r: [Text(f"a saw {len(r.messages)}")])
    b = ScriptedProvider(lambda r: [Text(f"b saw {len(r.messages)}")])
    async with await stead.open(db_url, providers={"a": a, "b": b}) as system:
        agent = await system.create(provider="a", model="m1")
        await ask(agent, "one")
        await ask(agent, "two", model="m2")  # same provider: kept
        await ask(agent, "three", provider="b")  # another provider: reset
        history = await agent.history()
    assert [m.text for m in history] == ["three", "b saw 1"]
    assert [r.model for r in a.requests] == ["m1", "m2"]
    assert len(a.requests[-1].messages) == 3


async def test_unknown_old_route_never_blocks_the_switch(
    oai: OpenAIFakeServer, ant: AnthropicFakeServer, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    oai.push(Reply([Text("one")]))
    ant.push(Reply([Text("two")]))
    async with answered_first(db_url, f"openai:gpt-4.1-mini@{oai.base_url}") as agent:
        monkeypatch.delenv("OPENAI_API_KEY")  # the old route no longer resolves
        await ask(agent, "second", model=f"anthropic:claude-haiku-4-5@{ant.url}")
        history = await agent.history()
    assert [m.text for m in history] == ["second", "two"]


async def test_switch_away_from_a_provider_this_process_lacks(ant: AnthropicFakeServer, db_url: str) -> None:
    ant.push(Reply([Text("now anthropic")]))
    async with await stead.open(
        db_url, providers={"gone": ScriptedProvider(lambda r: [Text("old")])}
    ) as system:
        agent = await system.create(provider="gone", model="m")
        await ask(agent, "first")
        agent_id = agent.id
    async with await stead.open(db_url, retry=FAST) as system:  # "gone" is not registered here
        agent = await system.get(agent_id)
        await ask(agent, "second", model=f"anthropic:claude-haiku-4-5@{ant.url}")
        assert [m.text for m in await agent.history()] == ["second", "now anthropic"]


async def test_same_model_at_another_endpoint_is_served_there(db_url: str) -> None:
    """Routes that differ only by base URL get their own driver (they must not share a cached one)."""
    first, second = AnthropicFakeServer(), AnthropicFakeServer()
    await first.start()
    await second.start()
    try:
        first.push(Reply([Text("from first")]))
        second.push(Reply([Text("from second")]))
        async with await stead.open(db_url, retry=FAST) as system:
            agent = await system.create(model=f"anthropic:claude-haiku-4-5@{first.url}")
            await ask(agent, "a")
            await ask(agent, "b", model=f"anthropic:claude-haiku-4-5@{second.url}")
            history = await agent.history()
        assert [m.text for m in history] == ["a", "from first", "b", "from second"]  # same vendor: kept
        assert len(first.requests) == 1 and len(second.requests) == 1
    finally:
        await first.close()
        await second.close()


async def test_switch_takes_effect_at_consumption_not_at_send(
    oai: OpenAIFakeServer, ant: AnthropicFakeServer, db_url: str
) -> None:
    """C3: a queued switching message changes nothing until it is consumed; the message before it is
    answered by the old model with the old history."""
    oai.push(Reply([ToolCall("lookup", {"city": "Oslo"})]), Reply([Text("Oslo: sunny")]))
    ant.push(Reply([Text("fresh start")]))
    async with await stead.open(db_url, retry=FAST, tools=[lookup]) as system:
        agent = await system.create(model=f"openai-compatible:gpt-x@{oai.base_url}", tools=["lookup"])
        await agent.send("Oslo?")
        await agent.send("switch", model=f"anthropic:claude-haiku-4-5@{ant.url}")
        assert agent.settings["model"] == f"openai-compatible:gpt-x@{oai.base_url}"
        await agent.wait_idle(timeout=20)
        history = await agent.history()
    assert [m.text for m in history] == ["switch", "fresh start"]
    assert len(oai.requests) == 2 and len(ant.requests) == 1


# ------------------------------------------------------------------------------------------ crash mid-switch
AGENT_ID = "switchagent0001"
MESSAGE_ID = "switchmessage0001"


class _Responder:
    """A fake server's reply queue that answers from the request: a tool call, then text once its result
    is in (so a recovered process gets the same answers whatever the crash consumed)."""

    def __init__(self, server: AnthropicFakeServer | OpenAIFakeServer, final: str) -> None:
        self.server, self.final = server, final

    def __bool__(self) -> bool:
        return True

    def popleft(self) -> Reply:
        body = json.dumps(self.server.requests[-1].body)
        if '"tool_result"' in body or '"role": "tool"' in body:
            return Reply([Text(self.final)])
        return Reply([ToolCall("lookup", {"city": "Lima"})], chunk=4)


async def _open(url: str, faults: stead.store.Faults | None = None, **kw: Any) -> stead.AgentSystem:
    return await stead.open(url, retry=FAST, tools=[lookup], faults=faults, **kw)


async def _switch_once(url: str, new_model: str, faults: stead.store.Faults) -> None:
    async def act(system: stead.AgentSystem) -> None:
        agent = await system.get(AGENT_ID)
        await agent.send("switch", id=MESSAGE_ID, model=new_model)
        await agent.wait_idle(timeout=20)

    await run_until_crash(_open(url, faults), faults, act)


def _copy_db(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


async def test_crash_anywhere_in_a_switching_turn_lands_on_one_side(
    oai: OpenAIFakeServer, ant: AnthropicFakeServer, tmp_path: Path
) -> None:
    old_model = f"openai-compatible:gpt-x@{oai.base_url}"
    new_model = f"anthropic:claude-haiku-4-5@{ant.url}"
    oai.replies = _Responder(oai, "old answer")  # type: ignore[assignment]
    ant.replies = _Responder(ant, "new answer")  # type: ignore[assignment]
    base = tmp_path / "base.db"
    async with await _open(f"sqlite:///{base}") as system:
        agent = await system.create(model=old_model, tools=["lookup"], agent_id=AGENT_ID)
        await ask(agent, "first")
        old_history = shape(await agent.history())
    assert [m[0] for m in old_history] == ["user", "assistant", "tool", "assistant"]

    count_db = tmp_path / "count.db"
    _copy_db(base, count_db)
    counter = stead.store.Faults()
    await _switch_once(f"sqlite:///{count_db}", new_model, counter)
    assert not counter.crashed
    n_ops = counter.ops
    assert n_ops > 10

    sides: set[str] = set()
    for crash_at in range(n_ops + 1):
        db = tmp_path / f"crash{crash_at}.db"
        _copy_db(base, db)
        url = f"sqlite:///{db}"
        faults = stead.store.Faults(crash_at=crash_at)
        await _switch_once(url, new_model, faults)
        assert faults.crashed == (crash_at < n_ops), crash_at

        # what a new process finds, before it resumes anything
        async with await _open(url, restore=False) as system:
            agent = await system.get(AGENT_ID)
            history = await agent.history()
            async with system.store.transaction() as tx:
                queued = [json.loads(v)["id"] for _, v in await tx.read_prefix(AGENT_ID, R.QUEUE) if v]
                settings = json.loads(await tx.get(AGENT_ID, R.SETTINGS) or "{}")
        if shape(history) == old_history:
            side = "queued" if queued == [MESSAGE_ID] else "not accepted"
            assert queued in ([MESSAGE_ID], []), (crash_at, queued)
            assert settings.get("model", old_model) == old_model, crash_at
        else:
            side = "switched"
            assert history[0].id == MESSAGE_ID and history[0].text == "switch", (crash_at, shape(history))
            assert all(m.text != "first" for m in history), crash_at
            assert queued == [], crash_at
            assert settings["model"] == new_model, crash_at
        sides.add(side)

        # a new process finishes the work: the switch happens exactly once
        async with await _open(url) as system:
            agent = await system.get(AGENT_ID)
            again = await agent.send("switch", id=MESSAGE_ID, model=new_model)
            assert again.created == (side == "not accepted"), crash_at
            await agent.wait_idle(timeout=20)
            history = await agent.history()
            assert not agent.active
        assert [m.id for m in history if m.role == "user"] == [MESSAGE_ID], crash_at
        assert history[-1].text == "new answer", (crash_at, shape(history))
        assert all(m.text not in ("first", "old answer") for m in history), crash_at
        assert_calls_settled_once(history)
    assert sides == {"not accepted", "queued", "switched"}


# ------------------------------------------------------------------------------------------ the command line
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "agent.yaml"


class ThreadedFake:
    """A fake server on its own event loop thread, for the synchronous CliRunner (which runs asyncio.run)."""

    def __init__(self, server: AnthropicFakeServer | OpenAIFakeServer) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = server
        asyncio.run_coroutine_threadsafe(server.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def threaded_oai() -> Iterator[OpenAIFakeServer]:
    fake = ThreadedFake(OpenAIFakeServer())
    yield fake.server  # type: ignore[misc]
    fake.close()


@pytest.fixture
def threaded_ant() -> Iterator[AnthropicFakeServer]:
    fake = ThreadedFake(AnthropicFakeServer())
    yield fake.server  # type: ignore[misc]
    fake.close()


def agent_of(err: str) -> str:
    return [ln for ln in err.splitlines() if ln.startswith("agent: ")][-1].removeprefix("agent: ").strip()


def test_models_lists_the_catalog_and_what_is_usable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    code, out, err = invoke("models")
    assert code == 0, err
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln.strip()}
    assert out.splitlines()[0].split() == [
        "model",
        "vendor",
        "power",
        "context",
        "input",
        "output",
        "cached",
        "usable",
    ]
    assert lines["gpt-4.1-mini"].split()[:8] == [
        "gpt-4.1-mini",
        "openai",
        "55",
        "1.05M",
        "0.4",
        "1.6",
        "0.1",
        "yes",
    ]
    assert "no (set ANTHROPIC_API_KEY)" in lines["claude-sonnet-4-6"]
    assert "200k" in lines["claude-haiku-4-5"]
    assert "default model now is openai:" in err

    code, out, _ = invoke("models", "--json")
    rows = {r["model"]: r for r in json.loads(out)}
    assert rows["claude-haiku-4-5"] == {
        "model": "claude-haiku-4-5",
        "vendor": "anthropic",
        "driver": "anthropic",
        "power": 74,
        "context": 200000,
        "prices": {"input": 1.0, "output": 5.0, "cached_input": 0.1},
        "realtime": False,
        "usable": False,
        "why": "set ANTHROPIC_API_KEY",
    }
    assert rows["gpt-4.1-mini"]["usable"] is True
    assert [r["power"] for r in json.loads(out) if not r["realtime"]] == sorted(
        (r["power"] for r in json.loads(out) if not r["realtime"]), reverse=True
    )

    # a catalog file adds a local model (no key needed: usable now) and --usable filters
    monkeypatch.delenv("OPENAI_API_KEY")
    catalog = tmp_path / "models.yaml"
    catalog.write_text(
        "models:\n  llama3.2:\n    vendor: ollama\n    power: 20\n    context: 131072\n"
        "    prices: {input: 0, output: 0}\n"
    )
    monkeypatch.setenv("STEAD_CATALOG", str(catalog))
    code, out, err = invoke("models", "--usable")
    assert code == 0
    assert [ln.split()[0] for ln in out.splitlines()[1:] if ln.strip()] == ["llama3.2"]
    assert "default model now is ollama:llama3.2" in err


def test_run_with_model_uses_the_real_driver(threaded_oai: OpenAIFakeServer, tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    threaded_oai.push(Reply([ToolCall("add", {"a": 2, "b": 3})]), Reply([Text("2+3 = 5")]))
    spec = f"openai:gpt-4.1-mini@{threaded_oai.base_url}"  # OPENAI_API_KEY is set (sk-test)
    code, out, err = invoke("run", str(EXAMPLE), "What is 2+3?", "--model", spec, "--db", str(db))
    assert code == 0, err
    assert "2+3 = 5" in out and "→ add(a=2, b=3)" in err
    body = threaded_oai.requests[-1].body
    assert body["model"] == "gpt-4.1-mini"
    assert {t["function"]["name"] for t in body["tools"]} == {"add", "multiply"}
    assert "careful calculator" in json.dumps(body["messages"][0])
    # the model string named its own URL: the operator's OPENAI_API_KEY is not sent there (SEC1a)
    assert threaded_oai.requests[-1].headers["authorization"] == "Bearer stead-no-key"
    code, out, _ = invoke("history", agent_of(err), "--db", str(db), "--json")
    assert [m["role"] for m in json.loads(out)] == ["user", "assistant", "tool", "assistant"]


def test_run_with_model_switches_an_existing_agent(
    threaded_oai: OpenAIFakeServer, threaded_ant: AnthropicFakeServer, tmp_path: Path
) -> None:
    db = tmp_path / "cli.db"
    threaded_oai.push(Reply([Text("local says hi")]))
    threaded_ant.push(Reply([Text("claude says hi")]))
    local = f"openai-compatible:llama3.2@{threaded_oai.base_url}"
    code, out, err = invoke("run", str(EXAMPLE), "hello", "--model", local, "--db", str(db))
    assert code == 0, err
    assert "local says hi" in out
    agent_id = agent_of(err)
    remote = f"anthropic:claude-haiku-4-5@{threaded_ant.url}"
    code, out, err = invoke(
        "run", str(EXAMPLE), "hello again", "--agent", agent_id, "--model", remote, "--db", str(db)
    )
    assert code == 0, err
    assert "claude says hi" in out
    code, out, _ = invoke("history", agent_id, "--db", str(db), "--json")
    assert [m["content"][0]["text"] for m in json.loads(out)] == ["hello again", "claude says hi"]  # reset


def test_run_with_model_missing_key_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    db = tmp_path / "cli.db"
    code, out, err = invoke("run", str(EXAMPLE), "hi", "--model", "openai:gpt-4.1-mini", "--db", str(db))
    assert code == 1
    assert out == ""
    assert err.strip().count("\n") == 0, err
    assert "OPENAI_API_KEY" in err and "openai:gpt-4.1-mini" in err
    code, _, err2 = invoke("run", str(EXAMPLE), "hi", "--model", "gpt-nope", "--db", str(db))
    assert code == 1 and "unknown model 'gpt-nope'" in err2 and err2.strip().count("\n") == 0
    code, out, _ = invoke("agents", "--db", str(db), "--json")
    assert json.loads(out or "[]") == []


async def test_K2_reset_opens_the_new_conversation_with_the_hook_handoff(tmp_path: Any) -> None:
    """An incompatible switch resets history; a `model_changed` hook's handoff opens the new context, in the
    live request and in the stored history alike (R4)."""
    seen: list[list[stead.Message]] = []

    def answer(name: str) -> Any:
        def respond(request: stead.ProviderRequest) -> list[stead.Block]:
            seen.append(list(request.messages))
            return [stead.Text(f"{name} answers")]

        return respond

    class Handoff(stead.Hooks):
        async def model_changed(self, ctx: stead.HookContext, info: ModelChangedInfo) -> str:
            old, new = info.old["provider"], info.new["provider"]
            return f"Handoff from {old} to {new}: the user asked about the weather."

    url = f"sqlite:///{tmp_path}/handoff.db"
    providers = {"a": ScriptedProvider(answer("a")), "b": ScriptedProvider(answer("b"))}
    async with await stead.open(url, providers=providers, hooks=[Handoff()]) as system:
        agent = await system.create(provider="a", model="m")
        await agent.send("weather?")
        await agent.wait_idle(timeout=10)
        await agent.send("and tomorrow?", provider="b")
        await agent.wait_idle(timeout=10)
        history = await agent.history()
    assert [(m.role, m.text) for m in history] == [
        ("system", "Handoff from a to b: the user asked about the weather."),
        ("user", "and tomorrow?"),
        ("assistant", "b answers"),
    ]
    assert [(m.role, m.text) for m in seen[-1]] == [(m.role, m.text) for m in history[:2]]
