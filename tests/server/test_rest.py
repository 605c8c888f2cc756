"""REST through an in-process client: agents, messages, idempotency, batches, busy agents, abort, delete,
history, the queue, runs, problem details and limits (docs/server.md, H1–H3, H9, H11, H12)."""

from __future__ import annotations

import asyncio
import json

import stead
from tests.server.support import A, Env, bearer

H = bearer(A)


async def test_H1_a_created_agent_and_an_accepted_message_are_durable_when_the_answer_comes(
    env: Env, db_path: object
) -> None:
    agent = await env.agent(name="helper")
    assert agent["state"] == "idle" and agent["tenant"] == "acme" and agent["event_seq"] == 0
    r = await env.http.post(
        f"/v1/agents/{agent['id']}/messages", json={"content": "hi", "id": "m1"}, headers=H
    )
    assert r.status_code == 202
    body = r.json()
    assert body["message_id"] == "m1" and body["created"] is True and body["events_after"] == 0
    # the answer came after the commit: the store already holds the message (queued or consumed)
    async with env.system.store.transaction() as tx:
        rows = await tx.fetch(
            "SELECT message_id FROM stead_server_messages WHERE agent_id = ?", (agent["id"],)
        )
    assert rows == [("m1",)]
    assert await env.system.get(agent["id"]) is not None


async def test_H2_a_repeated_message_id_is_200_created_false_and_queues_nothing(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    first = await env.http.post(url, json={"content": "one", "id": "m1"}, headers=H)
    again = await env.http.post(url, json={"content": "one", "id": "m1"}, headers=H)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["created"] is False and again.json()["events_after"] == first.json()["events_after"]
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert [q["id"] for q in queue] == ["m1"]
    env.model.gate.set()


async def test_H2_fifty_concurrent_retries_create_one_message(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    answers = await asyncio.gather(
        *(env.http.post(url, json={"content": "same", "id": "m1"}, headers=H) for _ in range(50))
    )
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 49 + [202]
    assert sum(r.json()["created"] for r in answers) == 1
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert len(queue) == 1
    env.model.gate.set()
    await env.idle(agent["id"])
    history = (await env.http.get(f"/v1/agents/{agent['id']}/messages", headers=H)).json()["items"]
    assert [m["text"] for m in history if m["role"] == "user"] == ["same"]


async def test_H2_the_same_id_with_another_body_is_422_id_reused(env: Env) -> None:
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    assert (await env.http.post(url, json={"content": "one", "id": "m1"}, headers=H)).status_code == 202
    for other in ({"content": "two", "id": "m1"}, {"content": "one", "id": "m1", "mode": "steer"}):
        r = await env.http.post(url, json=other, headers=H)
        assert r.status_code == 422
        assert r.json()["code"] == "id_reused"
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_H2_the_idempotency_key_header_is_the_message_id(env: Env) -> None:
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    key = {**H, "Idempotency-Key": "k1"}
    first = await env.http.post(url, json={"content": "one"}, headers=key)
    second = await env.http.post(url, json={"content": "one"}, headers=key)
    assert first.json()["message_id"] == "k1" and second.status_code == 200
    mismatch = await env.http.post(url, json={"content": "one", "id": "k2"}, headers=key)
    assert mismatch.status_code == 422 and mismatch.json()["code"] == "id_mismatch"


async def test_H3_creating_an_agent_with_an_id_is_idempotent(env: Env) -> None:
    body = {"id": "helper1", "provider": "s", "model": "m", "instructions": "Be brief."}
    first = await env.http.post("/v1/agents", json=body, headers=H)
    again = await env.http.post("/v1/agents", json=body, headers=H)
    other = await env.http.post("/v1/agents", json={**body, "instructions": "Be long."}, headers=H)
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"] == "helper1"
    assert other.json()["code"] == "agent_exists"


async def test_H3_concurrent_creations_of_one_id_make_one_agent(env: Env) -> None:
    body = {"id": "helper2", "provider": "s", "model": "m"}
    answers = await asyncio.gather(*(env.http.post("/v1/agents", json=body, headers=H) for _ in range(10)))
    assert sorted(r.status_code for r in answers) == [200] * 9 + [201]
    assert [a.id for a in await env.system.agents()] == ["helper2"]


async def test_an_agent_from_a_definition(make_env: object, db_url: str) -> None:
    from tests.server.support import TEAM

    env = await make_env(definitions=TEAM)  # type: ignore[operator]
    r = await env.http.post(
        "/v1/agents", json={"definition": "orchestrator", "data": {"audience": "ops"}}, headers=H
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "orchestrator" and r.json()["definition"] == "orchestrator"
    both = await env.http.post("/v1/agents", json={"definition": "orchestrator", "model": "x"}, headers=H)
    assert both.status_code == 422
    unknown = await env.http.post("/v1/agents", json={"definition": "nobody"}, headers=H)
    assert unknown.status_code == 422 and unknown.json()["code"] == "configuration"


async def test_H11_if_busy_reject_is_409_agent_busy_and_queue_accepts(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    assert (await env.http.post(url, json={"content": "one"}, headers=H)).status_code == 202
    busy = await env.http.post(url, json={"content": "two", "if_busy": "reject"}, headers=H)
    assert busy.status_code == 409 and busy.json()["code"] == "agent_busy"
    queued = await env.http.post(url, json={"content": "two", "if_busy": "queue"}, headers=H)
    assert queued.status_code == 202
    env.model.gate.set()
    await env.idle(agent["id"])
    idle = await env.http.post(url, json={"content": "three", "if_busy": "reject"}, headers=H)
    assert idle.status_code == 202


async def test_steer_is_consumed_before_a_queued_send(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    await env.http.post(url, json={"content": "first"}, headers=H)
    await env.model.started.wait()  # the first turn holds `first`, still queued until its response
    await env.http.post(url, json={"content": "later", "mode": "send"}, headers=H)
    await env.http.post(url, json={"content": "now", "mode": "steer"}, headers=H)
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert [q["mode"] for q in queue] == ["steer", "send", "send"]
    env.model.gate.set()
    await env.idle(agent["id"])
    history = (await env.http.get(f"/v1/agents/{agent['id']}/messages", headers=H)).json()["items"]
    users = [m["text"] for m in history if m["role"] == "user"]
    assert users.index("now") < users.index("later")


async def test_H11_abort_is_idempotent_and_keeps_queued_messages(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    await env.http.post(url, json={"content": "one"}, headers=H)
    await env.model.started.wait()
    await env.http.post(url, json={"content": "two"}, headers=H)
    first = await env.http.post(f"/v1/agents/{agent['id']}/abort", headers=H)
    second = await env.http.post(f"/v1/agents/{agent['id']}/abort", headers=H)
    assert (first.status_code, second.status_code) == (202, 202)
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert [q["content"][0]["text"] for q in queue] == ["two"]
    runs = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=H)).json()["items"]
    assert runs[0]["status"] == "cancelled"
    env.model.gate.set()


async def test_H11_deleting_a_working_agent_is_409_unless_abort(env: Env) -> None:
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "one"}, headers=H)
    busy = await env.http.delete(f"/v1/agents/{agent['id']}", headers=H)
    assert busy.status_code == 409 and busy.json()["code"] == "agent_busy"
    gone = await env.http.delete(f"/v1/agents/{agent['id']}", params={"abort": "true"}, headers=H)
    assert gone.status_code == 204
    assert (await env.http.get(f"/v1/agents/{agent['id']}", headers=H)).status_code == 404
    async with env.system.store.transaction() as tx:
        left = await tx.fetch("SELECT COUNT(*) FROM stead_events WHERE agent_id = ?", (agent["id"],))
    assert left == [(0,)]  # the agent's events went in the deleting transaction
    env.model.gate.set()


async def test_H12_a_batch_is_accepted_all_or_none(env: Env) -> None:
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages:batch"
    env.model.gate = asyncio.Event()
    ok = await env.http.post(
        url,
        json={"messages": [{"content": "a", "id": "b1"}, {"content": "b", "id": "b2", "mode": "steer"}]},
        headers=H,
    )
    assert ok.status_code == 202
    assert [(m["message_id"], m["created"]) for m in ok.json()["messages"]] == [("b1", True), ("b2", True)]
    # one message with a reused id refuses the whole batch: b3 is not accepted either
    bad = await env.http.post(
        url, json={"messages": [{"content": "c", "id": "b3"}, {"content": "other", "id": "b1"}]}, headers=H
    )
    assert bad.status_code == 422 and bad.json()["code"] == "id_reused"
    invalid = await env.http.post(
        url, json={"messages": [{"content": "d", "id": "b4"}, {"content": " "}]}, headers=H
    )
    assert invalid.status_code == 422
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert sorted(q["id"] for q in queue) == ["b1", "b2"]
    retry = await env.http.post(
        url,
        json={"messages": [{"content": "a", "id": "b1"}, {"content": "b", "id": "b2", "mode": "steer"}]},
        headers=H,
    )
    assert retry.status_code == 200 and not any(m["created"] for m in retry.json()["messages"])
    env.model.gate.set()


async def test_H9_oversize_input_is_413(make_env: object) -> None:
    env = await make_env(max_body_bytes=10_000)  # type: ignore[operator]
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    big = await env.http.post(url, json={"content": "x" * 20_000}, headers=H)
    assert big.status_code == 413 and big.json()["code"] == "payload_too_large"
    # a message over the system's payload limit (measured as the kernel does) is 413 too
    env.system.admission.max_payload_bytes = 1_000
    over = await env.http.post(url, json={"content": "é" * 500}, headers=H)
    assert over.status_code == 413
    queue = (await env.http.get(f"/v1/agents/{agent['id']}/queue", headers=H)).json()["items"]
    assert queue == []


async def test_H9_errors_are_problem_details_with_a_code(env: Env) -> None:
    cases = [
        await env.http.get("/v1/agents/nobody", headers=H),
        await env.http.post(
            "/v1/agents", content=b"{not json", headers={**H, "content-type": "application/json"}
        ),
        await env.http.post("/v1/agents", json={"provider": "s", "model": "m", "bogus": 1}, headers=H),
        await env.http.get("/v1/nowhere", headers=H),
        await env.http.put("/v1/agents", headers=H),
    ]
    for r in cases:
        assert r.headers["content-type"].startswith("application/problem+json"), r.text
        problem = r.json()
        assert set(problem) >= {"type", "title", "status", "detail", "code"}
        assert (
            problem["status"] == r.status_code and problem["type"] == f"urn:stead:problem:{problem['code']}"
        )
    assert [r.status_code for r in cases] == [404, 422, 422, 404, 405]


async def test_history_pages_in_order(env: Env) -> None:
    agent = await env.agent()
    for i in range(3):
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": f"m{i}"}, headers=H)
        await env.idle(agent["id"])
    seen: list[str] = []
    after = None
    while True:
        params = {"limit": 2} if after is None else {"limit": 2, "after": after}
        page = (await env.http.get(f"/v1/agents/{agent['id']}/messages", params=params, headers=H)).json()
        seen += [f"{m['index']}:{m['role']}" for m in page["items"]]
        after = page["next_cursor"]
        if after is None:
            break
    assert seen == [f"{i}:{r}" for i, r in enumerate(["user", "assistant"] * 3)]


async def test_agent_pagination_has_no_gaps_or_duplicates_while_agents_are_created(env: Env) -> None:
    for _ in range(5):
        await env.agent()
    seen: list[str] = []
    cursor = None
    created_meanwhile = 0
    while True:
        params: dict[str, object] = {"limit": 2}
        if cursor is not None:
            params["after"] = cursor
        page = (await env.http.get("/v1/agents", params=params, headers=H)).json()
        seen += [a["id"] for a in page["items"]]
        if created_meanwhile < 3:
            await env.agent()
            created_meanwhile += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    all_ids = [a.id for a in await env.system.agents()]
    assert len(seen) == len(set(seen))
    assert seen == all_ids  # everything, in creation order, including agents created while paging
    bad = await env.http.get("/v1/agents", params={"after": "not-a-cursor"}, headers=H)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_cursor"


async def test_runs_steps_and_trees(env: Env) -> None:
    env.model.calls = 2
    agent = await env.agent(tools=["add"])
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "add"}, headers=H)
    await env.idle(agent["id"])
    runs = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=H)).json()
    (run,) = runs["items"]
    assert run["status"] == "completed" and run["iterations"] == 3
    steps = (await env.http.get(f"/v1/runs/{run['id']}/steps", headers=H)).json()["items"]
    assert [s["type"] for s in steps] == ["prompt", "tool", "prompt", "tool", "prompt"]
    tree = (await env.http.get(f"/v1/runs/{run['id']}/tree", headers=H)).json()
    assert tree["id"] == run["id"] and len(tree["steps"]) == 5 and tree["children"] == []
    one = (await env.http.get(f"/v1/runs/{run['id']}", headers=H)).json()
    assert one["final_message"] == env.model.text
    completed = (await env.http.get("/v1/runs", params={"status": "failed"}, headers=H)).json()
    assert completed["items"] == []
    assert (await env.http.get("/v1/runs/nothing", headers=H)).status_code == 404


async def test_health_and_readiness(env: Env) -> None:
    assert (await env.http.get("/v1/healthz")).json() == {"status": "ok", "checks": {}}
    ready = await env.http.get("/v1/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["store"] == "ok"


async def test_the_message_metadata_and_settings_reach_the_agent(env: Env) -> None:
    agent = await env.agent()
    r = await env.http.post(
        f"/v1/agents/{agent['id']}/messages",
        json={
            "content": [{"type": "text", "text": "hi"}],
            "metadata": {"k": [1, 2]},
            "settings": {"model": "m2"},
        },
        headers=H,
    )
    assert r.status_code == 202, r.text
    await env.idle(agent["id"])
    history = await (await env.system.get(agent["id"])).history()
    assert history[0].metadata == {"k": [1, 2]} and history[0].content == [stead.Text("hi")]
    got = (await env.http.get(f"/v1/agents/{agent['id']}", headers=H)).json()
    assert got["settings"]["model"] == "m2"
    assert json.loads(json.dumps(got))["event_seq"] > 0


async def test_A6_concurrent_http_sends_share_the_group_commit(env: Env, monkeypatch: object) -> None:
    """Issue 23 item 2: an HTTP send joins the group commit (its idempotency row in the same transaction),
    instead of opening a transaction of its own per request; every one is still durable and idempotent."""
    env.model.gate = asyncio.Event()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    import stead._group_commit as group_commit

    groups: list[int] = []
    commit_group = group_commit.GroupCommit._commit_group

    async def counted(self: group_commit.GroupCommit, batch: list[object], *, isolate: bool) -> object:
        groups.append(len(batch))
        return await commit_group(self, batch, isolate=isolate)  # type: ignore[arg-type]

    monkeypatch.setattr(group_commit.GroupCommit, "_commit_group", counted)  # type: ignore[attr-defined]
    answers = await asyncio.gather(
        *(env.http.post(url, json={"content": f"m{i}", "id": f"m{i}"}, headers=H) for i in range(40))
    )
    assert [r.status_code for r in answers] == [202] * 40
    assert sum(groups) == 40 and len(groups) < 40 / 2, groups  # grouped: far fewer commits than requests
    again = await asyncio.gather(
        *(env.http.post(url, json={"content": f"m{i}", "id": f"m{i}"}, headers=H) for i in range(40)),
        env.http.post(url, json={"content": "other body", "id": "m3"}, headers=H),
    )
    assert [r.status_code for r in again] == [200] * 40 + [422]  # one refusal refuses only its sender
    assert again[-1].json()["code"] == "id_reused"
    queue = (await env.http.get(f"{url[: -len('/messages')]}/queue", headers=H)).json()["items"]
    assert sorted(q["id"] for q in queue) == sorted(f"m{i}" for i in range(40))
    env.model.gate.set()
