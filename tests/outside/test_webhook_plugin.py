"""Issue 22: a plugin that posts each settled run's final text somewhere (the Slack-style use) is written with
`stead` and `stead.extend` only, and loses no post: one whose webhook is down is posted after a restart."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import httpx

import stead
from stead.testing import ScriptedProvider
from tests.outside.webhook_plugin import WebhookNotifier

URL = "https://hooks.example.test/T000/B000"


class Receiver:
    """The webhook: records each post; answers `status` (settable); `wait(n)` returns once n arrived."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[tuple[str, dict[str, object]]] = []
        self.attempts = 0
        self._arrived = asyncio.Condition()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        async with self._arrived:
            self.attempts += 1
            if self.status < 300:
                self.posts.append((request.headers["Idempotency-Key"], json.loads(request.content)))
            self._arrived.notify_all()
        return httpx.Response(self.status)

    async def wait(self, *, posts: int = 0, attempts: int = 0) -> None:
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.posts) >= posts and self.attempts >= attempts), 10
            )

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


def _echo(request: stead.ProviderRequest) -> list[stead.Block]:
    return [stead.Text(f"echo: {request.messages[-1].text}")]


async def test_an_outside_plugin_posts_each_settled_runs_final_text(db_url: str) -> None:
    receiver = Receiver()
    notifier = WebhookNotifier(URL, transport=receiver.transport())
    async with await stead.open(
        db_url, plugins=[notifier], providers={"echo": ScriptedProvider(_echo)}
    ) as system:
        agent = await system.create(provider="echo", name="helper")
        first = await agent.run("hello")
        second = await agent.run("again")
        await receiver.wait(posts=2)
    assert [body for _, body in receiver.posts] == [
        {"agent_id": agent.id, "run_id": first.run_id, "outcome": "completed", "text": "echo: hello"},
        {"agent_id": agent.id, "run_id": second.run_id, "outcome": "completed", "text": "echo: again"},
    ]
    assert len({key for key, _ in receiver.posts}) == 2


async def test_a_post_the_webhook_refused_is_delivered_after_a_restart(db_url: str) -> None:
    down = Receiver(status=503)
    async with await stead.open(
        db_url,
        plugins=[WebhookNotifier(URL, transport=down.transport())],
        providers={"echo": ScriptedProvider(_echo)},
    ) as system:
        agent = await system.create(provider="echo")
        result = await agent.run("are you there")
        await down.wait(attempts=2)  # tried, refused, tried again: the row stays in the outbox
    assert down.posts == []

    up = Receiver()
    async with await stead.open(
        db_url,
        plugins=[WebhookNotifier(URL, transport=up.transport())],
        providers={"echo": ScriptedProvider(_echo)},
    ):
        await up.wait(posts=1)
    assert [body["text"] for _, body in up.posts] == ["echo: are you there"]
    assert up.posts[0][1]["run_id"] == result.run_id


def test_the_webhook_plugin_imports_only_the_public_tiers() -> None:
    tree = ast.parse(Path(__file__).with_name("webhook_plugin.py").read_text(encoding="utf-8"))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    steads = {m for m in imported if m and m.startswith("stead")}
    assert steads == {"stead", "stead.extend"}
