"""Durable events and resumable streams (H4–H6, H10), against a real uvicorn on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

import stead
from stead.client import ServerEvent, parse_sse
from stead.server import ServerPlugin
from stead.server._events_schema import EVENT_MODELS
from stead.server._hub import OVERFLOW, Hub, StoredEvent
from tests.server.support import A, Env, Model, bearer, close_env, open_env

H = bearer(A)


async def events_of(env: Env, agent_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    async with env.system.store.transaction() as tx:
        rows = await tx.fetch(
            "SELECT seq, type, data FROM stead_events WHERE agent_id = ? ORDER BY seq", (agent_id,)
        )
    return [(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]


def check_schema(ev: ServerEvent) -> None:
    """Every frame's data validates against the documented schema of its event type."""
    model = EVENT_MODELS[ev.event]
    model.model_validate(ev.data)
    assert ev.data["type"] == ev.event


@asynccontextmanager
async def raw_stream(base: str, path: str, headers: dict[str, str]) -> AsyncIterator[AsyncIterator[str]]:
    """The stream's lines; the first one (`retry:`) has arrived when this yields, so the subscription
    is in place."""
    async with (
        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30.0)) as http,
        http.stream("GET", path, headers=headers) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith("retry: ")
        yield lines


async def test_H4_every_change_writes_its_event_with_a_gapless_seq(env: Env) -> None:
    env.model.calls = 2
    agent = await env.agent(tools=["add"])
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go", "id": "m1"}, headers=H)
    await env.idle(agent["id"])
    events = await events_of(env, agent["id"])
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    kinds = [kind for _, kind, _ in events]
    round_trip = ["block_end", "usage", "tool_started", "tool_finished"]
    assert kinds == [
        "activated",
        "message_consumed",
        *round_trip,
        *round_trip,
        "block_end",
        "usage",
        "settled",
    ]
    run_ids = {data["run_id"] for _, _, data in events}
    assert len(run_ids) == 1 and None not in run_ids
    assert events[1][2]["message"]["id"] == "m1" and events[-1][2]["status"] == "completed"
    head = (await env.http.get(f"/v1/agents/{agent['id']}", headers=H)).json()["event_seq"]
    assert head == len(events)


class _Refuse(stead.Hooks):
    async def activated_tx(self, ctx: stead.HookContext) -> None:
        if ctx.message is not None and ctx.message.text == "refuse me":
            raise stead.InvalidInput("refused by a hook")


async def test_H4_a_rolled_back_change_leaves_no_event_and_no_fingerprint(db_url: str) -> None:
    # the server plugin's hooks run first and write their events; the refusing hook then rolls it all back
    plugins = [ServerPlugin(prune_interval=None), _RefusingPlugin()]
    system = await stead.server.open(db_url, providers={"s": Model()}, plugins=plugins)
    app = stead.server.create_app(system)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        agent = (await http.post("/v1/agents", json={"provider": "s", "model": "m"})).json()
        r = await http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "refuse me", "id": "m1"})
        assert r.status_code == 422
        async with system.store.transaction() as tx:
            events = await tx.fetch("SELECT COUNT(*) FROM stead_events WHERE agent_id = ?", (agent["id"],))
            prints = await tx.fetch(
                "SELECT COUNT(*) FROM stead_server_messages WHERE agent_id = ?", (agent["id"],)
            )
            head = await tx.fetch(
                "SELECT head_seq FROM stead_server_agents WHERE agent_id = ?", (agent["id"],)
            )
        assert (events, prints, head) == ([(0,)], [(0,)], [(0,)])
        ok = await http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "fine", "id": "m1"})
        assert ok.status_code == 202 and ok.json()["created"] is True  # the refused id left no trace
    await system.close()


class _RefusingPlugin(stead.Plugin):
    name = "refusing"

    def hooks(self) -> list[stead.Hooks]:
        return [_Refuse()]


async def test_H4_a_restart_resumes_the_seq_and_announces_the_restored_run(db_url: str) -> None:
    env = await open_env(db_url, tokens=None)
    env.model.calls = 2  # response 1 calls the tool again: a later inference is owed when the process stops
    env.model.holds[1] = asyncio.Event()
    agent = await env.agent(secret="", tools=["add"])
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"})
    await env.model.reached(1).wait()  # the second response (after the tool result) is being requested
    closing = asyncio.get_running_loop().create_task(close_env(env))
    env.model.holds[1].set()  # the in-flight response finishes; the loop stops before the next request
    await closing
    before = await _events_file(db_url, agent["id"])
    env2 = await open_env(db_url, tokens=None)
    try:
        await env2.idle(agent["id"])
        events = await events_of(env2, agent["id"])
    finally:
        await close_env(env2)
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert events[: len(before)] == before
    restored = [data for _, kind, data in events if kind == "activated" and data["restored"]]
    assert len(restored) == 1 and events[-1][1] == "settled"


async def _events_file(db_url: str, agent_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    system = await stead.server.open(db_url, restore=False)
    try:
        async with system.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT seq, type, data FROM stead_events WHERE agent_id = ? ORDER BY seq", (agent_id,)
            )
    finally:
        await system.close()
    return [(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]


async def test_H5_a_dropped_stream_resumed_with_last_event_id_loses_and_repeats_nothing(env: Env) -> None:
    env.model.calls = 3
    env.model.holds[1] = asyncio.Event()
    base = await env.live()
    agent = await env.agent(tools=["add"])
    accepted = (
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=H)
    ).json()
    first: list[ServerEvent] = []
    async with env.client(base) as client:
        async for ev in client.events(agent["id"], after=accepted["events_after"], reconnect=False):
            first.append(ev)
            if ev.event == "tool_finished":
                break  # the connection drops here, mid-run (the second response is held)
        env.model.holds[1].set()  # the run goes on while nobody listens
        await env.idle(agent["id"])
        second: list[ServerEvent] = []
        async for ev in client.events(agent["id"], last_event_id=first[-1].id, reconnect=False):
            second.append(ev)
            if ev.event == "settled":
                break
        whole: list[ServerEvent] = []
        async for ev in client.events(agent["id"], after=0, reconnect=False):
            whole.append(ev)
            if ev.event == "settled":
                break
    assert first + second == whole
    assert [ev.seq for ev in whole] == list(range(1, len(whole) + 1))
    for ev in whole:
        check_schema(ev)


async def test_H5_without_a_cursor_a_stream_is_live_only(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    await env.http.post(url, json={"content": "one"}, headers=H)
    await env.idle(agent["id"])
    head = (await env.http.get(f"/v1/agents/{agent['id']}", headers=H)).json()["event_seq"]
    async with raw_stream(base, f"/v1/agents/{agent['id']}/events", H) as lines:
        await env.http.post(url, json={"content": "two"}, headers=H)
        got = []
        async for event_id, kind, _ in parse_sse(lines):
            got.append((event_id, kind))
            if kind == "settled":
                break
    assert got[0] == (str(head + 1), "activated")  # nothing from before the stream opened


async def test_H5_a_cursor_outside_the_retained_events_gets_reset(make_env: Any) -> None:
    env = await make_env(plugin=ServerPlugin(prune_interval=None, retention_seconds=0, retention_events=2))
    base = await env.live()
    agent = await env.agent()
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "one"}, headers=H)
    await env.idle(agent["id"])
    head = (await env.http.get(f"/v1/agents/{agent['id']}", headers=H)).json()["event_seq"]
    assert await env.plugin.prune() == head - 2
    for cursor in ("1", str(head + 5)):
        async with raw_stream(
            base, f"/v1/agents/{agent['id']}/events", {**H, "Last-Event-ID": cursor}
        ) as lines:
            event_id, kind, data = await anext(parse_sse(lines))
        assert (event_id, kind) == (str(head), "reset")
        assert json.loads(data) == {
            "type": "reset",
            "agent_id": agent["id"],
            "after": int(cursor),
            "head": head,
            "oldest": head - 1,
        }
    # a cursor inside what is retained replays normally
    async with raw_stream(base, f"/v1/agents/{agent['id']}/events?after={head - 2}", H) as lines:
        got = [(i, k) async for i, k, _ in _take(parse_sse(lines), 2)]
    assert [k for _, k in got][-1] == "settled" and got[0][0] == str(head - 1)


async def _take(items: AsyncIterator[Any], n: int) -> AsyncIterator[Any]:
    async for item in items:
        yield item
        n -= 1
        if n == 0:
            return


async def test_H6_a_reconnect_mid_block_gets_block_reset_then_the_whole_block(env: Env) -> None:
    env.model.mid = asyncio.Event()
    env.model.holds[0] = asyncio.Event()  # deltas are live only: the answer starts once we listen
    base = await env.live()
    agent = await env.agent()
    accepted = (
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=H)
    ).json()
    async with env.client(base) as client:
        seen: list[ServerEvent] = []
        async for ev in client.events(
            agent["id"], after=accepted["events_after"], deltas=True, reconnect=False
        ):
            seen.append(ev)
            if ev.event == "activated":
                env.model.holds[0].set()  # the stream is subscribed (it replayed `activated`)
            if ev.event == "text_delta":
                break  # dropped mid-block: the client saw part of the text
        assert seen[-1].id is not None and seen[-1].id.endswith(".1")
        env.model.mid.set()
        await env.idle(agent["id"])
        after: list[ServerEvent] = []
        async for ev in client.events(agent["id"], last_event_id=seen[-1].id, deltas=True, reconnect=False):
            after.append(ev)
            if ev.event == "settled":
                break
    assert after[0].event == "block_reset"
    ends = [ev for ev in after if ev.event == "block_end"]
    assert [e.data["block"] for e in ends] == [{"type": "text", "text": env.model.text}]
    assert not any(ev.event == "text_delta" for ev in after)  # deltas are never replayed
    async with env.system.store.transaction() as tx:
        kinds = {r[0] for r in await tx.fetch("SELECT type FROM stead_events")}
    assert "text_delta" not in kinds and "block_reset" not in kinds


async def test_H6_deltas_are_opt_in(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    path = f"/v1/agents/{agent['id']}/events"
    async with raw_stream(base, path, H) as plain, raw_stream(base, path + "?deltas=true", H) as with_deltas:
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=H)
        kinds_plain = [k async for _, k, _ in _until_settled(parse_sse(plain))]
        kinds_deltas = [k async for _, k, _ in _until_settled(parse_sse(with_deltas))]
    assert "text_delta" not in kinds_plain
    assert kinds_deltas.count("text_delta") == -(-len(env.model.text) // env.model.chunk)
    assert [k for k in kinds_deltas if k != "text_delta"] == kinds_plain


async def _until_settled(items: AsyncIterator[tuple[str | None, str, str]]) -> AsyncIterator[Any]:
    async for item in items:
        yield item
        if item[1] == "settled":
            return


async def test_H10_a_silent_stream_sends_ping_comments(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    async with raw_stream(base, f"/v1/agents/{agent['id']}/events", H) as lines:
        line = await anext(lines)
        while not line:
            line = await anext(lines)
    assert line == ": ping"


def test_H10_a_subscriber_past_its_bound_gets_overflow_instead_of_growing() -> None:
    hub = Hub(max_queue=2)
    slow = hub.subscribe("a")
    fast = hub.subscribe("a")
    for seq in (1, 2):
        hub.publish(StoredEvent("a", seq, None, "usage", "{}"))
    assert fast.queue.get_nowait().seq == 1  # type: ignore[union-attr]
    hub.publish(StoredEvent("a", 3, None, "usage", "{}"))
    assert slow.queue.qsize() == 1 and slow.queue.get_nowait() is OVERFLOW
    assert [fast.queue.get_nowait().seq for _ in range(2)] == [2, 3]  # type: ignore[union-attr]


async def test_H10_an_overflowed_stream_ends_and_the_client_resumes_by_id(make_env: Any) -> None:
    env = await make_env(plugin=ServerPlugin(prune_interval=None, max_queue=2))
    env.model.calls = 2
    base = await env.live()
    agent = await env.agent(tools=["add"])
    async with raw_stream(base, f"/v1/agents/{agent['id']}/events", H) as lines:
        await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=H)
        tail = [line async for line in lines]  # the service ends the stream
    assert ": this stream fell too far behind; reconnect with Last-Event-ID" in tail
    await env.idle(agent["id"])
    async with env.client(base) as client:
        got = []
        async for ev in client.events(agent["id"], after=0):  # resumes by id after each overflow
            got.append(ev.seq)
            if ev.event == "settled":
                break
    assert got == list(range(1, len(got) + 1))


async def test_H10_shutdown_ends_every_stream(env: Env) -> None:
    from stead.server._run import start, stop

    server, task = await start(env.app, port=0, timeout_graceful_shutdown=600)
    base = f"http://127.0.0.1:{server.bound_port}"
    agent = await env.agent()

    opened = [asyncio.Event() for _ in range(3)]

    async def follow(i: int) -> list[str]:
        async with raw_stream(base, f"/v1/agents/{agent['id']}/events", H) as lines:
            opened[i].set()
            return [line async for line in lines]

    readers = [asyncio.get_running_loop().create_task(follow(i)) for i in range(3)]
    for o in opened:
        await o.wait()
    assert env.plugin.hub.subscribers(agent["id"]) == 3
    await asyncio.wait_for(stop(server, task), 60)  # would wait out the 600 s grace if a stream stayed open
    for reader in readers:
        lines = await asyncio.wait_for(reader, 10)  # each stream ended
        assert not any(line.startswith("event:") for line in lines)
    assert env.plugin.hub.subscribers() == 0


async def test_H10_deleting_an_agent_ends_its_streams(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    async with raw_stream(base, f"/v1/agents/{agent['id']}/events", H) as lines:
        assert (await env.http.delete(f"/v1/agents/{agent['id']}", headers=H)).status_code == 204
        rest = [line async for line in lines]
    assert "event" not in "".join(rest)


async def test_a_run_stream_replays_that_run_and_ends_with_done(env: Env) -> None:
    base = await env.live()
    agent = await env.agent()
    url = f"/v1/agents/{agent['id']}/messages"
    for text in ("one", "two"):
        await env.http.post(url, json={"content": text}, headers=H)
        await env.idle(agent["id"])
    runs = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=H)).json()["items"]
    first = runs[-1]["id"]  # newest first: the last is the first run
    async with env.client(base) as client:
        got = [ev async for ev in client.run_events(first)]
    assert got[-1].event == "done" and got[-1].data == {"type": "done", "run_id": first}
    assert {ev.data["run_id"] for ev in got[:-1]} == {first}
    assert [ev.event for ev in got[:2]] == ["activated", "message_consumed"]
    assert got[1].data["message"]["text"] == "one"


async def test_a_live_run_stream_follows_the_run_to_its_end(env: Env) -> None:
    env.model.holds[0] = asyncio.Event()
    base = await env.live()
    agent = await env.agent()
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=H)
    (run,) = (await env.http.get("/v1/runs", params={"agent_id": agent["id"]}, headers=H)).json()["items"]
    assert run["status"] == "running"
    async with env.client(base) as client:
        events = client.run_events(run["id"])
        first = await anext(events)
        assert first.event == "activated"
        env.model.holds[0].set()
        rest = [ev async for ev in events]
    assert rest[-1].event == "done" and rest[-2].event == "settled"


@pytest.mark.parametrize("header", ["x", "1.2.3", "-4"])
async def test_a_malformed_last_event_id_is_422(env: Env, header: str) -> None:
    agent = await env.agent()
    r = await env.http.get(f"/v1/agents/{agent['id']}/events", headers={**H, "Last-Event-ID": header})
    assert r.status_code == 422 and r.json()["code"] == "invalid_cursor"
