"""The service's security promises (docs/security.md), each as the attack against a real `stead serve`
(a process) or the app behind uvicorn on loopback: the refusal, and that nothing was written or sent.

SEC1 a caller's model string never chooses where keys go nor which file is read; SEC3 a caller cannot widen
an agent; SEC5 without tokens only loopback names and same-origin writes are served; SEC6 streams and slow
clients are bounded; SEC7 hardening (failed-token throttle, bounded sessions, /docs off, CSP, token file,
no server paths)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

import stead
from stead.server import Auth, TenantPolicy, Token
from stead.server._redact import public_text
from stead.server._run import start
from tests.fakes import Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.openai_server import OpenAIFakeServer
from tests.server.support import TEAM, A, B, Capture, Env, bearer, stead_serve

OPERATOR_KEYS = {"OPENAI_API_KEY": "sk-operator-openai-secret", "ANTHROPIC_API_KEY": "sk-ant-operator-secret"}


async def _nothing_written(http: httpx.AsyncClient, headers: dict[str, str] | None = None) -> None:
    """No agent exists (so no message, queue entry or run either)."""
    agents = (await http.get("/v1/agents", headers=headers)).json()["items"]
    assert agents == []
    runs = (await http.get("/v1/runs", headers=headers)).json()["items"]
    assert runs == []


async def _settled(http: httpx.AsyncClient, agent_id: str, after: int) -> dict[str, Any]:
    """The `settled` event's payload of the run a message started (streamed from `after`)."""
    async with http.stream("GET", f"/v1/agents/{agent_id}/events?after={after}") as r:
        event = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "settled":
                settled: dict[str, Any] = json.loads(line[6:])
                return settled
    raise AssertionError("the stream ended before settled")


# ---------------------------------------------------------------------------------------------- SEC1
async def test_SEC1_a_callers_base_url_or_scripted_file_is_refused_and_nothing_is_sent(
    db_url: str, tmp_path: Path
) -> None:
    capture = await Capture().start()
    secret = tmp_path / "secret.yaml"
    secret.write_text("TOP-SECRET-LINE: 1\n")
    attacks: list[Any] = [
        f"openai:gpt-4.1-mini@{capture.url}/v1",
        f"anthropic:claude-sonnet-4-5@{capture.url}",
        f"openai-compatible:llama@{capture.url}/v1",
        f"gpt-4.1-mini@{capture.url}/v1",
        ["openai:gpt-4.1-mini", f"openai:gpt-4.1-mini@{capture.url}/v1"],
        f"scripted:{secret}",
        "scripted:/no/such/file.yaml",
        "scripted:../../etc/passwd",
    ]
    try:
        async with (
            stead_serve("--db", db_url, env=OPERATOR_KEYS) as served,
            httpx.AsyncClient(base_url=served.base, timeout=30) as http,
        ):
            answers = []
            for model in attacks:
                r = await http.post("/v1/agents", json={"model": model, "id": "victim"})
                assert r.status_code == 422, (model, r.text)
                assert r.json()["code"] == "model_not_allowed" and r.json()["detail"].startswith("model")
                answers.append(r.json()["detail"])
                assert "TOP-SECRET" not in r.text and str(tmp_path) not in r.text
            # an existing file and a missing one get the same answer: no existence oracle
            assert answers[-3] == answers[-2]
            await _nothing_written(http)
            # a message's settings.model: an agent of an operator-approved model, then the attack
            agent = (await http.post("/v1/agents", json={"model": "openai:gpt-4.1-mini"})).json()
            for settings in (
                {"model": f"openai:gpt-4.1-mini@{capture.url}/v1"},
                {"model": f"scripted:{secret}"},
            ):
                r = await http.post(
                    f"/v1/agents/{agent['id']}/messages", json={"content": "hi", "settings": settings}
                )
                assert r.status_code == 422 and r.json()["code"] == "model_not_allowed", r.text
                assert r.json()["detail"].startswith("settings.model")
            r = await http.post(
                f"/v1/agents/{agent['id']}/messages:batch",
                json={
                    "messages": [
                        {"content": "a"},
                        {"content": "b", "settings": {"model": f"x@{capture.url}"}},
                    ]
                },
            )
            assert r.status_code == 422 and r.json()["detail"].startswith("messages.1.settings.model")
            assert (await http.get(f"/v1/agents/{agent['id']}/messages")).json()["items"] == []
            assert (await http.get(f"/v1/agents/{agent['id']}/queue")).json()["items"] == []
            assert (await http.get("/v1/runs")).json()["items"] == []
        assert capture.connections == 0 and capture.received == b""
    finally:
        await capture.close()


async def test_SEC1a_an_allowed_base_url_never_receives_the_operators_key(db_url: str) -> None:
    openai_fake = await OpenAIFakeServer().start()
    anthropic_fake = await AnthropicFakeServer().start()
    openai_fake.push(Reply([stead.Text("hello from elsewhere")]))
    anthropic_fake.push(Reply([stead.Text("hello from elsewhere")]))
    allow = [
        "--allow-model",
        f"openai:*@{openai_fake.base_url}",
        "--allow-model",
        f"anthropic:claude-*@{anthropic_fake.url}",
    ]
    try:
        async with (
            stead_serve("--db", db_url, *allow, env=OPERATOR_KEYS) as served,
            httpx.AsyncClient(base_url=served.base, timeout=30) as http,
        ):
            # the pattern's URL is exact: another host smuggled in the model part is refused
            smuggled = f"openai:x@http://127.0.0.1:9/?@{openai_fake.base_url}"
            assert (await http.post("/v1/agents", json={"model": smuggled})).status_code == 422
            for model in (
                f"openai:gpt-4.1-mini@{openai_fake.base_url}",
                f"anthropic:claude-x@{anthropic_fake.url}",
            ):
                r = await http.post("/v1/agents", json={"model": model})
                assert r.status_code == 201, r.text
                posted = (
                    await http.post(f"/v1/agents/{r.json()['id']}/messages", json={"content": "hi"})
                ).json()
                assert (await _settled(http, r.json()["id"], posted["events_after"]))["status"] == "completed"
        (to_openai,) = openai_fake.requests
        (to_anthropic,) = anthropic_fake.requests
        assert to_openai.headers.get("authorization") == "Bearer stead-no-key"
        credential = to_anthropic.headers.get("x-api-key") or to_anthropic.headers.get("authorization", "")
        assert credential.removeprefix("Bearer ") == "stead-no-key"
        for recorded in (to_openai, to_anthropic):
            seen = json.dumps(recorded.headers) + json.dumps(recorded.body)
            assert all(key not in seen for key in OPERATOR_KEYS.values())
    finally:
        await openai_fake.close()
        await anthropic_fake.close()


async def test_SEC1b_no_answer_quotes_a_file_tells_it_exists_or_echoes_a_model_servers_body(
    db_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "broken.yaml").write_text("steps:\n  - TOP-SECRET-LINE: [unclosed\n")
    fake = await OpenAIFakeServer().start()
    fake.push(Reply(status=400, error_message="SECRET-BODY-OF-THE-MODEL-SERVER at /srv/internal/x"))
    allow = ["--allow-model", f"scripted:{models}/*.yaml", "--allow-model", f"openai:*@{fake.base_url}"]
    try:
        async with (
            stead_serve("--db", db_url, *allow, env=OPERATOR_KEYS) as served,
            httpx.AsyncClient(base_url=served.base, timeout=30) as http,
        ):
            broken = await http.post("/v1/agents", json={"model": f"scripted:{models}/broken.yaml"})
            missing = await http.post("/v1/agents", json={"model": f"scripted:{models}/missing.yaml"})
            for r in (broken, missing):
                assert r.status_code == 422, r.text
                assert "TOP-SECRET" not in r.text and str(tmp_path) not in r.text
            assert broken.json()["detail"] == missing.json()["detail"]  # exists or not: one answer
            await _nothing_written(http)
            agent = (
                await http.post("/v1/agents", json={"model": f"openai:gpt-4.1-mini@{fake.base_url}"})
            ).json()
            posted = (await http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "hi"})).json()
            settled = await _settled(http, agent["id"], posted["events_after"])
            assert settled["status"] == "failed" and "HTTP 400" in settled["error"]
            (run,) = (await http.get("/v1/runs")).json()["items"]
            shown = [settled["error"], run["error"], (await http.get(f"/v1/runs/{run['id']}/tree")).text]
            for text in shown:
                assert "SECRET-BODY" not in text and "/srv/internal" not in text
    finally:
        await fake.close()


# ---------------------------------------------------------------------------------------------- SEC3
WRITER = "secret-writer-without-admin"
ADMIN = "secret-agents-admin"
SCOPED = [
    Token.from_secret(WRITER, "acme", ["agents:read", "agents:write", "messages:write", "runs:read"]),
    Token.from_secret(
        ADMIN, "acme", ["agents:read", "agents:write", "agents:admin", "messages:write", "runs:read"]
    ),
]


async def _nothing_accepted(env: Env, agent_id: str) -> None:
    http, h = env.http, bearer(ADMIN)
    assert (await http.get(f"/v1/agents/{agent_id}/messages", headers=h)).json()["items"] == []
    assert (await http.get(f"/v1/agents/{agent_id}/queue", headers=h)).json()["items"] == []
    assert (await http.get("/v1/runs", headers=h)).json()["items"] == []
    async with env.system.store.transaction() as tx:
        assert (
            await tx.fetch("SELECT message_id FROM stead_server_messages WHERE agent_id = ?", (agent_id,))
            == []
        )


async def test_SEC3_runtime_changes_and_permission_modes_need_agents_admin(make_env: Any) -> None:
    env: Env = await make_env(tokens=SCOPED)
    base = await env.live()
    async with httpx.AsyncClient(base_url=base, headers=bearer(WRITER)) as http:
        agent = (await http.post("/v1/agents", json={"provider": "s", "model": "m", "tools": ["add"]})).json()
        url = f"/v1/agents/{agent['id']}/messages"
        change = {"stead.changes": [{"action": "add", "kind": "tool", "name": "transfer"}]}
        for body in (
            {"content": "widen", "metadata": change},
            {"content": "widen", "settings": {"permission_mode": "full_access"}},
        ):
            r = await http.post(url, json=body)
            assert r.status_code == 403 and r.json()["code"] == "missing_scope", r.text
            assert "agents:admin" in r.json()["detail"]
        r = await http.post(
            f"{url}:batch", json={"messages": [{"content": "ok"}, {"content": "x", "metadata": change}]}
        )
        assert r.status_code == 403
        r = await http.post(
            "/v1/agents", json={"provider": "s", "model": "m", "permission_mode": "full_access"}
        )
        assert r.status_code == 403
    await _nothing_accepted(env, agent["id"])
    assert [a["id"] for a in (await env.http.get("/v1/agents", headers=bearer(ADMIN))).json()["items"]] == [
        agent["id"]
    ]


async def test_SEC3a_even_an_admin_cannot_go_beyond_the_definition_or_a_ceiling(make_env: Any) -> None:
    auth = Auth(SCOPED, tenants={"acme": TenantPolicy(max_permission_mode="workspace_write")})
    env: Env = await make_env(tokens=None, auth=auth, definitions=TEAM)
    base = await env.live()
    async with httpx.AsyncClient(base_url=base, headers=bearer(ADMIN)) as http:
        # the tenant's ceiling is below the default: an agent is created at the ceiling, never above it
        r = await http.post(
            "/v1/agents", json={"provider": "s", "model": "m", "permission_mode": "full_access"}
        )
        assert r.status_code == 403 and r.json()["code"] == "above_ceiling"
        low = (await http.post("/v1/agents", json={"provider": "s", "model": "m", "tools": ["add"]})).json()
        assert (await env.system.get(low["id"])).config.permission_mode == "workspace_write"
        url = f"/v1/agents/{low['id']}/messages"
        for body, code in (
            ({"content": "x", "settings": {"permission_mode": "auto"}}, "above_ceiling"),
            (
                {
                    "content": "x",
                    "metadata": {"stead.changes": [{"action": "add", "kind": "tool", "name": "transfer"}]},
                },
                "beyond_definition",
            ),
            (
                {
                    "content": "x",
                    "metadata": {
                        "stead.changes": [{"action": "add", "kind": "tool", "name": "add", "scope": "global"}]
                    },
                },
                "beyond_definition",
            ),
        ):
            r = await http.post(url, json=body)
            assert r.status_code == 403 and r.json()["code"] == code, r.text
        await _nothing_accepted(env, low["id"])
        # narrowing is allowed: a lower mode, removing a tool the agent has
        ok = {
            "content": "narrow",
            "settings": {"permission_mode": "read_only"},
            "if_busy": "queue",
            "metadata": {"stead.changes": [{"action": "remove", "kind": "tool", "name": "add"}]},
        }
        assert (await http.post(url, json=ok)).status_code == 202
        # a definition's agent: only its own sub-agents may be (re)added
        team = (await http.post("/v1/agents", json={"definition": "orchestrator"})).json()
        r = await http.post(
            f"/v1/agents/{team['id']}/messages",
            json={
                "content": "x",
                "metadata": {"stead.changes": [{"action": "add", "kind": "sub_agent", "name": "stranger"}]},
            },
        )
        assert r.status_code == 403 and r.json()["code"] == "beyond_definition"


async def test_SEC3b_a_caller_cannot_link_a_run_to_a_parent(env: Env) -> None:
    base = await env.live()
    async with httpx.AsyncClient(base_url=base, headers=bearer(A)) as http:
        agent = (await http.post("/v1/agents", json={"provider": "s", "model": "m"})).json()
        forged = {"run_id": "someone-elses-run", "step_id": "s", "agent_id": "other"}
        r = await http.post(
            f"/v1/agents/{agent['id']}/messages", json={"content": "x", "metadata": {"stead.parent": forged}}
        )
        assert r.status_code == 422 and "stead.parent" in r.json()["detail"], r.text
    assert (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=bearer(A))).json()["items"] == []
    assert (await env.http.get("/v1/runs", headers=bearer(A))).json()["items"] == []


# ---------------------------------------------------------------------------------------------- SEC5
async def test_SEC5_without_tokens_a_rebinding_host_is_refused(make_env: Any) -> None:
    env: Env = await make_env(tokens=None)
    base = await env.live()
    port = base.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=base) as http:
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
            for method, path in (("POST", "/v1/agents"), ("GET", "/v1/agents"), ("GET", "/ui")):
                r = await http.request(
                    method,
                    path,
                    json={"provider": "s", "model": "m"} if method == "POST" else None,
                    headers={"Host": host},
                )
                assert r.status_code == 403 and r.json()["code"] == "host_not_allowed", (host, path, r.text)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            assert (await http.get("/v1/agents", headers={"Host": host})).status_code == 200
        await _nothing_written(http)


async def test_SEC5a_a_state_changing_request_from_another_origin_is_refused(make_env: Any) -> None:
    env: Env = await make_env(tokens=None)
    base = await env.live()
    async with httpx.AsyncClient(base_url=base) as http:
        body = {"provider": "s", "model": "m"}
        for headers in (
            {"Origin": "http://attacker.example"},
            {"Origin": "null"},
            {"Origin": base.replace("127.0.0.1", "localhost")},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            # a cross-site "simple" POST (text/plain, no preflight) and a JSON one
            r = await http.post(
                "/v1/agents", content=json.dumps(body), headers={**headers, "Content-Type": "text/plain"}
            )
            assert r.status_code == 403 and r.json()["code"] == "cross_origin", (headers, r.text)
            r = await http.post("/v1/agents", json=body, headers=headers)
            assert r.status_code == 403
        await _nothing_written(http)
        assert (await http.post("/v1/agents", json=body, headers={"Origin": base})).status_code == 201


async def test_SEC5_stead_serve_answers_its_bound_names_only(db_url: str) -> None:
    async with stead_serve("--db", db_url) as served, httpx.AsyncClient(base_url=served.base) as http:
        assert (await http.get("/v1/agents")).status_code == 200
        r = await http.post(
            "/v1/agents", json={"model": "openai:gpt-4.1-mini"}, headers={"Host": "rebind.example"}
        )
        assert r.status_code == 403
        await _nothing_written(http)


# ---------------------------------------------------------------------------------------------- SEC6
async def _status(base: str, path: str, secret: str) -> tuple[int, dict[str, str], asyncio.StreamWriter]:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {secret}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return int(lines[0].split()[1]), headers, writer


async def test_SEC6_event_streams_are_capped_per_token_and_per_process(make_env: Any) -> None:
    env: Env = await make_env(max_streams=80, max_streams_per_token=50)
    base = await env.live()
    a = await env.agent(A)
    b = await env.agent(B)
    path_a, path_b = f"/v1/agents/{a['id']}/events", f"/v1/agents/{b['id']}/events"
    started = time.monotonic()
    open_streams: list[asyncio.StreamWriter] = []
    statuses: dict[int, int] = {}
    retry_after: set[str] = set()
    for batch in range(30):  # 3,000 attempts, 100 at a time, the accepted ones kept open
        results = await asyncio.gather(
            *(
                _status(base, path_a if (batch + i) % 2 else path_b, A if (batch + i) % 2 else B)
                for i in range(100)
            )
        )
        for status, headers, writer in results:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                open_streams.append(writer)
            else:
                retry_after.add(headers.get("retry-after", ""))
                writer.close()
    assert statuses == {200: 80, 429: 2920}
    assert retry_after == {"2"}
    assert env.app.state.stead.streams.open == 80
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        t0 = time.monotonic()
        assert (await http.get("/v1/healthz")).status_code == 200
        assert time.monotonic() - t0 < 1.0
    for writer in open_streams:  # closed streams give their slots back
        writer.close()
    await asyncio.wait_for(env.app.state.stead.streams.wait_open(0), 30)
    status, _, writer = await _status(base, path_a, A)
    writer.close()
    assert status == 200
    assert time.monotonic() - started < 90


async def test_SEC6a_a_slow_or_idle_client_is_disconnected(env: Env) -> None:
    server, task = await start(env.app, port=0, header_timeout=1.0)
    env.servers.append((server, task))
    port = server.bound_port
    # slowloris: the request head one byte at a time, never finished
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    t0 = time.monotonic()
    closed = None
    for _ in range(100):
        try:
            writer.write(b"X")
            await writer.drain()
        except ConnectionError:
            closed = time.monotonic() - t0
            break
        try:
            data = await asyncio.wait_for(reader.read(1), 0.1)
        except TimeoutError:
            continue
        if data == b"":
            closed = time.monotonic() - t0
            break
    assert closed is not None and closed < 3.0, closed
    # an idle connection that never sends a byte
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    assert await asyncio.wait_for(reader.read(1), 5) == b""
    assert time.monotonic() - t0 < 3.0
    # a request head that grows past 16 KiB without ending is refused and the connection closed
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000)
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 400")
    # a body that never arrives in full: 408
    app = stead.server.create_app(env.system, tokens=[Token.from_secret(A, "acme")], body_timeout=1.0)
    slow, slow_task = await start(app, port=0)
    env.servers.append((slow, slow_task))
    reader, writer = await asyncio.open_connection("127.0.0.1", slow.bound_port)
    writer.write(
        b"POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + A.encode() + b'\r\nContent-Length: 1000\r\n\r\n{"provider"'
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 408")
    assert (await env.http.get("/v1/agents", headers=bearer(A))).json()["items"] == []


# ---------------------------------------------------------------------------------------------- SEC7
async def test_SEC7_failed_token_attempts_are_throttled_per_address(env: Env) -> None:
    base = await env.live()
    async with httpx.AsyncClient(base_url=base) as http:
        for i in range(10):
            r = await http.get("/v1/agents", headers=bearer(f"guess-{i}"))
            assert r.status_code == 401
        r = await http.post("/v1/sessions", json={"token": "guess-10"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        # throttled: even the right token is not looked at from this address
        r = await http.get("/v1/agents", headers=bearer(A))
        assert r.status_code == 429 and r.json()["code"] == "rate_limited"
    other = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=env.app, client=("10.0.0.7", 4000)), base_url="http://127.0.0.1"
    )
    async with other:
        assert (await other.get("/v1/agents", headers=bearer(A))).status_code == 200


async def test_SEC7a_the_session_store_is_bounded(make_env: Any) -> None:
    auth = Auth([Token.from_secret(A, "acme")], max_sessions=3)
    env: Env = await make_env(tokens=None, auth=auth)
    cookies = []
    for _ in range(5):
        r = await env.http.post("/v1/sessions", json={"token": A})
        assert r.status_code == 201
        cookies.append(r.cookies["stead_session"])
    assert auth.sessions() == 3
    seen = []
    for sid in cookies:
        env.http.cookies.clear()
        env.http.cookies.set("stead_session", sid)
        seen.append((await env.http.get("/v1/session")).status_code)
    assert seen == [401, 401, 200, 200, 200]  # the oldest went first


async def test_SEC7b_docs_are_off_by_default_and_the_viewer_loads_nothing_from_elsewhere(
    make_env: Any,
) -> None:
    env: Env = await make_env(tokens=None)
    assert (await env.http.get("/docs")).status_code == 404
    assert (await env.http.get("/openapi.json")).status_code == 200
    page = (await env.http.get("/ui")).text
    assert "<script" in page and "http://" not in page and "https://" not in page
    on = stead.server.create_app(env.system, docs=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=on), base_url="http://127.0.0.1") as http:
        assert (await http.get("/docs")).status_code == 200


async def test_SEC7c_the_viewer_has_a_csp_and_is_never_framed(make_env: Any) -> None:
    env: Env = await make_env(tokens=None)
    for path in ("/ui", "/ui/assets/app.js", "/ui/assets/app.css"):
        r = await env.http.get(path)
        assert r.status_code == 200
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors" not in (await env.http.get("/v1/healthz")).headers.get(
        "content-security-policy", ""
    )


async def test_SEC7d_stead_serve_warns_about_a_token_file_others_can_read(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - token: a-plain-secret\n    tenant: acme\n    scopes: [admin]\n")
    db = str(tmp_path / "s.db")
    os.chmod(tokens, 0o644)
    async with stead_serve("--db", db, "--tokens", str(tokens)) as served:
        assert any("can be read by other users" in line for line in served.log)
    os.chmod(tokens, 0o600)
    async with stead_serve("--db", db, "--tokens", str(tokens)) as served:
        assert not any("can be read by other users" in line for line in served.log)


async def test_SEC7e_answers_never_show_absolute_server_paths(make_env: Any, tmp_path: Path) -> None:
    script = tmp_path / "models" / "hello.yaml"
    script.parent.mkdir()
    script.write_text("scripted: true\nrules:\n  - responses:\n      - text: hi\n")
    env: Env = await make_env(
        tokens=None, definitions=TEAM, allow_models=[f"scripted:{tmp_path}/models/*.yaml"]
    )
    r = await env.http.post("/v1/agents", json={"model": f"scripted:{script}"})
    assert r.status_code == 201, r.text
    assert str(tmp_path) not in r.text and r.json()["model"] == "scripted:hello.yaml"
    assert str(tmp_path) not in (await env.http.get(f"/v1/agents/{r.json()['id']}")).text
    r = await env.http.post("/v1/agents", json={"definition": "no-such-definition"})
    assert r.status_code == 422 and str(TEAM) not in r.text and str(Path.cwd()) not in r.text
    assert public_text("openai: not found (HTTP 404 x): body /srv/a/b.yaml") == (
        "openai: not found (HTTP 404 x): the model server's answer is in the server's log"
    )
    assert public_text("file /home/op/defs/a.yaml: bad") == "file …/a.yaml: bad"
    cut = ": the model server's answer is in the server's log"
    assert public_text("failed: openai: HTTP 400 invalid_request_error: body") == (
        "failed: openai: HTTP 400 invalid_request_error" + cut
    )
    context = "openai: context too long: the conversation does not fit the model's context window (body)"
    assert (
        public_text(context)
        == context.removesuffix(" (body)") + ": the model server's answer is in the server's log"
    )
    assert public_text("openai: HTTP 500") == "openai: HTTP 500"
    assert public_text("see http://host:1/v1/x") == "see http://host:1/v1/x"


async def test_SEC1_a_tenants_allowed_models_apply_to_that_tenant_only(make_env: Any, tmp_path: Path) -> None:
    endpoint = "openai-compatible:*@http://127.0.0.1:9/v1"
    file = tmp_path / "tokens.yaml"
    file.write_text(
        f"tenants:\n  acme:\n    allowed_models: ['{endpoint}']\n"
        f"tokens:\n  - {{token: {A}, tenant: acme, scopes: [admin]}}\n"
        f"  - {{token: {B}, tenant: globex, scopes: [admin]}}\n"
    )
    auth = stead.server.load_tokens(file)
    assert auth.policy("acme").allowed_models == (endpoint,) and auth.policy("globex").allowed_models == ()
    env: Env = await make_env(tokens=None, auth=auth)
    body = {"model": "openai-compatible:llama@http://127.0.0.1:9/v1"}
    refused = await env.http.post("/v1/agents", json=body, headers=bearer(B))
    assert refused.status_code == 422 and refused.json()["code"] == "model_not_allowed"
    assert (await env.http.get("/v1/agents", headers=bearer(B))).json()["items"] == []
    assert (await env.http.post("/v1/agents", json=body, headers=bearer(A))).status_code == 201
