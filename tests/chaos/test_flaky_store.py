"""Flaky-store chaos (transient store failures while the process lives) and its regression tests.

`run_flaky_seed` drives the chaos workload in-process over `Faults(flaky=p)`; the invariants are those of the
kill harness plus: memory equals what a reload rebuilds, and a refused acceptance leaves no trace.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import stead
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider
from tests.chaos import harness as H

FLAKY_SEEDS = range(8)


class FailOnce(stead.store.Faults):
    """Once armed, fail the next operation named `ops[0]`, then the next named `ops[1]`, ... transiently
    (a targeted flaky store)."""

    def __init__(self, *ops: str) -> None:
        super().__init__()
        self.todo = list(ops)
        self.armed = False

    def check(self, op: str) -> None:
        super().check(op)
        if self.armed and op == self.todo[0]:
            self.todo.pop(0)
            self.armed = bool(self.todo)
            raise stead.StoreError(f"transient store failure (injected) at {op}")


async def test_group_commit_release_failure_refuses_only_that_sender(db_url: str) -> None:
    """Found by the flaky chaos run: when the savepoint of one sender in a group commit failed at its
    RELEASE, that sender was told its message was refused while the message committed anyway, and the
    outcomes of the others shifted by one (a ValueError in the flush task, senders answered wrongly).
    The failing group commit makes the group retry with one savepoint per sender; its first RELEASE fails."""
    faults = FailOnce("commit", "release")
    url = db_url
    system = await stead.open(
        url, providers={"scripted": ScriptedProvider(lambda r: [stead.Text("ok")])}, faults=faults
    )
    async with system:
        a = await system.create(provider="scripted", model="m", agent_id="agenta")
        b = await system.create(provider="scripted", model="m", agent_id="agentb")
        faults.armed = True
        ra, rb = await asyncio.wait_for(
            asyncio.gather(a.send("one", id="msga"), b.send("two", id="msgb"), return_exceptions=True), 5
        )
        assert isinstance(ra, stead.StoreError), ra  # the first savepoint failed at RELEASE
        assert isinstance(rb, stead.Acceptance) and rb.created
        await a.wait_idle(timeout=5)
        await b.wait_idle(timeout=5)
        async with system.store.transaction() as tx:
            trace = [k for k, _ in await tx.read_prefix("agenta", "") if k.startswith(("msg.", "q.", "pend"))]
        assert trace == []  # A2: a failed acceptance leaves no trace
        assert [m.id for m in await a.history()] == []
        assert [m.id for m in await b.history() if m.role == "user"] == ["msgb"]


@pytest.mark.parametrize("seed", FLAKY_SEEDS)
async def test_flaky_store_seed(seed: int, tmp_path: Path) -> None:
    result = await H.run_flaky_seed(seed, tmp_path)
    assert result.ok, "\n".join([*result.violations, "replay: " + H.replay_command(seed, flaky=True)])
    assert result.stats["requests_checked"] > 0  # the request checker saw this seed's provider requests


async def test_abort_while_the_loop_waits_to_retry_a_store_error(db_url: str) -> None:
    """Found by the flaky chaos run: an abort that arrived while the loop slept before retrying a stage
    after a transient store error escaped the loop's abort handling: `abort()` returned, nothing settled,
    the pending record stayed and the agent was stranded (never idle, later aborts ignored)."""
    faults = FailOnce("read_prefix")  # acceptance never reads a prefix; the loop's first stage does
    url = db_url
    system = await stead.open(
        url, providers={"scripted": ScriptedProvider(lambda r: [stead.Text("ok")])}, faults=faults
    )
    async with system:
        system._env.store_retry_delay = 0.5
        agent = await system.create(provider="scripted", model="m", agent_id="agenta")
        faults.armed = True
        await agent.send("hello", id="msga")
        await asyncio.sleep(0.05)  # the loop's first stage failed; it sleeps before retrying
        assert not faults.armed
        await asyncio.wait_for(agent.abort(), 5)
        assert not agent.active  # X1: the aborted agent settled
        await agent.wait_idle(timeout=2)
        async with system.store.transaction() as tx:
            assert await tx.get(agent.id, "pending") is None
            queued = [k for k, _ in await tx.read_prefix(agent.id, "q.")]
        assert len(queued) == 1  # X1: already-queued messages stay queued


async def test_abort_before_the_loop_task_first_ran(db_url: str) -> None:
    """Found by the chaos run: an abort that cancelled the agent's loop task before its first step (work
    was just accepted, the task was created but not yet scheduled) left a dead task in place of the loop:
    the abort settled nothing, the agent stayed active forever, and no later message could restart it."""
    url = db_url
    system = await stead.open(url, providers={"scripted": ScriptedProvider(lambda r: [stead.Text("ok")])})
    async with system:
        agent = await system.create(provider="scripted", model="m", agent_id="agenta")
        aborts: list[asyncio.Future[None]] = []
        async with system.store.transaction() as tx:
            # runs right before the acceptance publishes (and creates the loop task): the abort task is
            # scheduled ahead of the loop task's first step
            tx.after_commit(lambda: aborts.append(asyncio.ensure_future(agent.abort())))
            await agent.send("hello", id="msga")
        await asyncio.wait_for(aborts[0], 5)
        await agent.wait_idle(timeout=2)
        assert not agent.active  # X1: the aborted agent settled; the message stays queued
        await agent.send("again", id="msgb")
        await agent.wait_idle(timeout=2)
        assert [m.id for m in await agent.history() if m.role == "user"] == ["msga", "msgb"]


class _Recorder(stead.Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, object]] = []

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        self.events.append(("activated", ctx.run_id, ctx.restored))

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.events.append(("settled", ctx.run_id, info.error))


async def test_a_restored_period_aborted_before_its_first_stage(db_url: str) -> None:
    """Found by the kill chaos run (X3): an agent restored after a restart and aborted before its first
    stage ran kept its "restored" flag, so the next, fresh active period announced `restored=True`."""
    from stead.core.records import Pending

    url = db_url
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with await stead.open(url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m", agent_id="agenta")
        async with system.store.transaction() as tx:  # the state a killed process leaves: work owed
            await tx.write(agent.id, "pending", Pending("inference", "runbeforekill").encode())
    hooks = _Recorder()
    async with await stead.open(url, providers={"scripted": provider}, hooks=hooks) as system:
        agent = await system.get("agenta")
        async with system.store.transaction() as tx:
            await tx.get(agent.id, "pending")  # hold the store: the restored first stage waits for it
            await asyncio.sleep(0.02)
            aborting = asyncio.ensure_future(agent.abort())  # cancels that first stage before it commits
            await asyncio.sleep(0.02)
        await asyncio.wait_for(aborting, 5)
        await agent.wait_idle(timeout=2)
        assert not agent.active
        await agent.send("hello", id="msga")
        await agent.wait_idle(timeout=2)
    fresh = [e for e in hooks.events if e[0] == "activated" and e[1] != "runbeforekill"]
    assert len(fresh) == 1 and fresh[0][2] is False, hooks.events  # a new period is not a restart
    assert next(e for e in hooks.events if e[0] == "settled")[1:] == ("runbeforekill", "aborted")


async def test_an_abort_before_history_was_loaded_keeps_the_mirror_whole(db_url: str) -> None:
    """Found by the kill chaos run: an agent whose history was not loaded yet in this process (it was
    idle at open) and whose first turn was aborted before it loaded anything published the abort's records
    into an empty mirror; later turns then sent the provider a conversation without its past (memory no
    longer equal to what a reload rebuilds, R4)."""
    url = db_url
    provider = ScriptedProvider(lambda r: [stead.Text(f"answer {len(r.messages)}")])
    async with await stead.open(url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", model="m", agent_id="agenta")
        await agent.send("first", id="msga")
        await agent.wait_idle(timeout=2)
    async with await stead.open(url, providers={"scripted": provider}) as system:
        agent = await system.get("agenta")
        aborts: list[asyncio.Future[None]] = []
        async with system.store.transaction() as tx:
            tx.after_commit(lambda: aborts.append(asyncio.ensure_future(agent.abort())))
            await agent.send("second", id="msgb")
        await asyncio.wait_for(aborts[0], 5)
        await agent.send("third", id="msgc")
        await agent.wait_idle(timeout=2)
        stored = await agent.history()
        assert agent._rt.messages() == stored
        assert [m.id for m in stored if m.role == "user"] == ["msga", "msgb", "msgc"]
        assert provider.requests[-1].messages[:2] == stored[:2]  # the provider saw the whole past
