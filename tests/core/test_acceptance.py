"""Acceptance promises A1–A7 (docs/promises.md): a message is accepted exactly once or not at all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import stead
from stead._ids import new_id
from stead.core.records import Queued
from stead.errors import StoreCrashed, StoreError
from stead.providers.scripted import ScriptedProvider
from stead.store import Faults
from tests.fakes.postgres import raw_rows

TIMEOUT = 5.0


class FailOnce(Faults):
    """A transient store failure at exactly one operation index (the store stays alive)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_at: int | None = None

    def check(self, op: str) -> None:
        n = self.ops
        super().check(op)
        if self.fail_at is not None and n == self.fail_at:
            self.fail_at = None
            raise StoreError(f"injected transient failure at {op}")


class Gate:
    """A responder that blocks every request until released, recording what it was asked."""

    def __init__(self, answer: Callable[[stead.ProviderRequest], list[stead.Block]] | None = None) -> None:
        self.requests: list[stead.ProviderRequest] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.answer = answer or (lambda r: [stead.Text("ok")])

    async def __call__(self, request: stead.ProviderRequest) -> list[stead.Block]:
        self.requests.append(request)
        self.started.set()
        await asyncio.wait_for(self.release.wait(), TIMEOUT)  # a safety net: a failing test never hangs
        return self.answer(request)


class Recorder(stead.Hooks):
    def __init__(self) -> None:
        self.events: list[stead.Event] = []
        self.activations: list[stead.HookContext] = []

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        self.activations.append(ctx)

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        self.events.append(event)


async def kv(system: stead.AgentSystem, agent_id: str, prefix: str = "") -> dict[str, str]:
    async with system.store.transaction() as tx:
        return dict(await tx.read_prefix(agent_id, prefix))


async def records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    async with system.store.transaction() as tx:
        return [json.loads(r) for r in await tx.load(agent_id)]


def echo(request: stead.ProviderRequest) -> list[stead.Block]:
    return [stead.Text(f"echo {request.messages[-1].text}")]


async def open_system(url: str, respond: Any = echo, **kw: Any) -> tuple[stead.AgentSystem, ScriptedProvider]:
    provider = ScriptedProvider(respond)
    system = await stead.open(url, providers={"scripted": provider}, **kw)
    return system, provider


@asynccontextmanager
async def new_agent(
    url: str, respond: Any = echo, **kw: Any
) -> AsyncIterator[tuple[stead.AgentSystem, stead.Agent, ScriptedProvider]]:
    """An open system (`open_system`'s) and a new agent on its scripted model."""
    system, provider = await open_system(url, respond, **kw)
    async with system:
        yield system, await system.create(provider="scripted"), provider


# ---------------------------------------------------------------------------------------------- A1
async def test_A1_batch_of_messages_commits_in_one_transaction(db_url: str) -> None:
    gate = Gate()
    async with new_agent(db_url, gate) as (system, agent, _):
        before = system.store.commits  # type: ignore[attr-defined]
        accs = await agent.deliver(
            [stead.Input("one"), stead.Input("two"), stead.Input("three", delivery="steer")]
        )
        assert system.store.commits - before == 1  # type: ignore[attr-defined]
        assert [a.created for a in accs] == [True, True, True]
        assert [a.delivery for a in accs] == ["send", "send", "steer"]
        stored = await kv(system, agent.id, "msg.")
        assert set(stored) == {f"msg.{a.id}" for a in accs}
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        users = [m.text for m in await agent.history() if m.role == "user"]
        assert sorted(users) == ["one", "three", "two"]


async def test_A1_batch_is_all_or_nothing_under_a_failure_at_any_operation(db_url: str) -> None:
    faults = FailOnce()
    gate = Gate()  # keeps the probe's run from using the store concurrently
    system, _ = await open_system(db_url, gate, faults=faults)
    async with system:
        probe = await system.create(provider="scripted")
        agent = await system.create(provider="scripted")
        await probe.send("keeps the store busy")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        batch = [stead.Input("a"), stead.Input("b"), stead.Input("c", delivery="steer")]
        for k in range(100):  # a failure at each operation of the delivery in turn, until none is left
            faults.fail_at = faults.ops + k
            try:
                accs = await agent.deliver(batch)
            except StoreError:
                assert await kv(system, agent.id) == {}, f"a failure at operation {k} left a trace"
                assert not agent.active
                continue
            faults.fail_at = None
            break
        assert k > 5
        stored = await kv(system, agent.id, "msg.")
        assert set(stored) == {f"msg.{a.id}" for a in accs}
        assert len(await kv(system, agent.id, "q.")) == 3
        gate.release.set()
        await agent.wait_idle(TIMEOUT)


async def test_A1_concurrent_sends_of_one_id_are_accepted_exactly_once(db_url: str) -> None:
    async with new_agent(db_url) as (_, agent, provider):
        mid = new_id()
        accs = await asyncio.gather(*(agent.send("hello", id=mid) for _ in range(10)))
        assert sum(a.created for a in accs) == 1
        assert all(a.id == mid for a in accs)
        await agent.wait_idle(TIMEOUT)
        history = await agent.history()
        assert [m.id for m in history if m.role == "user"] == [mid]
        assert len(provider.requests) == 1


# ---------------------------------------------------------------------------------------------- A2
async def test_A2_send_returns_only_after_the_durable_write(db_url: str, db_target: Path | str) -> None:
    gate = Gate()
    async with new_agent(db_url, gate) as (_, agent, _):
        acc = await agent.send("durable?")
        # a separate connection sees the committed acceptance: it is on disk, not only in memory
        keys = {r[0] for r in raw_rows(db_target, "SELECT key FROM kv WHERE agent_id=?", (agent.id,))}
        assert f"msg.{acc.id}" in keys
        assert "pending" in keys
        assert any(k.startswith("q.send.") for k in keys)
        gate.release.set()
        await agent.wait_idle(TIMEOUT)


async def test_A2_failed_write_raises_and_leaves_no_trace(db_url: str) -> None:
    faults = FailOnce()
    rec = Recorder()
    gate = Gate(echo)
    system, _ = await open_system(db_url, gate, faults=faults, hooks=rec)
    async with system:
        probe = await system.create(provider="scripted")
        agent = await system.create(provider="scripted")
        await probe.send("probe")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        failures = 0
        for deliver in (agent.steer, agent.send):
            for k in range(100):
                faults.fail_at = faults.ops + k
                try:
                    await deliver("refused")
                except StoreError:
                    failures += 1
                    assert await kv(system, agent.id) == {}
                    assert await records(system, agent.id) == []
                    assert not agent.active
                    continue
                faults.fail_at = None
                break
            if deliver == agent.steer:
                # the steer went through: remove it again to test send from a clean slate
                assert agent.active
                gate.release.set()
                await agent.wait_idle(TIMEOUT)
                async with system.store.transaction() as tx:
                    await tx.delete_prefix(agent.id, "")
                    await tx.clear(agent.id)
                gate.release.clear()
        assert failures > 10
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert [m.text for m in await agent.history()] == ["refused", "echo refused"]


async def test_A2_crash_during_send_raises_and_leaves_no_trace_after_restart(db_url: str) -> None:
    async with new_agent(db_url) as (system, agent, _):
        aid = agent.id
    for k in range(50):  # crash at each operation of the send in turn
        faults = Faults()
        system, _ = await open_system(db_url, faults=faults)
        agent = await system.get(aid)
        faults.crash_at = faults.ops + k
        try:
            await agent.send("lost")
        except StoreCrashed:
            system.abandon()
        else:
            faults.crash_at = None
            await system.close()
            break
        system, provider = await open_system(db_url)
        async with system:
            assert await kv(system, aid) == {}, f"a crash at operation {k} left a trace"
            assert system.restored == []
            assert provider.requests == []
    assert k > 3


# ---------------------------------------------------------------------------------------------- A3
async def test_A3_repeated_id_returns_created_false_and_queues_nothing(db_url: str) -> None:
    async with new_agent(db_url) as (system, agent, provider):
        mid = new_id()
        first = await agent.send("hello", id=mid)
        assert first.created and first.id == mid
        await agent.wait_idle(TIMEOUT)
        history = await agent.history()
        again = await agent.send("hello again", id=mid)
        assert again == stead.Acceptance(mid, "send", False)
        steered = await agent.steer("as steering", id=mid)
        assert not steered.created
        await agent.wait_idle(TIMEOUT)
        assert not agent.active
        assert await agent.history() == history
        assert len(provider.requests) == 1
        assert await kv(system, agent.id, "q.") == {}
        assert len(await kv(system, agent.id, "msg.")) == 1


async def test_A3_repeated_id_while_still_queued_is_not_queued_twice(db_url: str) -> None:
    gate = Gate()
    async with new_agent(db_url, gate) as (system, agent, _):
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        mid = new_id()
        assert (await agent.send("second", id=mid)).created
        assert not (await agent.send("second", id=mid)).created
        # "first" is still queued: its consumption commits with the response's first durable write
        assert len(await kv(system, agent.id, "q.")) == 2
        assert len(await kv(system, agent.id, "msg.")) == 2
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert [m.text for m in await agent.history() if m.role == "user"] == ["first", "second"]


async def test_A3_restart_keeps_the_identity(db_url: str) -> None:
    mid = new_id()
    async with new_agent(db_url) as (system, agent, _):
        aid = agent.id
        await agent.send("once", id=mid)
        await agent.wait_idle(TIMEOUT)
    system, provider = await open_system(db_url)
    async with system:
        agent = await system.get(aid)
        assert not (await agent.send("once", id=mid)).created
        await agent.wait_idle(TIMEOUT)
        assert provider.requests == []


async def test_A3_duplicate_ids_in_one_delivery_are_refused(db_url: str) -> None:
    async with new_agent(db_url) as (system, agent, _):
        mid = new_id()
        with pytest.raises(stead.InvalidInput):
            await agent.deliver([stead.Input("a", id=mid), stead.Input("b", id=mid)])
        assert await kv(system, agent.id) == {}


# ---------------------------------------------------------------------------------------------- A4
async def test_A4_activation_hook_runs_in_the_accepting_transaction(db_url: str) -> None:
    seen: list[tuple[str | None, dict[str, str]]] = []

    class H(stead.Hooks):
        async def activated_tx(self, ctx: stead.HookContext) -> None:
            assert ctx.tx is not None and not ctx.restored
            # the pending record and the queue entry are already written in this very transaction
            seen.append((ctx.run_id, dict(await ctx.tx.read_prefix(ctx.agent_id, ""))))
            await ctx.tx.write(ctx.agent_id, "kv.a.activated", ctx.run_id or "")

    gate = Gate()
    async with new_agent(db_url, gate, hooks=H()) as (system, agent, _):
        before = system.store.commits  # type: ignore[attr-defined]
        acc = await agent.send("go")
        assert system.store.commits - before == 1  # type: ignore[attr-defined]
        assert len(seen) == 1
        run_id, state = seen[0]
        assert "pending" in state and f"msg.{acc.id}" in state
        assert json.loads(state["pending"])["run"] == run_id
        assert (await kv(system, agent.id, "kv.a."))["kv.a.activated"] == run_id
        # a second message while active is no activation
        await agent.send("more")
        assert len(seen) == 1
        gate.release.set()
        await agent.wait_idle(TIMEOUT)


async def test_A4_failing_activation_hook_refuses_the_message(db_url: str) -> None:
    class Refuse(stead.Hooks):
        refuse = True

        async def activated_tx(self, ctx: stead.HookContext) -> None:
            assert ctx.tx is not None
            await ctx.tx.write(ctx.agent_id, "kv.a.side_effect", "1")
            if self.refuse:
                raise PermissionError("no new runs today")

    hooks = Refuse()
    rec = Recorder()
    async with new_agent(db_url, hooks=[hooks, rec]) as (system, agent, provider):
        with pytest.raises(PermissionError, match="no new runs"):
            await agent.send("refused")
        assert await kv(system, agent.id) == {}
        assert not agent.active
        assert not any(isinstance(e, stead.Activated) for e in rec.events)
        assert provider.requests == []
        hooks.refuse = False
        assert (await agent.send("accepted")).created
        await agent.wait_idle(TIMEOUT)
        assert [m.text for m in await agent.history() if m.role == "user"] == ["accepted"]


async def test_A4_failing_activation_refuses_only_its_own_message_in_a_group_commit(db_url: str) -> None:
    refused: set[str] = set()

    class Refuse(stead.Hooks):
        async def activated_tx(self, ctx: stead.HookContext) -> None:
            if ctx.agent_id in refused:
                raise PermissionError("refused")

    gate = Gate(echo)
    system, _ = await open_system(db_url, gate, hooks=Refuse())
    async with system:
        a = await system.create(provider="scripted")
        b = await system.create(provider="scripted")
        refused.add(a.id)
        before = system.store.commits  # type: ignore[attr-defined]
        ra, rb = await asyncio.gather(a.send("to a"), b.send("to b"), return_exceptions=True)
        assert isinstance(ra, PermissionError)
        assert isinstance(rb, stead.Acceptance) and rb.created
        assert system.store.commits - before == 1  # type: ignore[attr-defined]
        assert await kv(system, a.id) == {}
        assert not a.active
        gate.release.set()
        await b.wait_idle(TIMEOUT)
        assert [m.text for m in await b.history()] == ["to b", "echo to b"]


# ---------------------------------------------------------------------------------------------- A5
async def test_A5_agent_with_an_unconsumed_message_never_reports_settled(
    db_url: str, db_target: Path | str
) -> None:
    gate = Gate()
    observed: list[tuple[str, bool, bool]] = []

    def durable_pending(agent_id: str) -> bool:
        return bool(raw_rows(db_target, "SELECT 1 FROM kv WHERE agent_id=? AND key='pending'", (agent_id,)))

    holder: dict[str, stead.Agent] = {}

    class Watch(stead.Hooks):
        def on_event(self, agent_id: str, event: stead.Event) -> None:
            agent = holder["agent"]
            observed.append((event.type, agent.active, durable_pending(agent_id)))

    async with new_agent(db_url, gate, hooks=Watch()) as (_, agent, _):
        holder["agent"] = agent
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await agent.send("second")
        await agent.send("third")
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        types = [t for t, _, _ in observed]
        assert types.count("settled") == 1 and types[-1] == "settled"
        assert types.count("message_consumed") == 3
        # until the settlement, the agent reported itself active in memory ...
        for t, active, _ in observed[:-1]:
            assert active, t
        # ... and in the store, until the commit that consumed the last message also settled it
        last_commit = max(i for i, (t, _, _) in enumerate(observed) if t == "message_consumed")
        for t, _, durable in observed[:last_commit]:
            assert durable, t
        assert types[last_commit:] == ["message_consumed", "block_end", "done", "settled"]
        assert not agent.active
        assert [m.text for m in await agent.history() if m.role == "user"] == ["first", "second", "third"]


async def test_A5_wait_idle_does_not_return_while_a_message_is_queued(db_url: str) -> None:
    gate = Gate()
    async with new_agent(db_url, gate) as (system, agent, _):
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await agent.send("second")
        with pytest.raises(TimeoutError):
            await agent.wait_idle(0.05)
        assert agent.active
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        assert await kv(system, agent.id, "q.") == {}
        assert len(gate.requests) == 2


# ---------------------------------------------------------------------------------------------- A6
async def test_A6_accept_in_caller_transaction_then_rollback_leaves_no_live_effect(db_url: str) -> None:
    rec = Recorder()
    async with new_agent(db_url, hooks=rec) as (system, agent, provider):

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with system.store.transaction() as tx:
                acc = await agent.send("inside")
                assert acc.created
                assert (await tx.get(agent.id, "pending")) is not None  # visible inside the transaction
                assert not agent.active  # ... but not published
                raise Boom
        await asyncio.sleep(0)
        assert not agent.active
        assert await kv(system, agent.id) == {}
        assert await agent.history() == []
        assert provider.requests == []
        assert rec.events == []
        await agent.wait_idle(TIMEOUT)
        # the same id may be used again: nothing was recorded
        again = await agent.send("inside", id=acc.id)
        assert again.created
        await agent.wait_idle(TIMEOUT)
        assert len(provider.requests) == 1


async def test_A6_accept_in_caller_transaction_starts_the_run_only_after_commit(db_url: str) -> None:
    rec = Recorder()
    async with new_agent(db_url, hooks=rec) as (system, agent, provider):
        async with system.store.transaction() as tx:
            await agent.send("one")
            await agent.steer("two")
            await tx.write(agent.id, "kv.a.caller", "own write")
            for _ in range(3):
                await asyncio.sleep(0)  # give any wrongly started loop a chance to run
            assert not agent.active
            assert provider.requests == []
            assert rec.events == []
        assert agent.active
        assert [type(e) for e in rec.events] == [stead.Activated]
        await agent.wait_idle(TIMEOUT)
        assert len(provider.requests) == 2
        assert (await kv(system, agent.id, "kv.a."))["kv.a.caller"] == "own write"
        assert [m.text for m in await agent.history() if m.role == "user"] == ["two", "one"]


# ---------------------------------------------------------------------------------------------- A7
async def test_A7_payload_is_copied_at_admission(db_url: str) -> None:
    gate = Gate()
    async with new_agent(db_url, gate) as (system, agent, _):
        meta: dict[str, Any] = {"tags": ["a"], "n": 1}
        blocks: list[stead.Block] = [stead.Text("original")]
        task = asyncio.create_task(agent.send(blocks, metadata=meta))
        await asyncio.sleep(0)  # the send is admitted and waits for its group commit
        meta["tags"].append("mutated")
        meta["n"] = 2
        blocks.append(stead.Text(" appended"))
        acc = await task
        (raw,) = (await kv(system, agent.id, "q.send.")).values()
        stored = Queued.decode("q.send.x", raw)
        assert stored.metadata == {"tags": ["a"], "n": 1}
        assert stored.content == [{"t": "x", "x": "original"}]
        gate.release.set()
        await agent.wait_idle(TIMEOUT)
        (user,) = [m for m in await agent.history() if m.role == "user"]
        assert user.id == acc.id and user.text == "original" and user.metadata == {"tags": ["a"], "n": 1}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"content": "hi", "id": "not an id"}, stead.InvalidId),  # caller-chosen ids: [A-Za-z0-9._:@-]
        ({"content": "hi", "id": "a/b"}, stead.InvalidId),
        ({"content": "hi", "id": ""}, stead.InvalidId),
        ({"content": ""}, stead.InvalidInput),
        ({"content": "   \n"}, stead.InvalidInput),
        ({"content": []}, stead.InvalidInput),
        ({"content": [stead.Text(" ")]}, stead.InvalidInput),
        ({"content": [stead.ToolCall("x", {})]}, stead.InvalidInput),
        ({"content": [stead.ToolResult("c", "o")]}, stead.InvalidInput),
        ({"content": "x" * 5000}, stead.InvalidInput),
        ({"content": "hi", "metadata": {"x": "y" * 5000}}, stead.InvalidInput),
        ({"content": "hi", "metadata": {"x": object()}}, stead.InvalidInput),
        ({"content": "hi", "permission_mode": "root"}, stead.InvalidInput),
        ({"content": "hi", "provider": "nope"}, stead.ConfigurationError),
        ({"content": "hi", "role": "assistant"}, stead.InvalidInput),
    ],
)
async def test_A7_invalid_input_is_refused_before_any_write(
    db_url: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    async with new_agent(db_url, max_payload_bytes=4000) as (system, agent, provider):
        ops = system.store.ops
        kwargs = dict(kwargs)  # the parametrized dict is shared by the store parametrizations
        content = kwargs.pop("content")
        for deliver in (agent.send, agent.steer):
            with pytest.raises(error) as info:
                await deliver(content, **kwargs)
            assert str(info.value)  # a clear message
        with pytest.raises(error):
            await agent.deliver([stead.Input("fine"), stead.Input(content, **_as_input(kwargs))])
        assert system.store.ops == ops  # not even a read
        assert not agent.active
        assert provider.requests == []


def _as_input(kwargs: dict[str, Any]) -> dict[str, Any]:
    settings = {k: kwargs[k] for k in ("permission_mode", "provider") if k in kwargs}
    rest = {k: v for k, v in kwargs.items() if k not in settings}
    return {**rest, "settings": settings}


async def test_A7_oversize_message_names_the_limit(db_url: str) -> None:
    async with new_agent(db_url, max_payload_bytes=100) as (_, agent, _):
        with pytest.raises(stead.InvalidInput, match="100"):
            await agent.send("x" * 200)
        assert (await agent.send("x" * 20)).created
        await agent.wait_idle(TIMEOUT)


async def test_A7_calls_on_a_closed_agent_are_refused(db_url: str) -> None:
    system, provider = await open_system(db_url)
    agent = await system.create(provider="scripted")
    aid = agent.id
    await system.close()
    with pytest.raises(stead.Closed):
        await agent.send("too late")
    with pytest.raises(stead.Closed):
        await agent.steer("too late")
    with pytest.raises(stead.Closed):
        await agent.deliver([stead.Input("too late")])
    with pytest.raises(stead.Closed):
        await system.create(provider="scripted")
    system, provider = await open_system(db_url)
    async with system:
        assert await kv(system, aid) == {}
        assert provider.requests == []


async def test_A7_deleted_agent_refuses_calls(db_url: str) -> None:
    async with new_agent(db_url) as (system, agent, _):
        await system.delete(agent.id)
        with pytest.raises(stead.Closed):
            await agent.send("gone")
        with pytest.raises(stead.AgentNotFound):
            await system.get(agent.id)


# ------------------------------------------------------------------------ batched acceptance (issue 23)
async def test_A1_a_batch_is_accepted_in_a_fixed_number_of_round_trips(db_url: str) -> None:
    """40 messages of one delivery (to an agent that is already running) cost the same store round trips
    as 2 would: one claim statement for their ids, one for their queue entries, one read of the pending
    record — never a round trip per message; ids seen before are refused and the queue keeps their
    order."""
    gate = Gate()
    async with new_agent(db_url, gate) as (system, agent, _):
        await agent.send("first", id="first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)  # the run holds; the queue only grows
        ids = [new_id() for _ in range(40)]
        await agent.send("seen before", id=ids[7])
        stats = getattr(system.store, "stats", None)
        async with system.store.transaction():  # nothing else reaches the store meanwhile
            waits = dict(stats.waits) if stats is not None else {}
            accs = await agent.deliver([stead.Input(f"m{i}", mid) for i, mid in enumerate(ids)])
            after = dict(stats.waits) if stats is not None else {}
        assert [a.created for a in accs] == [i != 7 for i in range(40)]
        if stats is not None:  # PostgreSQL counts its round trips
            spent = {op: n - waits.get(op, 0) for op, n in after.items() if n != waits.get(op, 0)}
            assert spent == {"write_if_absent_many": 2, "get_many": 1}
        queued = [q.id for q in await agent.queued()]
        assert queued == ["first", ids[7], *(mid for i, mid in enumerate(ids) if i != 7)]
        gate.release.set()
        await agent.wait_idle(TIMEOUT)


async def test_A1_concurrent_senders_grouped_keep_every_promise(db_url: str) -> None:
    """Concurrent senders to several idle agents share commits: each message accepted once (a repeated
    id, in the group or before it, is refused), each agent activated once, and each agent's messages
    answered in the order they were sent."""
    recorder = Recorder()
    system, _ = await open_system(db_url, hooks=[recorder])
    async with system:
        agents = [await system.create(provider="scripted") for _ in range(4)]
        plan = [(agents[i % 4], f"m{i:02d}") for i in range(24)]
        await plan[0][0].send("early", id="m00")

        async def send(agent: stead.Agent, mid: str) -> stead.Acceptance:
            return await agent.send(f"text {mid}", id=mid)

        accs = await asyncio.gather(*(send(a, mid) for a, mid in plan), send(agents[1], "m01"))
        created = [a.created for a in accs]
        assert created[0] is False  # sent before the group
        assert created[1] != created[-1]  # m01 twice in the group: exactly one of them is accepted
        assert all(created[2:-1])
        for agent in agents:
            await agent.wait_idle(TIMEOUT)
        for n, agent in enumerate(agents):
            users = [m.id for m in await agent.history() if m.role == "user"]
            assert users == [f"m{i:02d}" for i in range(n, 24, 4)]
        # each activation starts one run that settles: an agent is never activated twice at once
        activated = [e.run_id for e in recorder.events if isinstance(e, stead.Activated)]
        settled = [e.run_id for e in recorder.events if isinstance(e, stead.Settled)]
        assert sorted(activated) == sorted(settled) and len(set(activated)) == len(activated)
        assert {ctx.agent_id for ctx in recorder.activations} == {a.id for a in agents}
