"""Approvals over HTTP: list, get, decide once (H13), with the policy's promises kept through the service
(P2 the call runs once after an approval, P3 a denial commits one error result, P4 concurrent decisions,
P7 edited arguments), tenant isolation (H7), scopes (H8), and the durable `approval_requested` /
`approval_decided` events over a real uvicorn server on loopback (H4, H5)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from stead.client import Client, ServiceError
from stead.server._events_schema import EVENT_ADAPTER
from tests.server import support
from tests.server.support import A_READ, A, B, Env, bearer, collect


@pytest.fixture(autouse=True)
def _no_transfers() -> None:
    support.TRANSFERS.clear()


async def _waiting(env: Env, secret: str = A, content: str = "pay") -> tuple[dict[str, Any], str]:
    """An agent of `secret`'s tenant whose run waits on one `transfer` call: (the agent, its message id)."""
    env.model.tool = "transfer"
    env.model.calls = 1
    agent = await env.agent(secret, tools=["transfer"])
    r = await env.http.post(
        f"/v1/agents/{agent['id']}/messages", json={"content": content}, headers=bearer(secret)
    )
    assert r.status_code == 202, r.text
    await env.idle(agent["id"])  # returns once the agent has nothing to do but wait for the decision
    return agent, r.json()["message_id"]


async def _pending(env: Env, agent_id: str, secret: str = A) -> dict[str, Any]:
    r = await env.http.get("/v1/approvals", params={"agent_id": agent_id}, headers=bearer(secret))
    assert r.status_code == 200, r.text
    (item,) = r.json()["items"]
    return dict(item)


async def _decide(env: Env, approval_id: str, secret: str = A, **body: Any) -> httpx.Response:
    return await env.http.post(f"/v1/approvals/{approval_id}/decision", json=body, headers=bearer(secret))


async def _tool_results(env: Env, agent_id: str) -> list[dict[str, Any]]:
    history = (await env.http.get(f"/v1/agents/{agent_id}/messages", headers=bearer(A))).json()["items"]
    return [b for m in history if m["role"] == "tool" for b in m["content"]]


async def test_H13_an_approval_round_trip_over_http_runs_the_call_once(env: Env) -> None:
    agent, _ = await _waiting(env)
    (run,) = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=bearer(A))).json()[
        "items"
    ]
    assert run["status"] == "awaiting_input"
    assert (await env.http.get(f"/v1/agents/{agent['id']}", headers=bearer(A))).json()["state"] == "waiting"
    pending = await _pending(env, agent["id"])
    assert pending["status"] == "pending" and pending["tool"] == "transfer"
    assert pending["arguments"] == {"a": 0, "b": 1} and pending["run_id"] == run["id"]
    assert pending["root_run_id"] == run["id"] and "always" in pending["reason"]
    one = await env.http.get(f"/v1/approvals/{pending['id']}", headers=bearer(A))
    assert one.status_code == 200 and one.json() == pending
    assert support.TRANSFERS == []  # P2: nothing ran before the decision

    r = await _decide(env, pending["id"], decision="approve", reason="looks right")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["decided"] is True
    assert body["approval"]["status"] == "approved" and body["approval"]["note"] == "looks right"
    assert body["approval"]["decided_by"] == "a-all"
    # H1: the answer came after the commit — the stored approval says so already
    assert (await env.system.approval(pending["id"])).status == "approved"
    await env.idle(agent["id"])
    assert support.TRANSFERS == [(0, 1)]  # ran exactly once
    results = await _tool_results(env, agent["id"])
    assert [(b["output"], b["is_error"]) for b in results] == [("1", False)]
    run = (await env.http.get(f"/v1/runs/{run['id']}", headers=bearer(A))).json()
    assert run["status"] == "completed"
    r = await env.http.get("/v1/approvals", headers=bearer(A))
    assert r.json()["items"] == []  # nothing pending any more
    decided = (await env.http.get("/v1/approvals", params={"status": "decided"}, headers=bearer(A))).json()
    assert [a["id"] for a in decided["items"]] == [pending["id"]]


async def test_P3_a_denial_over_http_commits_one_error_result_and_the_call_never_runs(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    r = await _decide(env, pending["id"], decision="deny", reason="wrong account")
    assert r.status_code == 200, r.text
    assert r.json()["decided"] is True and r.json()["approval"]["status"] == "rejected"
    await env.idle(agent["id"])
    assert support.TRANSFERS == []
    results = await _tool_results(env, agent["id"])
    assert len(results) == 1 and results[0]["is_error"] is True
    assert results[0]["output"] == "rejected by reviewer: wrong account"
    (run,) = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=bearer(A))).json()[
        "items"
    ]
    assert run["status"] == "completed"


async def test_H13_the_same_decision_again_is_200_with_the_stored_one_another_is_409(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    first = await _decide(env, pending["id"], decision="approve", reason="first")
    assert first.status_code == 200 and first.json()["decided"] is True
    again = await _decide(env, pending["id"], decision="approve", reason="a retry")
    assert again.status_code == 200, again.text
    assert again.json()["decided"] is False
    assert again.json()["approval"] == first.json()["approval"]  # the stored decision, unchanged
    other = await _decide(env, pending["id"], decision="deny")
    assert other.status_code == 409, other.text
    problem = other.json()
    assert problem["code"] == "approval_decided" and problem["type"] == "urn:stead:problem:approval_decided"
    assert "approved" in problem["detail"]
    await env.idle(agent["id"])
    assert support.TRANSFERS == [(0, 1)]
    # and the other way round: a denial stands against a later approval
    support.TRANSFERS.clear()
    agent2, _ = await _waiting(env)
    pending2 = await _pending(env, agent2["id"])
    assert (await _decide(env, pending2["id"], decision="deny")).status_code == 200
    assert (await _decide(env, pending2["id"], decision="deny")).json()["decided"] is False
    late = await _decide(env, pending2["id"], decision="approve")
    assert late.status_code == 409 and late.json()["code"] == "approval_decided"
    await env.idle(agent2["id"])
    assert support.TRANSFERS == []


async def test_H13_concurrent_decisions_from_two_clients_exactly_one_wins(env: Env) -> None:
    for round_ in range(3):
        support.TRANSFERS.clear()
        agent, _ = await _waiting(env, content=f"pay {round_}")
        pending = await _pending(env, agent["id"])
        clients = [
            Client("http://test", A, transport=httpx.ASGITransport(app=env.app)),
            Client("http://test", A, transport=httpx.ASGITransport(app=env.app)),
        ]
        decisions = ["approve", "deny"] if round_ % 2 == 0 else ["deny", "approve"]
        try:
            outcomes = await asyncio.gather(
                *(c.decide(pending["id"], d) for c, d in zip(clients, decisions, strict=True)),
                return_exceptions=True,
            )
        finally:
            for c in clients:
                await c.aclose()
        won = [o for o in outcomes if isinstance(o, dict)]
        lost = [o for o in outcomes if isinstance(o, ServiceError)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert won[0]["decided"] is True
        assert lost[0].status == 409 and lost[0].code == "approval_decided"
        stored = await env.system.approval(pending["id"])
        assert stored.status == won[0]["approval"]["status"]
        await env.idle(agent["id"])
        assert support.TRANSFERS in ([], [(0, 1)])
        assert bool(support.TRANSFERS) is (stored.status == "approved")
        assert len(await _tool_results(env, agent["id"])) == 1  # one result, whoever won

    # two clients approving at once: one decides, the other gets the stored decision (200, decided: false)
    support.TRANSFERS.clear()
    agent, _ = await _waiting(env, content="pay twice")
    pending = await _pending(env, agent["id"])
    async with (
        Client("http://test", A, transport=httpx.ASGITransport(app=env.app)) as c1,
        Client("http://test", A, transport=httpx.ASGITransport(app=env.app)) as c2,
    ):
        both = await asyncio.gather(c1.decide(pending["id"], "approve"), c2.decide(pending["id"], "approve"))
    assert sorted(o["decided"] for o in both) == [False, True]
    await env.idle(agent["id"])
    assert support.TRANSFERS == [(0, 1)]


async def test_P7_edited_arguments_over_http_are_validated_then_run(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    bad = await _decide(env, pending["id"], decision="approve", edited_arguments={"a": "many"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_input"
    with_deny = await _decide(env, pending["id"], decision="deny", edited_arguments={"a": 1, "b": 2})
    assert with_deny.status_code == 422 and with_deny.json()["code"] == "invalid_request"
    assert (await env.system.approval(pending["id"])).status == "pending"  # nothing was written
    service = env.app.state.stead
    head, _ = await service.head(agent["id"])
    kinds = [kind for _, _, kind, _ in await service.replay(agent["id"], 0, head)]
    assert "approval_requested" in kinds and "approval_decided" not in kinds  # H4: no event, no change
    r = await _decide(env, pending["id"], decision="approve", edited_arguments={"a": 5, "b": 7})
    assert r.status_code == 200, r.text
    assert r.json()["approval"]["edited_arguments"] == {"a": 5, "b": 7}
    await env.idle(agent["id"])
    assert support.TRANSFERS == [(5, 7)]


async def test_H7_another_tenants_approvals_are_404_and_never_listed(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    b_agent, _ = await _waiting(env, secret=B)
    b_pending = await _pending(env, b_agent["id"], secret=B)
    listed = (await env.http.get("/v1/approvals", params={"status": "all"}, headers=bearer(B))).json()
    assert [a["id"] for a in listed["items"]] == [b_pending["id"]]
    r = await env.http.get("/v1/approvals", params={"agent_id": agent["id"]}, headers=bearer(B))
    assert r.json()["items"] == []
    assert (await env.http.get(f"/v1/approvals/{pending['id']}", headers=bearer(B))).status_code == 404
    r = await _decide(env, pending["id"], secret=B, decision="deny")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert (await env.system.approval(pending["id"])).status == "pending"  # B changed nothing
    unknown = await _decide(env, "no-such-approval", decision="approve")
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


async def test_H8_reading_approvals_needs_runs_read_and_deciding_needs_approvals_decide(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"], secret=A_READ)  # runs:read lists
    r = await _decide(env, pending["id"], secret=A_READ, decision="approve")
    assert r.status_code == 403 and r.json()["code"] == "missing_scope"
    assert "approvals:decide" in r.json()["detail"]
    assert (await env.system.approval(pending["id"])).status == "pending"


async def test_approval_lists_page_by_cursor_and_filter_by_status_and_agent(env: Env) -> None:
    agents = [(await _waiting(env, content=f"pay {i}"))[0] for i in range(3)]
    ids = [(await _pending(env, a["id"]))["id"] for a in agents]
    first = (await env.http.get("/v1/approvals", params={"limit": 2}, headers=bearer(A))).json()
    assert [a["id"] for a in first["items"]] == ids[:2] and first["next_cursor"] is not None
    rest = (
        await env.http.get(
            "/v1/approvals", params={"limit": 2, "after": first["next_cursor"]}, headers=bearer(A)
        )
    ).json()
    assert [a["id"] for a in rest["items"]] == ids[2:] and rest["next_cursor"] is None
    bad = await env.http.get("/v1/approvals", params={"after": "not-a-cursor"}, headers=bearer(A))
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_cursor"
    assert (await _decide(env, ids[1], decision="deny")).status_code == 200
    async with Client("http://test", A, transport=httpx.ASGITransport(app=env.app)) as c:
        assert [a["id"] for a in await c.approvals()] == [ids[0], ids[2]]
        assert [a["id"] for a in await c.approvals("decided")] == [ids[1]]
        assert [a["id"] for a in await c.approvals("all")] == ids
        assert [a["id"] for a in await c.approvals("all", agent_id=agents[2]["id"])] == [ids[2]]
        assert (await c.approval(ids[1]))["status"] == "rejected"
        root = (await c.approval(ids[2]))["root_run_id"]
        assert [a["id"] for a in await c.approvals("all", root_run_id=root)] == [ids[2]]
    for a in agents:
        await env.idle(a["id"])


async def test_without_the_policy_plugin_approval_routes_are_absent_and_say_why(make_env: Any) -> None:
    env: Env = await make_env(approvals=False)
    paths = env.app.openapi()["paths"]
    assert not [p for p in paths if p.startswith("/v1/approvals")]
    for method, path in (
        ("GET", "/v1/approvals"),
        ("GET", "/v1/approvals/x"),
        ("POST", "/v1/approvals/x/decision"),
    ):
        r = await env.http.request(method, path, json={"decision": "approve"}, headers=bearer(A))
        assert r.status_code == 404, r.text
        assert r.json()["code"] == "approvals_off" and "approvals=True" in r.json()["detail"]


async def test_H4_approval_events_are_durable_in_seq_order_and_a_stream_resumes_past_them(env: Env) -> None:
    base = await env.live()
    env.model.tool = "transfer"
    env.model.calls = 1
    agent = await env.agent(tools=["transfer"])
    async with env.client(base) as client:
        accepted = await client.send(agent["id"], "pay", id="m1")
        stream = client.events(agent["id"], after=accepted["events_after"], reconnect=False)
        before = await collect(stream, lambda e: e.event == "approval_requested")
        requested = before[-1]
        approval_id = requested.data["approval_id"]
        assert requested.data["call"]["name"] == "transfer" and requested.data["reason"]
        assert (await client.approval(approval_id))["status"] == "pending"
        decided = await client.decide(approval_id, "approve", reason="ok")
        assert decided["decided"] is True
        after = await collect(stream, lambda e: e.event == "settled")
        await stream.aclose()
        events = before + after
        kinds = [e.event for e in events]
        assert kinds.index("tool_started") < kinds.index("approval_requested")
        assert kinds.index("approval_requested") < kinds.index("approval_decided")
        assert kinds.index("approval_decided") < kinds.index("tool_finished") < kinds.index("settled")
        seqs = [e.seq for e in events if e.seq is not None]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # increasing, no gaps
        decision = next(e for e in events if e.event == "approval_decided")
        assert decision.data["approval_id"] == approval_id
        assert decision.data["decision"] == "approved" and decision.data["note"] == "ok"
        assert decision.data["run_id"] == requested.data["run_id"]
        for e in events:
            if e.seq is not None:
                EVENT_ADAPTER.validate_python(e.data)  # every frame matches its documented schema
        # resume after the request: everything after it, exactly once, starting with the decision
        resumed = await collect(
            client.events(agent["id"], last_event_id=str(requested.seq), reconnect=False),
            lambda e: e.event == "settled",
        )
        assert [(e.seq, e.event) for e in resumed] == [
            (e.seq, e.event) for e in events if e.seq is not None and e.seq > (requested.seq or 0)
        ]
        assert resumed[0].event == "approval_decided"
    assert support.TRANSFERS == [(0, 1)]


async def test_H4_a_run_stream_stays_open_while_its_run_awaits_a_decision(env: Env) -> None:
    base = await env.live()
    agent, _ = await _waiting(env)
    (run,) = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=bearer(A))).json()[
        "items"
    ]
    assert run["status"] == "awaiting_input"
    async with env.client(base) as client:
        stream = client.run_events(run["id"])
        seen = await collect(stream, lambda e: e.event == "approval_requested")
        assert "done" not in [e.event for e in seen]  # waiting is not settled
        approval_id = seen[-1].data["approval_id"]
        await client.decide(approval_id, "deny", reason="no")
        rest = await collect(stream, lambda e: e.event == "done")
        await stream.aclose()
    kinds = [e.event for e in rest]
    assert kinds[0] == "approval_decided" and kinds[-2:] == ["settled", "done"]
    decided = rest[0].data
    assert decided["decision"] == "rejected" and decided["note"] == "no"
    finished = next(e for e in rest if e.event == "tool_finished")
    assert finished.data["result"]["output"] == "rejected by reviewer: no"


async def test_H4_an_abort_cancels_a_pending_approval_with_an_approval_decided_event(env: Env) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    r = await env.http.post(f"/v1/agents/{agent['id']}/abort", headers=bearer(A))
    assert r.status_code == 202, r.text
    assert (await env.system.approval(pending["id"])).status == "cancelled"
    late = await _decide(env, pending["id"], decision="approve")
    assert late.status_code == 409 and late.json()["code"] == "approval_decided"
    service = env.app.state.stead
    head, _ = await service.head(agent["id"])
    events = [json.loads(data) for _, _, _, data in await service.replay(agent["id"], 0, head)]
    decided = [e for e in events if e["type"] == "approval_decided"]
    assert [(d["approval_id"], d["decision"]) for d in decided] == [(pending["id"], "cancelled")]
    assert support.TRANSFERS == []


async def test_H4_a_steered_message_rejects_a_pending_approval_with_an_approval_decided_event(
    env: Env,
) -> None:
    agent, _ = await _waiting(env)
    pending = await _pending(env, agent["id"])
    service = env.app.state.stead
    head, _ = await service.head(agent["id"])
    env.model.calls = 0  # the next inference answers in text
    r = await env.http.post(
        f"/v1/agents/{agent['id']}/messages",
        json={"content": "stop, do not pay", "mode": "steer"},
        headers=bearer(A),
    )
    assert r.status_code == 202, r.text
    await env.idle(agent["id"])
    assert (await env.system.approval(pending["id"])).status == "rejected"
    events = [json.loads(data) for _, _, _, data in await service.replay(agent["id"], head, head + 100)]
    kinds = [e["type"] for e in events]
    assert kinds.index("approval_decided") < kinds.index("message_consumed") < kinds.index("settled")
    decided = events[kinds.index("approval_decided")]
    assert decided["approval_id"] == pending["id"] and decided["decision"] == "rejected"
    assert decided["note"]  # the kernel's reason: the user sent a new message instead
    late = await _decide(env, pending["id"], decision="approve")
    assert late.status_code == 409 and late.json()["code"] == "approval_decided"
    assert support.TRANSFERS == []
