"""Tokens, scopes, sessions, rate limits and tenant isolation (H7, H8). The isolation matrix is generated
from the app's route table: every route that takes an id answers 404 to another tenant's token."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.server import Auth, Token, hash_token, load_tokens
from tests.server.support import A_READ, TEAM, TOKENS, A, B, Env, bearer

# A valid body per request schema, so a refusal is about the id, not the body (a route with a new body
# schema fails the test until an example is listed here).
BODIES: dict[str, dict[str, Any]] = {
    "MessageIn": {"content": "hello"},
    "BatchIn": {"messages": [{"content": "hello"}]},
    "DecisionIn": {"decision": "approve"},
}


def id_routes(app: Any) -> list[tuple[str, str, list[str], dict[str, Any] | None]]:
    """(method, path, path parameters, body) of every operation whose path takes an id — read from the
    app's route table as its OpenAPI document lists it."""
    out = []
    for path, operations in app.openapi()["paths"].items():
        params = re.findall(r"{(\w+)}", path)
        if not params:
            continue
        for method, op in operations.items():
            body = None
            if "requestBody" in op:
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                name = ref.rsplit("/", 1)[-1]
                assert name in BODIES, f"add an example body for {name} ({method} {path})"
                body = BODIES[name]
            out.append((method.upper(), path, params, body))
    return out


async def _team_of_tenant_a(env: Env) -> tuple[list[str], list[str]]:
    """A's orchestrator has run once: (every agent id of the tree, every run id of the tree)."""
    r = await env.http.post("/v1/agents", json={"definition": "orchestrator"}, headers=bearer(A))
    root = r.json()["id"]
    await env.http.post(f"/v1/agents/{root}/messages", json={"content": "Write a brief"}, headers=bearer(A))
    await env.idle(root)
    runs = (await env.http.get("/v1/runs", headers=bearer(A))).json()["items"]
    agents = (await env.http.get("/v1/agents", headers=bearer(A))).json()["items"]
    return [a["id"] for a in agents], [run["id"] for run in runs]


async def _approvals_of_tenant_a(env: Env, n: int) -> list[str]:
    """`n` pending approvals of tenant A (each a `transfer` call its own agent waits on)."""
    env.model.tool, env.model.calls = "transfer", 1
    for _ in range(n):
        agent = await env.agent(A, tools=["transfer"])
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "pay"}, headers=bearer(A))
        await env.idle(agent["id"])
    pending = (await env.http.get("/v1/approvals", headers=bearer(A))).json()["items"]
    return [a["id"] for a in pending]


async def test_H7_another_tenants_token_gets_404_on_every_route_that_takes_an_id(make_env: Any) -> None:
    env = await make_env(definitions=TEAM)
    agent_ids, run_ids = await _team_of_tenant_a(env)
    assert len(agent_ids) == 4 and len(run_ids) == 4  # orchestrator, researcher ×2, writer: all tenant A's
    approval_ids = await _approvals_of_tenant_a(env, 4)
    assert len(approval_ids) == 4
    ids = {"agent_id": agent_ids, "run_id": run_ids, "approval_id": approval_ids}
    checked = 0
    routes = id_routes(env.app)
    for method, path, params, body in routes:
        assert set(params) <= set(ids), f"{path}: add ids for {params}"
        for value in ids[params[0]]:
            url = path.replace("{" + params[0] + "}", value)
            r = await env.http.request(method, url, json=body, headers=bearer(B))
            assert r.status_code == 404, f"{method} {url}: {r.status_code} {r.text}"
            assert r.json()["code"] == "not_found"
            checked += 1
    # every id route was exercised: 7 agent routes and 5 run routes (today), each for all 4 ids
    assert len(routes) >= 12 and checked == 4 * len(routes)
    assert {p for _, p, _, _ in routes} >= {
        "/v1/approvals/{approval_id}",
        "/v1/approvals/{approval_id}/decision",
    }
    # and nothing was changed: tenant A still sees its agents, with their history
    for aid in agent_ids:
        assert (await env.http.get(f"/v1/agents/{aid}", headers=bearer(A))).status_code == 200
    for approval in approval_ids:
        assert (await env.system.approval(approval)).status == "pending"


async def test_H7_lists_and_streams_never_show_another_tenants_agents(make_env: Any) -> None:
    env = await make_env(definitions=TEAM)
    agent_ids, _ = await _team_of_tenant_a(env)
    b_agent = (
        await env.http.post("/v1/agents", json={"provider": "s", "model": "m"}, headers=bearer(B))
    ).json()
    listed = (await env.http.get("/v1/agents", headers=bearer(B))).json()["items"]
    assert [a["id"] for a in listed] == [b_agent["id"]]
    assert (await env.http.get("/v1/runs", headers=bearer(B))).json()["items"] == []
    for aid in agent_ids:
        r = await env.http.get("/v1/runs", params={"agent_id": aid}, headers=bearer(B))
        assert r.json()["items"] == []
    # a stream of B's own agent carries only B's agent's events
    base = await env.live()
    await env.http.post(f"/v1/agents/{b_agent['id']}/messages", json={"content": "hi"}, headers=bearer(B))
    async with env.client(base, B) as client:
        async for ev in client.events(b_agent["id"], after=0):
            assert ev.data["agent_id"] == b_agent["id"]
            if ev.event == "settled":
                break
    # A's scopes never reach B's agent, even admin-like ones
    assert (await env.http.get(f"/v1/agents/{b_agent['id']}", headers=bearer(A))).status_code == 404


async def test_H8_no_token_is_401_with_a_bearer_challenge(env: Env) -> None:
    r = await env.http.get("/v1/agents")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    bad = await env.http.get("/v1/agents", headers=bearer("wrong"))
    assert bad.status_code == 401 and 'error="invalid_token"' in bad.headers["www-authenticate"]
    basic = await env.http.get("/v1/agents", headers={"Authorization": "Basic eDp5"})
    assert basic.status_code == 401
    assert (await env.http.get("/v1/healthz")).status_code == 200  # health needs no token


async def test_H8_a_missing_scope_is_403(env: Env) -> None:
    r = await env.http.post("/v1/agents", json={"provider": "s", "model": "m"}, headers=bearer(A_READ))
    assert r.status_code == 403 and r.json()["code"] == "missing_scope"
    agent = await env.agent()
    assert (await env.http.get(f"/v1/agents/{agent['id']}", headers=bearer(A_READ))).status_code == 200
    send = await env.http.post(
        f"/v1/agents/{agent['id']}/messages", json={"content": "x"}, headers=bearer(A_READ)
    )
    assert send.status_code == 403


async def test_H8_a_browser_session_is_an_httponly_strict_cookie(env: Env) -> None:
    r = await env.http.post("/v1/sessions", json={"token": A})
    assert r.status_code == 201 and r.json()["tenant"] == "acme"
    cookie = r.headers["set-cookie"]
    assert "stead_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert A not in cookie  # the token itself never leaves in the cookie
    me = await env.http.get("/v1/session")  # the client keeps the cookie
    assert me.status_code == 200 and me.json()["tenant"] == "acme"
    write = await env.http.post("/v1/agents", json={"provider": "s", "model": "m"})
    assert write.status_code == 403 and write.json()["code"] == "csrf"
    ok = await env.http.post(
        "/v1/agents", json={"provider": "s", "model": "m"}, headers={"X-Stead-Request": "1"}
    )
    assert ok.status_code == 201
    assert (await env.http.delete("/v1/session")).status_code == 204
    env.http.cookies.clear()
    assert (await env.http.get("/v1/session")).status_code == 401
    assert (await env.http.post("/v1/sessions", json={"token": "wrong"})).status_code == 401


async def test_H8_rate_limits_answer_429_with_retry_after(make_env: Any) -> None:
    now = [1000.0]
    limited = Token.from_secret("limited", "acme", rate_limit="2/s")
    env = await make_env(auth=Auth([*TOKENS, limited], clock=lambda: now[0]))
    answers = [await env.http.get("/v1/agents", headers=bearer("limited")) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert answers[2].headers["retry-after"] == "1" and answers[2].json()["code"] == "rate_limited"
    assert (await env.http.get("/v1/agents", headers=bearer(A))).status_code == 200  # per token
    now[0] += 0.5
    assert (await env.http.get("/v1/agents", headers=bearer("limited"))).status_code == 200


def test_H8_the_token_file_holds_hashes_or_plain_secrets(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        "default_tenant: acme\n"
        "tokens:\n"
        f'  - token: "{hash_token("hashed-secret")}"\n'
        "    tenant: acme\n"
        "    scopes: [agents:read, runs:read]\n"
        "    rate_limit: 600/min\n"
        "  - token: plain-secret\n"
        "    tenant: globex\n"
        "    scopes: [admin]\n"
        "    expires_at: 2999-01-01T00:00:00Z\n"
    )
    auth = load_tokens(path)
    assert auth.default_tenant == "acme"
    a = auth.check_secret("hashed-secret")
    b = auth.check_secret("plain-secret")
    assert a is not None and a.tenant == "acme" and a.allows("runs:read") and not a.allows("agents:write")
    assert b is not None and b.tenant == "globex" and b.allows("approvals:decide")
    assert "plain-secret" not in repr(auth.tokens)  # kept hashed only
    assert auth.tokens[0].rate_limit is not None and auth.tokens[0].rate_limit.rate == 10
    path.write_text("tokens:\n  - token: x\n    tenant: acme\n    scopes: [agents:sing]\n")
    with pytest.raises(stead.ConfigurationError, match=r"tokens.yaml:\d+"):
        load_tokens(path)


def test_H8_an_expired_token_is_refused() -> None:
    auth = Auth([Token.from_secret("old", "acme", expires_at=1.0)])
    assert auth.check_secret("old") is None


async def test_without_tokens_one_implicit_tenant_sees_every_agent(make_env: Any) -> None:
    env = await make_env(tokens=None)
    outside = await env.system.create(provider="s", model="m")  # made with the Python API
    listed = (await env.http.get("/v1/agents")).json()["items"]
    assert [a["id"] for a in listed] == [outside.id]
    assert (await env.http.get(f"/v1/agents/{outside.id}")).json()["tenant"] == "default"
    session = await env.http.post("/v1/sessions", json={"token": "anything"})
    assert session.status_code == 200 and session.json()["auth_required"] is False


async def test_with_tokens_agents_made_outside_the_service_belong_to_nobody(env: Env) -> None:
    outside = await env.system.create(provider="s", model="m")
    for secret in (A, B):
        assert (await env.http.get(f"/v1/agents/{outside.id}", headers=bearer(secret))).status_code == 404
        assert (await env.http.get("/v1/agents", headers=bearer(secret))).json()["items"] == []
