"""Kernel seams the HTTP service needs (issue 14): `Agent.queued()` (the unconsumed queue, read from the
store) and `Hooks.agent_deleted_tx` (a layer's rows about an agent are deleted in the transaction that
deletes the agent)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

import stead
from stead.extend import HookContext, Migrations, Plugin
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 5.0


async def test_queued_lists_unconsumed_messages_in_consumption_order(db_url: str) -> None:
    gate, respond = _gated_model()
    async with await stead.open(db_url, providers={"s": ScriptedProvider(respond)}) as system:
        agent = await system.create(provider="s", model="m")
        await agent.send("one", id="one", metadata={"k": 1})
        await agent.steer("two", id="two")
        await agent.send("three", id="three", model="m")
        queued = await agent.queued()
        # consumption is staged until the response's first write: all three are still queued
        assert [(q.id, q.delivery, q.content) for q in queued] == [
            ("two", "steer", [stead.Text("two")]),
            ("one", "send", [stead.Text("one")]),
            ("three", "send", [stead.Text("three")]),
        ]
        assert queued[1].metadata == {"k": 1}
        assert queued[2].settings == {"model": "m"}
        gate.set()
        await agent.wait_idle(TIMEOUT)
        assert await agent.queued() == []


async def test_queued_keeps_who_sent_each_message(db_url: str) -> None:
    """`Agent.queued()` returns each message's `user` and `tenant` as they were accepted (it dropped them)."""
    gate, respond = _gated_model()
    async with await stead.open(db_url, providers={"s": ScriptedProvider(respond)}) as system:
        agent = await system.create(provider="s", model="m")
        await agent.send("one", id="one", user="alice", tenant="acme")
        await agent.send("two", id="two")
        queued = await agent.queued()
        assert [(q.id, q.user, q.tenant) for q in queued] == [("one", "alice", "acme"), ("two", None, None)]
        gate.set()
        await agent.wait_idle(TIMEOUT)


def _gated_model() -> tuple[asyncio.Event, Any]:
    """A model that answers "ok" once the returned event is set (until then every message stays queued)."""
    gate = asyncio.Event()

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        await gate.wait()
        return [stead.Text("ok")]

    return gate, respond


class _Rows(Plugin, stead.Hooks):
    name: ClassVar[str] = "rows"
    migrations: ClassVar[Migrations] = {
        "sqlite": {"rows": ["CREATE TABLE agent_rows (agent_id TEXT PRIMARY KEY)"]},
        "postgresql": {"rows": ["CREATE TABLE agent_rows (agent_id TEXT PRIMARY KEY)"]},
    }

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, bool]] = []

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        assert ctx.tx is not None
        await ctx.tx.execute("DELETE FROM agent_rows WHERE agent_id = ?", (ctx.agent_id,))
        self.seen.append((ctx.agent_id, ctx.tx is ctx.store.current()))
        if self.fail:
            raise RuntimeError("refused")


async def _count(system: stead.AgentSystem, agent_id: str) -> int:
    async with system.store.transaction() as tx:
        rows = await tx.fetch("SELECT COUNT(*) FROM agent_rows WHERE agent_id = ?", (agent_id,))
    return int(rows[0][0])


async def test_agent_deleted_tx_deletes_a_layers_rows_with_the_agent(db_url: str) -> None:
    plugin = _Rows()
    providers = {"s": ScriptedProvider(lambda r: [stead.Text("ok")])}
    async with await stead.open(db_url, providers=providers, plugins=[plugin]) as system:
        agent = await system.create(provider="s", model="m")
        async with system.store.transaction() as tx:
            await tx.execute("INSERT INTO agent_rows(agent_id) VALUES (?)", (agent.id,))
        await system.delete(agent.id)
        assert plugin.seen == [(agent.id, True)]
        assert await _count(system, agent.id) == 0
        with pytest.raises(stead.AgentNotFound):
            await system.delete(agent.id)
        assert len(plugin.seen) == 1  # not called for an agent that does not exist


async def test_a_failing_agent_deleted_tx_keeps_the_agent(db_url: str) -> None:
    plugin = _Rows(fail=True)
    providers = {"s": ScriptedProvider(lambda r: [stead.Text("ok")])}
    async with await stead.open(db_url, providers=providers, plugins=[plugin]) as system:
        agent = await system.create(provider="s", model="m")
        async with system.store.transaction() as tx:
            await tx.execute("INSERT INTO agent_rows(agent_id) VALUES (?)", (agent.id,))
        with pytest.raises(RuntimeError):
            await system.delete(agent.id)
        assert await _count(system, agent.id) == 1
        assert [a.id for a in await system.agents()] == [agent.id]
