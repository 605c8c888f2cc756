"""SEC2 through the Python API: `system.delete` removes, in its transaction, every row the layers keep about
the agent (runs, steps, approvals, memory notes and their audit, realtime rows, artifacts), and drops the
parsed artifacts this process cached, so an agent re-created with the same id reads none of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import stead
from stead.flows._artifacts import list_artifacts
from stead.realtime import RealtimePlugin
from tests.fakes import flows as F
from tests.fakes.deletion import agent_rows, seed_realtime

AGENT = "shared-id"


@stead.tool(durable=True)
async def private_log() -> str:
    """A long log only tenant A may read."""
    return "\n".join(f"line {i}: A's private entry" for i in range(3000))


@stead.tool(effects="write", approval="always")
async def pay(amount: int) -> str:
    """Pay (a person approves every call)."""
    return f"paid {amount}"


def _results(request: stead.ProviderRequest) -> list[stead.ToolResult]:
    return [
        b for m in request.messages if m.role == "tool" for b in m.content if isinstance(b, stead.ToolResult)
    ]


async def test_SEC2_a_deleted_agent_recreated_with_its_id_in_python_reads_none_of_its_rows(
    db_url: str, team: Path
) -> None:
    seen: dict[str, Any] = {}

    def a_model(request: stead.ProviderRequest) -> list[stead.Block]:
        done = _results(request)
        if not done:
            return [stead.ToolCall("private_log", {})]
        if len(done) == 1:
            seen["artifact"] = done[0].output.split("artifact ")[1].split(":")[0]
            return [stead.ToolCall("artifact_lines", {"id": seen["artifact"], "count": 2})]
        if len(done) == 2:
            return [stead.ToolCall("pay", {"amount": 5})]
        return [stead.Text("done")]

    def b_model(request: stead.ProviderRequest) -> list[stead.Block]:
        done = _results(request)
        if not done:  # B guesses A's artifact id (ids derive from call ids: guessable)
            return [stead.ToolCall("artifact_lines", {"id": seen["artifact"], "count": 2})]
        return [stead.Text(json.dumps([r.output for r in done]))]

    line = "model: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
    tools = "tools: [tests.flows.test_agent_deletion:private_log, tests.flows.test_agent_deletion:pay]\n"
    F.write(team, "a.yaml", "name: a\n" + line + tools)
    F.write(team, "b.yaml", "name: b\n" + line)
    providers = {
        "scripted/a": stead.testing.ScriptedProvider(a_model),
        "scripted/b": stead.testing.ScriptedProvider(b_model),
    }
    async with await stead.open(
        db_url,
        definitions=team,
        providers=providers,
        memory=True,
        approvals=True,
        plugins=[RealtimePlugin()],
    ) as system:
        a = await system.create(definition="a", agent_id=AGENT)
        await a.send("read the log", tenant="acme")
        await a.wait_idle(30)  # waits on the `pay` approval
        assert "A's private entry" in str(await a.history())  # the artifact was read (and cached)
        await system.memory.add("A's private note", agent=AGENT, tenant="acme")
        await seed_realtime(system.store, AGENT)
        before = await agent_rows(system.store, AGENT, server=False)
        assert all(before.values()), before

        await system.delete(AGENT)
        assert await agent_rows(system.store, AGENT, server=False) == dict.fromkeys(before, 0)

        b = await system.create(definition="b", agent_id=AGENT)
        result = await b.run("what can you read?", tenant="globex")
        (output,) = json.loads(result.text)
        assert "A's private entry" not in output and "no artifact" in output
        assert [r.agent_id for r in await system.runs(AGENT)] == [AGENT]  # B's one run only
        assert await system.memory.notes(agent=AGENT) == []
        async with system.store.transaction() as tx:
            assert await list_artifacts(tx, AGENT) == []
            pending = await tx.fetch("SELECT COUNT(*) FROM approvals WHERE agent_id = ?", (AGENT,))
        assert pending == [(0,)]
        assert "A's" not in str(await b.history())
