"""Crash-point tests: the process dies between any two store operations of a tool conversation.

A scripted conversation makes 5 tool calls in 3 responses (two batches of two, one single call), mixing
a `durable` tool, a default (at-most-once) tool and a `transactional` one. A clean run counts the store
operations N; then for every i in 0..N the store is killed at its i-th operation (`Faults(crash_at=i)`,
which rolls back the open transaction and releases file and lock like a dead process), the in-memory
system is abandoned, and a fresh system on the same file finishes the work.
Invariants after every crash point:

- the user message appears exactly once in history;
- every tool call has exactly one result, and the conversation is complete (5 calls, final answer);
- a call whose result committed before the crash never runs again;
- a default (non-durable) call runs at most once; a durable call keeps its call id and its
  call-bound `get_or_create` key across re-executions; a transactional call's effect commits exactly once;
- the agent ends settled (not active, no `pending` key), and the activation / settlement hooks fired
  exactly once for the active period (restarts announce `restored=True` for the same run).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.core.fleet import FleetConfig
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider
from tests.conftest import tool_results_since_last_user, url_of
from tests.fakes.crash_points import KVLedger, measured_once, parametrize_crash_at, run_until_crash
from tests.fakes.postgres import raw_rows

AGENT_ID = "crashagent0001"
MESSAGE_ID = "crashmessage0001"

# side effects: call id -> number of executions (what the outside world would have seen)
executions: Counter[str] = Counter()
# durable calls: call id -> idempotency keys seen across executions
durable_keys: dict[str, set[str]] = {}
_key_seq = [0]


def _next_key() -> str:
    _key_seq[0] += 1
    return f"op-{_key_seq[0]}"


@stead.tool(durable=True)
async def durable_op(n: int, ctx: stead.ToolContext) -> str:
    "An effect that is safe to repeat (it carries a retry-stable idempotency key)."
    key = await ctx.kv.get_or_create("idem", _next_key)
    executions[ctx.call_id] += 1
    durable_keys.setdefault(ctx.call_id, set()).add(key)
    return f"durable {n} done ({key})"


@stead.tool
async def plain_op(n: int, ctx: stead.ToolContext) -> str:
    "An effect that must happen at most once."
    executions[ctx.call_id] += 1
    return f"plain {n} done"


@stead.tool(transactional=True)
async def tx_op(n: int, ctx: stead.ToolContext) -> str:
    "An effect written in the transaction that commits the result: exactly once."
    tx = ctx.tx
    assert tx is not None
    raw = await tx.get(ctx.agent_id, "kv.a.tx_effects")
    await tx.write(ctx.agent_id, "kv.a.tx_effects", json.dumps([*json.loads(raw or "[]"), ctx.call_id]))
    return f"tx {n} done"


# response plan by number of tool results so far: 0 -> 2 calls, 2 -> 1 call, 3 -> 2 calls, 5 -> text
PLAN: dict[int, list[str]] = {0: ["durable_op", "plain_op"], 2: ["tx_op"], 3: ["plain_op", "durable_op"]}
TOTAL_CALLS = 5


def respond(request: stead.ProviderRequest) -> list[stead.Block]:
    n = tool_results_since_last_user(request)
    names = PLAN.get(n)
    if names is None:
        return [stead.Text(f"finished after {n} results")]
    return [stead.ToolCall(name, {"n": n + j}) for j, name in enumerate(names)]


class Ledger(KVLedger):
    """Writes activation / settlement events durably, in the transaction that describes them."""

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        await self._log(ctx, ["activated", ctx.run_id, ctx.restored])

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        await self._log(ctx, ["settled", ctx.run_id, info.error])


# On PostgreSQL the process is a worker: its timers (poll, sweep, heartbeat) would add store operations at
# moments that depend on the machine's speed; the crash points are the conversation's, so they stay quiet.
_QUIET_FLEET = FleetConfig(lease_ttl=7200.0, heartbeat=3600.0, sweep=3600.0, poll=3600.0, listen=False)


async def _open(url: str, faults: stead.store.Faults | None = None) -> stead.AgentSystem:
    extra: dict[str, Any] = {"fleet": _QUIET_FLEET} if url.startswith("postgresql") else {}
    return await stead.open(
        url,
        **extra,
        providers={"scripted": ScriptedProvider(respond)},
        tools=[durable_op, plain_op, tx_op],
        hooks=Ledger(),
        faults=faults,
    )


async def _prepare(url: str) -> None:
    async with await _open(url) as system:
        await system.create(
            provider="scripted", model="m", tools=["durable_op", "plain_op", "tx_op"], agent_id=AGENT_ID
        )


def _committed_results(db: Path | str) -> set[str]:
    """Read the database directly (as a new process would) for the call ids whose result is durable."""
    rows = raw_rows(db, "SELECT record FROM history WHERE agent_id=?", (AGENT_ID,))
    return {rec["b"]["i"] for rec in (json.loads(r[0]) for r in rows) if rec["k"] == "t"}


async def _run_once(url: str, faults: stead.store.Faults) -> bool:
    """Open with `faults`, send the message and run until idle or crash. Returns whether it was accepted."""
    accepted = False

    async def act(system: stead.AgentSystem) -> None:
        nonlocal accepted
        agent = await system.get(AGENT_ID)
        await agent.send("do five things", id=MESSAGE_ID)
        accepted = True
        await agent.wait_idle(timeout=10)

    await run_until_crash(_open(url, faults), faults, act)
    return accepted


async def _count_ops(tmp_path: Path) -> int:
    url = url_of(tmp_path / "count.db")
    await _prepare(url)
    faults = stead.store.Faults()
    assert await _run_once(url, faults)
    assert not faults.crashed
    return faults.ops


_clean_run_op_count = measured_once(_count_ops, "stead-count-")
"""N, the store operations of one clean run of the conversation (measured once per session)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per crash point 0..N: measured at collection, so every id is a real crash point."""
    parametrize_crash_at(metafunc, lambda: range(_clean_run_op_count() + 1))


@pytest.fixture
def op_count() -> int:
    return _clean_run_op_count()


def test_the_conversation_exercises_the_store(op_count: int) -> None:
    assert op_count > 40, f"the clean run used only {op_count} store operations"


@pytest.fixture
def crash_db(tmp_path: Path, store_kind: str, request: pytest.FixtureRequest) -> tuple[str, Path | str]:
    """(store URL, what `raw_rows` reads) of a fresh database of each store kind."""
    if store_kind == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        return url, url
    db = tmp_path / "crash.db"
    return url_of(db), db


async def test_crash_at_every_store_operation(
    crash_at: int, op_count: int, crash_db: tuple[str, Path | str]
) -> None:
    await _crash_and_finish(crash_db, [crash_at], expect_crash=crash_at < op_count)


# a second crash during the recovery run (pairs drawn once from a fixed seed)
_PAIRS = sorted({(r.randrange(0, 80), r.randrange(0, 80)) for r in [random.Random(7)] for _ in range(40)})


@pytest.mark.parametrize("first,second", _PAIRS, ids=lambda v: f"op{v:03d}")
async def test_crash_twice(first: int, second: int, op_count: int, crash_db: tuple[str, Path | str]) -> None:
    await _crash_and_finish(crash_db, [first, second], expect_crash=None)


async def _crash_and_finish(
    crash_db: tuple[str, Path | str], crash_points: list[int], expect_crash: bool | None
) -> None:
    executions.clear()
    durable_keys.clear()
    url, db = crash_db
    await _prepare(url)

    snapshots: list[tuple[set[str], Counter[str]]] = []
    accepted = False
    for point in crash_points:
        faults = stead.store.Faults(crash_at=point)
        accepted = await _run_once(url, faults) or accepted
        if expect_crash is not None:
            assert faults.crashed == expect_crash
        snapshots.append((_committed_results(db), Counter(executions)))

    # a new process takes over the file
    async with await _open(url) as system:
        agent = await system.get(AGENT_ID)
        again = await agent.send("do five things", id=MESSAGE_ID)
        assert again.created == (not accepted)
        await agent.wait_idle(timeout=10)
        assert not agent.active
        history = await agent.history()
        async with system.store.transaction() as tx:
            pending = await tx.get(AGENT_ID, "pending")
            ledger = json.loads(await tx.get(AGENT_ID, "kv.a.ledger") or "[]")
            tx_effects = json.loads(await tx.get(AGENT_ID, "kv.a.tx_effects") or "[]")
            leftovers = [
                k for k, _ in await tx.read_prefix(AGENT_ID, "") if k.startswith(("tool.", "q.", "kv.c."))
            ]

    assert pending is None
    assert leftovers == []
    # the user message exactly once
    users = [m for m in history if m.role == "user"]
    assert [m.id for m in users] == [MESSAGE_ID]
    # every call exactly one result; the conversation completed
    calls = [b for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    results = [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    assert len(calls) == TOTAL_CALLS
    assert len({c.id for c in calls}) == TOTAL_CALLS
    assert Counter(r.call_id for r in results) == Counter(c.id for c in calls)
    assert history[-1].role == "assistant" and history[-1].text == f"finished after {TOTAL_CALLS} results"
    by_id = {c.id: c for c in calls}
    # every execution belongs to a call of the final conversation (durable calls keep their id)
    assert set(executions) <= set(by_id)
    for call_id, count in executions.items():
        for committed_before, runs_before in snapshots:
            if call_id in committed_before:
                assert count == runs_before[call_id], f"call {call_id} ran again after its result committed"
        if by_id[call_id].name == "plain_op":
            assert count <= 1, f"non-durable call {call_id} ran {count} times"
        elif by_id[call_id].name == "durable_op":
            assert len(durable_keys[call_id]) == 1, "a durable call lost its call-bound idempotency key"
    # the transactional call's effect committed exactly once, with its result
    assert tx_effects == [c.id for c in calls if c.name == "tx_op"]
    # activation / settlement exactly once for the one active period
    activations = [e for e in ledger if e[0] == "activated" and not e[2]]
    restorations = [e for e in ledger if e[0] == "activated" and e[2]]
    settlements = [e for e in ledger if e[0] == "settled"]
    assert len(activations) == 1, ledger
    assert len(settlements) == 1, ledger
    run_id = activations[0][1]
    assert all(e[1] == run_id for e in restorations + settlements), ledger
    assert len(restorations) <= len(crash_points), ledger  # at most one announcement per restart
