"""Issue 23 item 2: HTTP sends join the group commit as one acceptance. Concurrent sends to different agents
run their idempotency callbacks one after another and are then written by one `accept_many` (a fixed number
of store round trips for the group); sends to the same agent start a new group each, so each callback sees
what the sends before it left for its agent. Every promise of a single send still holds (A1, A3, the
fingerprint check)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import stead._group_commit as group_commit
from tests.server.support import A, Env, bearer

H = bearer(A)


def count_acceptances(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each `accept_many` the group commit runs (one entry per message)."""
    sizes: list[int] = []
    accept_many = group_commit.accept_many

    async def counted(tx: Any, entries: Any) -> list[bool]:
        sizes.append(len(entries))
        return await accept_many(tx, entries)

    monkeypatch.setattr(group_commit, "accept_many", counted)
    return sizes


async def test_A6_http_sends_to_different_agents_are_accepted_together(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.model.gate = asyncio.Event()
    agents = [(await env.agent())["id"] for _ in range(20)]
    sizes = count_acceptances(monkeypatch)

    def post(agent_id: str, body: str = "hi") -> Any:
        return env.http.post(f"/v1/agents/{agent_id}/messages", json={"content": body, "id": "m1"}, headers=H)

    answers = await asyncio.gather(*(post(a) for a in agents))
    assert [r.status_code for r in answers] == [202] * 20
    assert sum(sizes) == 20 and max(sizes) > 1 and len(sizes) < 20 / 2, sizes  # together, not one by one
    again = await asyncio.gather(*(post(a) for a in agents), post(agents[7], "another body"))
    assert [r.status_code for r in again] == [200] * 20 + [422]  # A3 per agent; a reused id refused alone
    assert again[-1].json()["code"] == "id_reused"
    for agent_id in agents:
        queue = (await env.http.get(f"/v1/agents/{agent_id}/queue", headers=H)).json()["items"]
        history = await (await env.system.get(agent_id)).history()
        assert [q["id"] for q in queue] + [m.id for m in history] == ["m1"]  # A1: once, nowhere twice
    env.model.gate.set()


async def test_A6_http_sends_to_one_agent_start_a_new_acceptance_each(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.model.gate = asyncio.Event()
    agent_id = (await env.agent())["id"]
    sizes = count_acceptances(monkeypatch)
    url = f"/v1/agents/{agent_id}/messages"
    answers = await asyncio.gather(
        *(env.http.post(url, json={"content": f"m{i}", "id": f"m{i}"}, headers=H) for i in range(10))
    )
    assert [r.status_code for r in answers] == [202] * 10
    # each send's callback must see the events head the sends before it left: one message per acceptance
    assert sizes == [1] * 10
    heads = [r.json()["events_after"] for r in answers]
    assert heads == sorted(heads)
    env.model.gate.set()
