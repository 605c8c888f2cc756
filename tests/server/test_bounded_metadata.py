"""SEC6k1 over HTTP, against a real server on loopback: a message whose metadata nests 900 levels is 422
and writes nothing, and the agent's messages stay readable (before: accepted, then `GET …/messages` was a
permanent 500)."""

from __future__ import annotations

import httpx

from tests.core.test_bounded_input import nested
from tests.server.support import A, Env, bearer


async def test_SEC6k1_deep_metadata_over_http_is_422_and_nothing_is_written(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}"
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        r = await http.post(
            f"{url}/messages", json={"content": "hi", "metadata": nested(900)}, headers=bearer(A)
        )
        assert r.status_code == 422, r.text
        assert "nests more than 32 levels deep" in r.text
        async with env.system.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT COUNT(*) FROM stead_server_messages WHERE agent_id = ?", (agent["id"],)
            )
        assert rows == [(0,)]
        assert (await http.get(f"{url}/queue", headers=bearer(A))).json()["items"] == []
        history = await http.get(f"{url}/messages", headers=bearer(A))
        assert history.status_code == 200 and history.json()["items"] == []
        ok = await http.post(
            f"{url}/messages", json={"content": "hi", "metadata": nested(32)}, headers=bearer(A)
        )
        assert ok.status_code == 202, ok.text
        await env.idle(agent["id"])
        history = await http.get(f"{url}/messages", headers=bearer(A))
        assert history.status_code == 200 and history.json()["items"][0]["metadata"] == nested(32)
