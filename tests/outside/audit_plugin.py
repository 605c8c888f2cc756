"""A third-party plugin, written against `stead` and `stead.extend` only (no private module, no private
attribute): it contributes a tool, a provider, hooks that write its own table (created by its migration),
an inbound-message validator and a start/close lifecycle."""

from __future__ import annotations

from typing import Any, ClassVar

import stead
from stead.extend import HookContext, IncomingMessage, Migrations, Plugin
from stead.testing import ScriptedProvider

AUDIT_SQLITE = [
    "CREATE TABLE audit_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL, "
    "run_id TEXT, event TEXT NOT NULL, detail TEXT)"
]
AUDIT_POSTGRES = [
    "CREATE TABLE audit_log (seq BIGSERIAL PRIMARY KEY, agent_id TEXT NOT NULL, "
    "run_id TEXT, event TEXT NOT NULL, detail TEXT)"
]


@stead.tool
async def audit_count(ctx: stead.ToolContext) -> int:
    "How many audit rows this agent has."
    async with ctx.store.transaction() as tx:
        rows = await tx.fetch("SELECT COUNT(*) FROM audit_log WHERE agent_id = ?", (ctx.agent_id,))
    return int(rows[0][0])


def _echo(request: stead.ProviderRequest) -> list[stead.Block]:
    """Asks the audit tool once, then answers with what it said."""
    last = request.messages[-1]
    if last.role == "tool":
        result = last.content[0]
        assert isinstance(result, stead.ToolResult)
        return [stead.Text(f"audit rows: {result.output}")]
    return [stead.ToolCall(name="audit_count", arguments={})]


class AuditPlugin(Plugin, stead.Hooks):
    """Writes one audit row per consumed message and per settled run, in the kernel's transactions."""

    name: ClassVar[str] = "audit"
    migrations: ClassVar[Migrations] = {
        "sqlite": {"audit": AUDIT_SQLITE},
        "postgresql": {"audit": AUDIT_POSTGRES},
    }

    def __init__(self) -> None:
        self.events: list[str] = []
        self.provider = ScriptedProvider(_echo)

    def tools(self) -> list[stead.Tool]:
        return [audit_count]

    def providers(self) -> dict[str, stead.Provider]:
        return {"echo": self.provider}

    def validate_message(self, message: IncomingMessage) -> None:
        text = " ".join(b.text for b in message.content if isinstance(b, stead.Text))
        if "forbidden" in text:
            raise stead.InvalidInput(f"the audit plugin refuses this message to agent {message.agent_id}")

    async def start(self, system: stead.AgentSystem) -> None:
        self.events.append(f"start:{len(await system.agents())}")

    async def close(self, system: stead.AgentSystem) -> None:
        self.events.append("close")

    async def _row(self, ctx: HookContext, event: str, detail: Any = None) -> None:
        assert ctx.tx is not None
        await ctx.tx.execute(
            "INSERT INTO audit_log(agent_id, run_id, event, detail) VALUES (?, ?, ?, ?)",
            (ctx.agent_id, ctx.run_id, event, None if detail is None else str(detail)),
        )

    async def message_consumed_tx(self, ctx: HookContext, message: stead.Message) -> None:
        await self._row(ctx, "consumed", message.text)

    async def settled_tx(self, ctx: HookContext, error: str | None) -> None:
        await self._row(ctx, "settled", error)
