"""The plugin seam (issue 8): a plugin written outside `src/` contributes a tool, a provider, a hook writing
its own table (migrated on open), an inbound validator and lifecycle, through `stead.Plugin` alone — and its
state survives a restart."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

import stead
from stead.extend import Migrations, Plugin
from tests.outside.audit_plugin import AuditPlugin

TIMEOUT = 5.0


async def audit_rows(system: stead.AgentSystem) -> list[tuple[str, str | None]]:
    async with system.store.transaction() as tx:
        rows = await tx.fetch("SELECT event, detail FROM audit_log ORDER BY seq")
    return [(str(r[0]), r[1]) for r in rows]


async def test_an_outside_plugin_contributes_tool_provider_hooks_table_and_validator(db_url: str) -> None:
    plugin = AuditPlugin()
    async with await stead.open(db_url, plugins=[plugin]) as system:
        assert plugin.events == ["start:0"]
        assert (
            system.plugin("audit") is plugin and "audit_count" in system.tools and "echo" in system.providers
        )
        agent = await system.create(provider="echo", tools=["audit_count"])
        await agent.send("hello")
        await agent.wait_idle(timeout=TIMEOUT)
        # the tool ran inside the run and saw the row the hook wrote when the message was consumed
        assert (await agent.history())[-1].text == "audit rows: 1"
        assert await audit_rows(system) == [("consumed", "hello"), ("settled", None)]
        with pytest.raises(stead.InvalidInput, match="audit plugin refuses"):
            await agent.send("this is forbidden")
        assert not agent.active  # refused before any write: no activation, nothing queued
        assert await audit_rows(system) == [("consumed", "hello"), ("settled", None)]
    assert plugin.events == ["start:0", "close"]


async def test_a_plugins_state_survives_a_restart(db_url: str) -> None:
    async with await stead.open(db_url, plugins=[AuditPlugin()]) as system:
        agent = await system.create(provider="echo", tools=["audit_count"])
        await agent.send("one")
        await agent.wait_idle(timeout=TIMEOUT)
    again = AuditPlugin()
    async with await stead.open(db_url, plugins=[again]) as system:  # the migration does not run twice
        assert again.events == ["start:1"]
        assert await audit_rows(system) == [("consumed", "one"), ("settled", None)]
        agent = await system.get(agent.id)
        await agent.send("two")
        await agent.wait_idle(timeout=TIMEOUT)
        assert (await agent.history())[-1].text == "audit rows: 3"


async def test_a_failing_hook_of_a_plugin_refuses_the_message(db_url: str) -> None:
    class Refuse(Plugin, stead.Hooks):
        name = "refuse"

        async def activated_tx(self, ctx: stead.HookContext) -> None:
            raise RuntimeError("no")

    async with await stead.open(db_url, plugins=[AuditPlugin(), Refuse()]) as system:
        agent = await system.create(provider="echo", tools=["audit_count"])
        with pytest.raises(RuntimeError):
            await agent.send("hello")
        assert not agent.active and await agent.history() == []


async def test_two_plugins_of_one_name_are_refused(db_url: str) -> None:
    with pytest.raises(stead.ConfigurationError, match="two plugins are named 'audit'"):
        await stead.open(db_url, plugins=[AuditPlugin(), AuditPlugin()])


async def test_a_plugin_without_migrations_for_the_stores_dialect_is_refused(tmp_path: Path) -> None:
    class SqliteOnly(Plugin):
        name = "sqlite-only"
        migrations: ClassVar[Migrations] = {"sqlite": {"only": ["CREATE TABLE only_here (x INTEGER)"]}}

    with pytest.raises(stead.ConfigurationError, match="no schema migrations for postgresql"):
        await stead.open("postgresql://127.0.0.1/none", plugins=[SqliteOnly()], records=False)


async def test_plugin_lookup_names_what_is_loaded(db_url: str) -> None:
    async with await stead.open(db_url, plugins=[AuditPlugin()]) as system:
        assert [p.name for p in system.plugins] == ["records", "user-hooks", "audit"]
        with pytest.raises(
            stead.ConfigurationError, match=r"no plugin named 'memory'.*records, user-hooks, audit"
        ):
            system.plugin("memory")
