"""End-to-end smoke test of the public API contract (issue #2)."""

from __future__ import annotations

import stead
from stead.providers.scripted import ScriptedProvider
from tests.conftest import tool_loop

executed: list[tuple[int, int]] = []


@stead.tool
async def add(a: int, b: int) -> int:
    "Add two integers."
    executed.append((a, b))
    return a + b


async def test_tool_loop_conversation_end_to_end(db_url: str) -> None:
    executed.clear()
    async with await stead.open(
        db_url, providers={"scripted": ScriptedProvider(tool_loop())}, tools=[add]
    ) as system:
        agent = await system.create(provider="scripted", model="any", instructions="be brief", tools=["add"])
        commits_before = system.store.commits  # type: ignore[attr-defined]
        acc = await agent.send("hello")
        assert acc.created and acc.delivery == "send"
        await agent.wait_idle(timeout=10)
        assert not agent.active
        history = await agent.history()
        assert [m.role for m in history] == ["user"] + ["assistant", "tool"] * 5 + ["assistant"]
        assert history[-1].text == "done after 5 calls"
        assert executed == [(i, 1) for i in range(5)]
        assert system.store.commits - commits_before == 12  # type: ignore[attr-defined]
