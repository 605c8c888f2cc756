"""Text no store can hold, over HTTP (issue 20, item 4): a message carrying a lone surrogate is 422
`invalid_input` (A7), not a 500; model output carrying one is repaired (S5) and so is stored, streamed as
durable events and listed like any other."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.server.support import A, Env, bearer

H = bearer(A)
LONE = "\ud800"


async def post(env: Env, url: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` as JSON with ASCII escapes (`\\ud800`: what a client in another language sends; httpx's
    own encoder cannot encode a lone surrogate at all)."""
    return await env.http.post(
        url, content=json.dumps(body).encode(), headers={**H, "Content-Type": "application/json"}
    )


async def test_A7_a_message_with_a_lone_surrogate_is_422_over_http(env: Env) -> None:
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    bodies: list[dict[str, Any]] = [
        {"content": f"hi {LONE}"},
        {"content": [{"type": "text", "text": f"hi {LONE}"}]},
        {"content": "hi", "metadata": {"k": f"v{LONE}"}},
        {"content": "hi", "metadata": {f"k{LONE}": "v"}},
        {"content": "hi", "id": "m1", "metadata": {"deep": [{"x": LONE}]}},
    ]
    for body in bodies:
        r = await post(env, url, body)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert r.json()["code"] == "invalid_input" and "lone surrogate U+D800" in r.json()["detail"]
    batch = {"messages": [{"content": "fine", "id": "b1"}, {"content": f"bad {LONE}", "id": "b2"}]}
    r = await post(env, f"{url}:batch", batch)
    assert r.status_code == 422 and r.json()["code"] == "invalid_input"
    # nothing was accepted; the same ids are free, and valid text still goes through
    assert (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"] == []
    assert (await env.http.post(url, json={"content": "hi é", "id": "m1"}, headers=H)).status_code == 202
    await env.idle(agent["id"])
    assert env.model.count == 1


async def test_S5_model_output_with_a_lone_surrogate_is_repaired_over_http(env: Env) -> None:
    env.model.text = f"an answer {LONE} with a lone surrogate"
    agent = await env.agent()
    r = await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "hi"}, headers=H)
    assert r.status_code == 202
    await env.idle(agent["id"])
    assert env.model.count == 1  # one model request: the commit did not fail
    history = (await env.http.get(f"/v1/agents/{agent['id']}/messages", headers=H)).json()["items"]
    assert history[-1]["text"] == "an answer \ufffd with a lone surrogate"
    # the server's durable events (written in the same transactions) hold the repaired text
    async with env.system.store.transaction() as tx:
        rows = await tx.fetch("SELECT data FROM stead_events WHERE agent_id = ?", (agent["id"],))
    assert any("an answer \ufffd with" in str(r[0]) for r in rows)
