"""SEC2 over HTTP: an agent deleted by tenant A and re-created with the same id by tenant B shows B none of
A's runs, steps, events, approvals, memory notes, realtime rows or artifacts (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stead.flows import put_artifact
from stead.realtime import RealtimePlugin
from tests.fakes.deletion import agent_rows, seed_realtime
from tests.server.support import A, B, Env, bearer

AGENT = "shared-id"


@pytest.fixture
async def full(make_env: Callable[..., Any]) -> Env:
    """The service with every plugin that keeps rows about an agent."""
    env: Env = await make_env(open_kwargs={"memory": True, "plugins": [RealtimePlugin()]})
    return env


async def test_SEC2_a_deleted_agent_recreated_by_another_tenant_over_http_sees_nothing_of_it(
    full: Env,
) -> None:
    base = await full.live()  # a real uvicorn on 127.0.0.1
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        body = {"id": AGENT, "provider": "s", "model": "m", "tools": ["add", "transfer"]}
        r = await http.post("/v1/agents", json=body, headers=bearer(A))
        assert r.status_code == 201, r.text
        # A's first run calls a tool (a run with steps), its second waits for an approval
        full.model.calls = 1
        await http.post(f"/v1/agents/{AGENT}/messages", json={"content": "A's secret one"}, headers=bearer(A))
        await full.idle(AGENT)
        full.model.tool = "transfer"
        await http.post(f"/v1/agents/{AGENT}/messages", json={"content": "A's secret two"}, headers=bearer(A))
        await full.idle(AGENT)  # idle but for the decision it waits on
        await full.system.memory.add("A's private note", agent=AGENT, tenant="acme")
        await put_artifact(full.system.store, AGENT, "A's artifact\n" * 2000, name="log")
        await seed_realtime(full.system.store, AGENT)
        before = await agent_rows(full.system.store, AGENT)
        assert all(before.values()), before  # every kind of row exists for A (the test can fail)
        a_runs = (await http.get("/v1/runs", params={"agent_id": AGENT}, headers=bearer(A))).json()["items"]
        assert len(a_runs) == 2
        a_approvals = (await http.get("/v1/approvals", headers=bearer(A))).json()["items"]
        assert [x["agent_id"] for x in a_approvals] == [AGENT]

        gone = await http.delete(f"/v1/agents/{AGENT}", params={"abort": "true"}, headers=bearer(A))
        assert gone.status_code == 204
        assert await agent_rows(full.system.store, AGENT) == dict.fromkeys(before, 0)

        # tenant B re-creates the id: it sees none of A's
        r = await http.post(
            "/v1/agents", json={"id": AGENT, "provider": "s", "model": "m"}, headers=bearer(B)
        )
        assert r.status_code == 201, r.text
        assert r.json()["tenant"] == "globex"
        runs = (await http.get("/v1/runs", params={"agent_id": AGENT}, headers=bearer(B))).json()
        assert runs["items"] == []
        for run in a_runs:
            assert (await http.get(f"/v1/runs/{run['id']}", headers=bearer(B))).status_code == 404
            assert (await http.get(f"/v1/runs/{run['id']}/steps", headers=bearer(B))).status_code == 404
        approvals = (await http.get("/v1/approvals", params={"status": "all"}, headers=bearer(B))).json()
        assert approvals["items"] == []
        history = (await http.get(f"/v1/agents/{AGENT}/messages", headers=bearer(B))).json()
        assert history["items"] == []
        assert (await http.get(f"/v1/agents/{AGENT}", headers=bearer(A))).status_code == 404
    after = await agent_rows(full.system.store, AGENT)
    # B's agent has exactly its own (server) rows; every row of A's kinds is gone
    assert {k: v for k, v in after.items() if k != "stead_events"} == dict.fromkeys(
        (k for k in before if k != "stead_events"), 0
    )
    async with full.system.store.transaction() as tx:
        events = await tx.fetch("SELECT data FROM stead_events WHERE agent_id = ?", (AGENT,))
    assert not any("secret" in str(d) or any(run["id"] in str(d) for run in a_runs) for (d,) in events)
