"""A third-party plugin that posts each settled run's final text to a webhook (the Slack-style use), written
against `stead` and `stead.extend` only — plus httpx, its own dependency.

Nothing is lost: the post is an outbox row written in the settling transaction (`settled_tx`), so it commits
exactly when the run settles. A sender task posts the rows in order and deletes each once the webhook
answered 2xx; a failed post stays and is tried again, also after a crash or a restart (at-least-once; the
row's id goes out as `Idempotency-Key`, so the receiver can drop a repeat). The HTTP transport is injected,
as httpx allows, so tests need no network.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar

import httpx

import stead
from stead.extend import HookContext, Migrations, Plugin, SettledInfo, Store, new_id

OUTBOX_SQLITE = [
    "CREATE TABLE webhook_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
    "agent_id TEXT NOT NULL, run_id TEXT, outcome TEXT NOT NULL, text TEXT NOT NULL)"
]
OUTBOX_POSTGRES = [
    "CREATE TABLE webhook_outbox (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
    "agent_id TEXT NOT NULL, run_id TEXT, outcome TEXT NOT NULL, text TEXT NOT NULL)"
]


class WebhookNotifier(Plugin, stead.Hooks):
    """Posts `{"agent_id", "run_id", "outcome", "text"}` for every settled run to `url`, in settling order."""

    name: ClassVar[str] = "webhook"
    migrations: ClassVar[Migrations] = {
        "sqlite": {"webhook": OUTBOX_SQLITE},
        "postgresql": {"webhook": OUTBOX_POSTGRES},
    }

    def __init__(
        self, url: str, *, transport: httpx.AsyncBaseTransport | None = None, retry_after: float = 0.05
    ) -> None:
        self.url = url
        self._transport = transport
        self._retry_after = retry_after
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._store: Store | None = None

    # ---------------------------------------------------------------- the durable part: one row per run
    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        if ctx.tx is None:
            return
        await ctx.tx.execute(
            "INSERT INTO webhook_outbox(id, agent_id, run_id, outcome, text) VALUES (?, ?, ?, ?, ?)",
            (new_id(), ctx.agent_id, ctx.run_id, info.outcome.value, info.text),
        )
        ctx.tx.after_commit(self._wake.set)

    # ---------------------------------------------------------------- delivery
    async def start(self, system: stead.AgentSystem) -> None:
        self._store = system.store
        self._client = httpx.AsyncClient(transport=self._transport, timeout=10.0)
        self._wake.set()  # rows left by an earlier incarnation go out first
        self._task = asyncio.create_task(self._deliver(), name="webhook-outbox")

    async def close(self, system: stead.AgentSystem) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()

    async def _deliver(self) -> None:
        assert self._store is not None and self._client is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            async with self._store.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT id, agent_id, run_id, outcome, text FROM webhook_outbox ORDER BY seq LIMIT 50"
                )
            for row_id, agent_id, run_id, outcome, text in rows:
                if not await self._post(str(row_id), agent_id, run_id, outcome, text):
                    await asyncio.sleep(self._retry_after)  # back off, then try the same row again
                    self._wake.set()
                    break
                async with self._store.transaction() as tx:
                    await tx.execute("DELETE FROM webhook_outbox WHERE id = ?", (row_id,))
            else:
                if len(rows) == 50:
                    self._wake.set()

    async def _post(self, row_id: str, agent_id: str, run_id: str | None, outcome: str, text: str) -> bool:
        assert self._client is not None
        body: dict[str, Any] = {"agent_id": agent_id, "run_id": run_id, "outcome": outcome, "text": text}
        try:
            response = await self._client.post(self.url, json=body, headers={"Idempotency-Key": row_id})
        except httpx.HTTPError:
            return False
        return response.is_success
