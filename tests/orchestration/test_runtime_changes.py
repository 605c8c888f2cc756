"""Runtime changes (docs/orchestration.md): add/remove tools and sub-agents for one run with a scope (root,
global, all-subagents, specific), carried by the message, propagated to children by fixed rules."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import stead
from stead.orchestration import RUN_CHANGES_KEY, RuntimeChange, effective, propagate
from stead.providers.scripted import ScriptedProvider
from tests.orchestration.support import last_user, models, results_since_user, run, write_team


@stead.tool
def t_lead() -> str:
    """The lead's own tool."""
    return "lead tool"


@stead.tool
def t_work() -> str:
    """The workers' own tool."""
    return "work tool"


@stead.tool
def extra() -> str:
    """A tool no definition lists."""
    return "extra tool"


HERE = "tests.orchestration.test_runtime_changes"


def lead(request: stead.ProviderRequest) -> list[stead.Block]:
    results = results_since_user(request)
    if not results:
        task = last_user(request)
        return [stead.ToolCall("w1", {"request": task}), stead.ToolCall("w2", {"request": task})]
    return [stead.Text(" | ".join(r.output for r in results))]


def worker(request: stead.ProviderRequest) -> list[stead.Block]:
    results = results_since_user(request)
    if "call t_work" in last_user(request) and not results:
        return [stead.ToolCall("t_work", {})]
    return [stead.Text("; ".join(r.output for r in results) or "worked")]


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return write_team(
        tmp_path / "team",
        {
            "lead": {"sub_agents": ["w1", "w2"], "tools": [f"{HERE}:t_lead"]},
            "w1": {"tools": [f"{HERE}:t_work"]},
            "w2": {"tools": [f"{HERE}:t_work"]},
            "w3": {},
        },
    )


async def offered(
    team: Path, db_url: str, changes: list[RuntimeChange], text: str = "go"
) -> dict[str, list[str]]:
    """Run the team once with `changes`; return, per definition, the tool names its first request offered."""
    providers = models(lead=lead, w1=worker, w2=worker, w3=worker)
    async with await stead.open(db_url, definitions=team, providers=providers, tools=[extra]) as system:
        root = await system.create(definition="lead")
        await run(root, text, changes=changes)
        names = {a.id: a.name for a in await system.agents()}
        out: dict[str, list[str]] = {}
        for provider in providers.values():
            assert isinstance(provider, stead.Provider)
            for req in provider.requests:  # type: ignore[attr-defined]
                out.setdefault(str(names[req.agent_id]), sorted(t.name for t in req.tools))
        # after the run, the root offers its own tools again
        assert sorted(root._rt.config.tools) == ["t_lead", "w1", "w2"]
        return out


def change(action: str, kind: str, name: str, scope: str, agents: tuple[str, ...] = ()) -> RuntimeChange:
    return RuntimeChange(action, kind, name, scope, agents)  # type: ignore[arg-type]


async def test_no_changes(team: Path, db_url: str) -> None:
    seen = await offered(team, db_url, [])
    assert seen == {"lead": ["t_lead", "w1", "w2"], "w1": ["t_work"], "w2": ["t_work"]}


async def test_scope_root(team: Path, db_url: str) -> None:
    seen = await offered(team, db_url, [change("add", "tool", "extra", "root")])
    assert seen == {"lead": ["extra", "t_lead", "w1", "w2"], "w1": ["t_work"], "w2": ["t_work"]}


async def test_scope_global(team: Path, db_url: str) -> None:
    seen = await offered(team, db_url, [change("add", "tool", "extra", "global")])
    assert seen == {
        "lead": ["extra", "t_lead", "w1", "w2"],
        "w1": ["extra", "t_work"],
        "w2": ["extra", "t_work"],
    }


async def test_scope_all_subagents(team: Path, db_url: str) -> None:
    seen = await offered(team, db_url, [change("add", "tool", "extra", "all-subagents")])
    assert seen == {"lead": ["t_lead", "w1", "w2"], "w1": ["extra", "t_work"], "w2": ["extra", "t_work"]}


async def test_scope_specific(team: Path, db_url: str) -> None:
    seen = await offered(team, db_url, [change("add", "tool", "extra", "specific", ("w2",))])
    assert seen == {"lead": ["t_lead", "w1", "w2"], "w1": ["t_work"], "w2": ["extra", "t_work"]}
    seen = await offered(team, db_url, [change("remove", "tool", "t_lead", "specific", ("lead",))])
    assert seen["lead"] == ["w1", "w2"]


async def test_remove_sub_agent_and_add_sub_agent_at_the_root(team: Path, db_url: str) -> None:
    seen = await offered(
        team, db_url, [change("remove", "sub_agent", "w2", "root"), change("add", "sub_agent", "w3", "root")]
    )
    assert seen["lead"] == ["t_lead", "w1", "w3"]


async def test_a_removed_tool_is_refused_not_only_hidden(team: Path, db_url: str) -> None:
    providers = models(lead=lead, w1=worker, w2=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        root = await system.create(definition="lead")
        answer = await run(root, "call t_work", changes=[change("remove", "tool", "t_work", "all-subagents")])
        assert answer.text.count("Unknown tool 't_work'") == 2
        answer = await run(root, "call t_work")  # the next run has no changes
        assert answer.text == "work tool | work tool"


async def test_changes_are_durable_with_the_message_and_propagated(team: Path, db_url: str) -> None:
    providers = models(lead=lead, w1=worker, w2=worker)
    changes = [
        change("add", "tool", "extra", "root"),
        change("add", "tool", "extra", "all-subagents"),
        change("remove", "tool", "t_work", "specific", ("w1",)),
        change("add", "tool", "extra", "global"),
    ]
    seen_kv: dict[str | None, object] = {}

    class Spy(stead.Hooks):
        async def response_tx(self, ctx: stead.HookContext, info: stead.ResponseInfo) -> None:
            if ctx.tx is not None and ctx.agent_name not in seen_kv:
                raw = await ctx.tx.get(ctx.agent_id, RUN_CHANGES_KEY)  # the run KV, mid-run
                seen_kv[ctx.agent_name] = None if raw is None else json.loads(raw)

    async with await stead.open(
        db_url, definitions=team, providers=providers, tools=[extra], hooks=[Spy()]
    ) as system:
        root = await system.create(definition="lead")
        await run(root, "go", changes=changes)
        # the root's message carries all changes; children get them propagated
        first = (await root.history())[0]
        assert first.metadata is not None and len(first.metadata["stead.changes"]) == 4
        kids = [await system.get(a.id) for a in await system.agents() if a.name in ("w1", "w2")]
        for kid in kids:
            meta = (await kid.history())[0].metadata
            assert meta is not None
            assert meta["stead.changes"] == [
                {"action": "add", "kind": "tool", "name": "extra", "scope": "global"},
                {"action": "remove", "kind": "tool", "name": "t_work", "scope": "specific", "agents": ["w1"]},
                {"action": "add", "kind": "tool", "name": "extra", "scope": "global"},
            ]
            expected = ["extra"] if kid.name == "w1" else ["t_work", "extra"]
            assert kid._rt.config.tools == expected
        # kept in the run KV while the run works (so a restarted process re-applies them), erased after
        assert seen_kv["lead"] == [c.encode() for c in changes]
        assert isinstance(seen_kv["w1"], list) and len(seen_kv["w1"]) == 3
        async with system.store.transaction() as tx:
            assert await tx.get(root.id, RUN_CHANGES_KEY) is None


def test_propagation_rules() -> None:
    cs = [
        change("add", "tool", "a", "root"),
        change("add", "tool", "b", "global"),
        change("add", "tool", "c", "all-subagents"),
        change("remove", "tool", "d", "specific", ("x",)),
    ]
    assert [(c.name, c.scope) for c in propagate(cs)] == [("b", "global"), ("c", "global"), ("d", "specific")]
    assert effective(["d"], [], cs, 0, "root") == (["d", "a", "b"], [])
    assert effective(["d"], [], cs, 1, "x") == (["b", "c"], [])
    assert effective(["d"], [], propagate(cs), 2, "y") == (["d", "b", "c"], [])


async def test_invalid_changes_are_refused_before_any_write(team: Path, db_url: str) -> None:
    with pytest.raises(stead.InvalidInput, match="scope 'specific' needs agents"):
        RuntimeChange("add", "tool", "x", "specific")
    with pytest.raises(stead.InvalidInput, match="scope must be one of"):
        RuntimeChange("add", "tool", "x", "everyone")  # type: ignore[arg-type]
    providers = models(lead=lead, w1=worker, w2=worker)
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        root = await system.create(definition="lead")
        with pytest.raises(stead.InvalidInput, match="no tool of that name"):
            await root.send("go", changes=[change("add", "tool", "nope", "root")])
        with pytest.raises(stead.InvalidInput, match="no definition of that name"):
            await root.send("go", changes=[change("add", "sub_agent", "nope", "root")])
        assert not root.active and await root.history() == []


async def test_the_run_view_survives_a_restart(team: Path, db_url: str) -> None:
    hang = asyncio.Event()

    async def stuck(request: stead.ProviderRequest) -> list[stead.Block]:
        hang.set()
        await asyncio.Event().wait()  # the process dies during this request
        return []

    system = await stead.open(db_url, definitions=team, providers=models(lead=stuck), tools=[extra])
    root = await system.create(definition="lead")
    await root.send("go", changes=[change("add", "tool", "extra", "root")])
    await asyncio.wait_for(hang.wait(), 10)
    system.abandon()
    await system.store.close()

    provider = ScriptedProvider(lambda r: [stead.Text("resumed")])
    async with await stead.open(
        db_url, definitions=team, providers={"scripted/lead": provider}, tools=[extra]
    ) as system:
        root = await system.get(root.id)
        await root.wait_idle(timeout=20)
        (request,) = provider.requests
        assert sorted(t.name for t in request.tools) == ["extra", "t_lead", "w1", "w2"]
        assert sorted(root._rt.config.tools) == ["t_lead", "w1", "w2"]  # back to its own after the run
