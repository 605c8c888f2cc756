"""Randomized chaos harness (docs/promises.md, docs/chaos.md): a seeded workload, real SIGKILLs,
invariants from the store.

One *seed* runs like this (`run_seed`):

1. A plan is derived from `random.Random(seed)`: the agents (queue modes, tool concurrency), how many
   incarnations are killed, and for each incarnation a workload of several concurrent driver tasks that
   send, steer and deliver messages (with repeated and invalid ids) and abort agents. Every message
   carries a small *script* that the scripted provider follows: parallel tool calls of every flavour
   (default, `durable`, `transactional`, and one with a `reconcile` hook), retryable and fatal provider
   errors, early stream ends and half-streamed blocks.
2. Each incarnation is a real worker process (`tests/chaos/worker.py`) on the same database file. The
   driver SIGKILLs it at a moment derived from the seed: after a random number of marker lines the
   worker printed, or after a random short delay (the delay only randomizes the kill moment). After every
   kill the driver reads the file directly and checks the crash-time invariants.
3. A final, unkilled incarnation sends one more message to every agent (so work left queued by an abort
   is consumed), waits until every agent is idle, and compares live memory with the store.
4. The driver checks the end-state invariants from the store alone (plus the fsynced side-effect log the
   tool bodies write, and the ledger the hooks write into the store) — see `check_final`.

Flaky-store mode (`run_flaky_seed`) runs one incarnation in-process with `Faults(flaky=p)` (transient
store failures while the process lives) and additionally checks that memory equals what a reload
rebuilds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import stead
from stead.core.batch import IN_DOUBT_TEXT
from stead.core.records import full_records
from stead.extend import SettledInfo
from stead.messages import ToolCall, ToolResult, decode_block
from stead.providers.scripted import ScriptedProvider, ScriptedResponse, _events
from tests.chaos.requests import RequestLog, Stored, check_requests, read_requests, stored_from_records
from tests.fakes.crash_points import KVLedger

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER = Path(__file__).resolve().parent / "worker.py"

N_AGENTS = 3
TOOL_NAMES = ["plain_op", "durable_op", "tx_op", "recon_op", "gated_op"]
HELD = frozenset({"gated_op"})
"""Tools whose calls are held for approval: their results may follow later calls' results (T2)."""
RETRY = stead.RetryPolicy(max_attempts=3, base_delay=0.005, max_delay=0.02)
IDLE_TIMEOUT = 30.0
CONTEXT_WINDOW = 1500
"""Small enough that long histories compact automatically (K1) during a seed."""
Emit = Callable[[str], None]


def agent_id(j: int) -> str:
    return f"agent{j}"


def replay_command(seed: int, flaky: bool = False) -> str:
    return f"python scripts/chaos.py --seed {seed}" + (" --flaky" if flaky else "")


# ====================================================================================== the plan
@dataclass
class Op:
    """One driver action. kind: send | steer | deliver | abort | invalid | sleep | decide."""

    kind: str
    agent: int = 0
    items: list[tuple[str, str, str]] = field(default_factory=list)  # (id, delivery, text)
    delay: float = 0.0


@dataclass
class Plan:
    seed: int
    agents: list[dict[str, Any]]
    kills: int
    incarnations: list[list[list[Op]]]  # per killed incarnation: per task: ops
    kill_points: list[tuple[str, float]]  # ("markers", n), ("delay", s after READY), ("spawn", s)


def _flaw(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return ""
    if r < 0.75:
        return f"R{rng.randint(1, 3)}@{rng.randint(0, 4)}/"  # retryable error (3 in a row fails the turn)
    if r < 0.87:
        return f"E{rng.randint(1, 2)}@{rng.randint(0, 4)}/"  # stream ends without a terminal event
    if r < 0.95:
        return f"H{rng.randint(1, 2)}/"  # a half-streamed block, then the stream ends
    return "F/"  # fatal provider error


def _script(rng: random.Random) -> str:
    steps = []
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        calls = []
        for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
            name = "nosuch_op" if rng.random() < 0.04 else rng.choice(TOOL_NAMES)
            calls.append(f"{name}:{rng.choice([0, 0, 2, 5, 10, 25, 60])}")
        steps.append(_flaw(rng) + "C=" + "+".join(calls))
    steps.append(_flaw(rng) + rng.choice(["T", "T", "S"]))
    return ";".join(steps)


def make_plan(seed: int) -> Plan:
    rng = random.Random(seed)
    agents = [
        {
            "steering_mode": rng.choice(["one-at-a-time", "all"]),
            "send_mode": rng.choice(["one-at-a-time", "one-at-a-time", "all"]),
            "max_tool_concurrency": rng.choice([1, 2, 4, 8]),
        }
        for _ in range(N_AGENTS)
    ]
    kills = rng.randint(2, 4)
    used: list[list[str]] = [[] for _ in range(N_AGENTS)]
    incarnations = []
    kill_points: list[tuple[str, float]] = []
    for inc in range(1, kills + 1):
        tasks = []
        counter = 0
        for t in range(rng.randint(2, 4)):
            ops = []
            for _ in range(rng.randint(3, 8)):
                a = rng.randrange(N_AGENTS)
                r = rng.random()
                if r < 0.62:
                    kind = "send" if r < 0.3 else ("steer" if r < 0.45 else "deliver")
                    n = rng.randint(2, 3) if kind == "deliver" else 1
                    items = []
                    for _ in range(n):
                        if used[a] and rng.random() < 0.15:
                            mid = rng.choice(used[a])  # a repeated id (A3)
                        else:
                            mid = f"m{inc}t{t}k{counter}"
                            counter += 1
                            used[a].append(mid)
                        if any(mid == i[0] for i in items):
                            continue
                        delivery = rng.choice(["send", "steer"]) if kind == "deliver" else kind
                        items.append((mid, delivery, f"{mid} :: {_script(rng)}"))
                    ops.append(Op("deliver" if len(items) > 1 else items[0][1], a, items))
                elif r < 0.72 and used[a]:
                    mid = rng.choice(used[a])  # a repeated id sent on its own
                    ops.append(Op(rng.choice(["send", "steer"]), a, [(mid, "send", f"{mid} :: again")]))
                elif r < 0.77:
                    ops.append(Op("abort", a))
                elif r < 0.8:
                    ops.append(Op("decide", a))  # approve or reject the agent's pending approvals
                elif r < 0.86:
                    mid = f"x{inc}t{t}k{counter}"  # refused: empty content (never written)
                    counter += 1
                    ops.append(Op("invalid", a, [(mid, "send", "   ")]))
                elif rng.random() < 0.35:
                    ops.append(Op("compact", a))  # a requested compaction (K1)
                else:
                    ops.append(Op("sleep", a, delay=rng.choice([0.0, 0.005, 0.02, 0.08])))
            tasks.append(ops)
        incarnations.append(tasks)
        r = rng.random()
        if r < 0.45:
            kill_points.append(("markers", float(rng.randint(1, 120))))  # after N marker lines
        elif r < 0.9:
            kill_points.append(("delay", rng.uniform(0.0, 1.2)))  # N seconds after READY
        else:
            kill_points.append(("spawn", rng.uniform(0.1, 0.8)))  # N seconds after the process started
    return Plan(seed, agents, kills, incarnations, kill_points)


# ====================================================================================== the world
class World:
    """Process-wide state of the running incarnation (tool bodies and hooks read it)."""

    effects: Path | None = None
    requests: RequestLog | None = None
    """Logs every provider request as it is made (the request checker, tests/chaos/requests.py)."""
    inc: int = 0
    emit: Emit = staticmethod(lambda line: None)  # type: ignore[assignment]
    attempts: ClassVar[Counter[tuple[Any, ...]]] = Counter()


def log_effect(ctx: stead.ToolContext, name: str, key: str = "-") -> None:
    """Append one side effect to the log (flush + fsync: it survives the kill that may follow)."""
    assert World.effects is not None
    with World.effects.open("a") as f:
        f.write(f"{World.inc} {ctx.agent_id} {name} {ctx.call_id} {key}\n")
        f.flush()
        os.fsync(f.fileno())


def read_effects(path: Path) -> list[tuple[int, str, str, str, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:  # a torn last line cannot happen with fsync-per-line, but be strict anyway
            out.append((int(parts[0]), parts[1], parts[2], parts[3], parts[4]))
    return out


@stead.tool
async def plain_op(ms: int, ctx: stead.ToolContext) -> str:
    "An effect that must happen at most once (default flags)."
    World.emit(f"TOOL plain_op {ctx.call_id}")
    await asyncio.sleep(ms / 2000)
    log_effect(ctx, "plain_op")
    await asyncio.sleep(ms / 2000)
    return "plain_op done"


@stead.tool(durable=True)
async def durable_op(ms: int, ctx: stead.ToolContext) -> str:
    "An effect that is safe to repeat; it carries a retry-stable idempotency key."
    World.emit(f"TOOL durable_op {ctx.call_id}")
    key = await ctx.kv.get_or_create("idem", lambda: f"k{World.inc}{random.randrange(10**9)}")
    await asyncio.sleep(ms / 2000)
    log_effect(ctx, "durable_op", str(key))
    await asyncio.sleep(ms / 2000)
    return "durable_op done"


@stead.tool(transactional=True)
async def tx_op(ms: int, ctx: stead.ToolContext) -> str:
    "An effect inside the result's transaction: it commits with the result or not at all."
    World.emit(f"TOOL tx_op {ctx.call_id}")
    tx = ctx.tx
    assert tx is not None
    if not await tx.write_if_absent(ctx.agent_id, f"kv.a.txeff.{ctx.call_id}", str(World.inc)):
        raise RuntimeError("double effect")
    await asyncio.sleep(ms / 4000)
    return "tx_op done"


@stead.tool
async def recon_op(ms: int, ctx: stead.ToolContext) -> str:
    "An at-most-once effect with durable evidence (intent before, done after) for reconciliation."
    World.emit(f"TOOL recon_op {ctx.call_id}")
    await ctx.kv.set("intent", 1)
    await asyncio.sleep(ms / 2000)
    log_effect(ctx, "recon_op")
    await ctx.kv.set("done", 1)
    await asyncio.sleep(ms / 2000)
    return "recon_op done"


@recon_op.reconcile
async def _reconcile(ctx: stead.ToolContext) -> Any:
    if await ctx.kv.get("done") is not None:
        return "recon_op done (reconciled)"
    if await ctx.kv.get("intent") is None:
        return stead.RUN_AGAIN  # the effect certainly did not happen
    return stead.IN_DOUBT


@stead.tool(effects="write", destructive=True)
async def gated_op(ms: int, ctx: stead.ToolContext) -> str:
    "An at-most-once effect the policy holds for a human's approval (destructive, in auto mode)."
    World.emit(f"TOOL gated_op {ctx.call_id}")
    await asyncio.sleep(ms / 2000)
    log_effect(ctx, "gated_op")
    await asyncio.sleep(ms / 2000)
    return "gated_op done"


TOOLS = [plain_op, durable_op, tx_op, recon_op, gated_op]


def approves(approval: stead.Approval) -> bool:
    """The driver's decision on an approval (deterministic in its call id): two in three are approved."""
    return sum(map(ord, approval.call_id)) % 3 != 0


def _parse_step(step: str) -> tuple[str, int, int, str]:
    """'R2@1/C=a:1+b:2' -> (flaw, count, cut, body)."""
    if "/" not in step:
        return "", 0, 0, step
    flaw, body = step.split("/", 1)
    kind = flaw[0]
    if kind == "F":
        return "F", 1, 0, body
    count, _, cut = flaw[1:].partition("@")
    return kind, int(count), int(cut or 0), body


def respond(request: stead.ProviderRequest) -> ScriptedResponse:
    """Deterministic in the request (plus a per-process attempt counter that drives retried flaws)."""
    if World.requests is not None:
        World.requests(request)
    if request.purpose == "compaction":
        return ScriptedResponse(blocks=[stead.Text(f"summary of {len(request.messages[-1].text)} chars")])
    msgs = request.messages
    last = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    if last < 0:
        return ScriptedResponse(blocks=[stead.Text("nothing to answer")])
    user = msgs[last]
    mid, _, script = user.text.partition(" :: ")
    steps = [s for s in script.split(";") if s and s != "again"]
    k = sum(1 for m in msgs[last + 1 :] if m.role == "tool")
    step = steps[k] if k < len(steps) else "T"
    flaw, count, cut, body = _parse_step(step)
    blocks: list[stead.Block]
    chunk, between = 0, 0.0
    if body.startswith("C="):
        blocks = [stead.Text(f"{mid} step {k}: calling")]
        for spec in body[2:].split("+"):
            name, _, ms = spec.partition(":")
            blocks.append(stead.ToolCall(name, {"ms": int(ms or 0)}))
    elif body == "S":
        blocks = [stead.Reasoning(f"thinking about {mid}"), stead.Text(f"slow answer to {mid}. " * 6)]
        chunk, between = 7, 0.002
    else:
        blocks = [stead.Text(f"answer to {mid} at step {k}")]
    # no usage reported: stead estimates it, so the agents' small windows trigger automatic compaction
    resp = ScriptedResponse(blocks=blocks, chunk=chunk, delay_between=between, report_usage=False)
    if not flaw:
        return resp
    attempt_key = (request.agent_id, mid, k)
    n = World.attempts[attempt_key]
    World.attempts[attempt_key] += 1
    if flaw == "F":
        return ScriptedResponse(blocks=blocks, error="fatal provider failure (scripted)", retryable=False)
    if n >= count:
        return resp
    total = len(_events(resp, request))
    if flaw == "R":
        resp.error, resp.retryable, resp.end_after = "rate limited (scripted)", True, min(cut, total - 2)
    elif flaw == "E":
        resp.end_after = min(cut, total - 2)
    elif flaw == "H":
        resp.half_block = "a half-streamed blo"
        evs = _events(resp, request)
        resp.end_after = next(i for i, e in enumerate(evs) if getattr(e, "text", None) == resp.half_block) + 1
    return resp


class Ledger(KVLedger):
    """Writes activation / settlement events into the store, in the transaction that describes them."""

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        await self._log(ctx, ["a", ctx.run_id, ctx.restored, World.inc])

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        await self._log(ctx, ["s", ctx.run_id, info.error, World.inc])

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        if event.type in ("block_end", "tool_finished", "settled", "activated", "done", "message_consumed"):
            World.emit(f"EV {agent_id} {event.type}")


async def open_system(db: Path, faults: stead.store.Faults | None = None) -> stead.AgentSystem:
    return await stead.open(
        f"sqlite:///{db}?synchronous=normal",
        providers={"scripted": ScriptedProvider(respond)},
        tools=TOOLS,
        hooks=Ledger(),
        retry=RETRY,
        faults=faults,
        approvals=True,  # gated_op waits for decisions (the driver's `decide` ops, the final incarnation)
    )


async def _retry_store(fn: Callable[[], Any], attempts: int = 200) -> Any:
    """Run `fn()` again after a transient `StoreError` (flaky mode); other errors propagate."""
    for i in range(attempts):
        try:
            return await fn()
        except stead.StoreCrashed:
            raise
        except stead.StoreError:
            if i == attempts - 1:
                raise
            await asyncio.sleep(0.001)
    raise AssertionError("unreachable")


async def ensure_agents(system: stead.AgentSystem, plan: Plan) -> list[stead.Agent]:
    agents = []
    for j, cfg in enumerate(plan.agents):

        async def get_or_create(j: int = j, cfg: dict[str, Any] = cfg) -> stead.Agent:
            try:
                return await system.get(agent_id(j))
            except stead.AgentNotFound:
                return await system.create(
                    provider="scripted",
                    model="m",
                    tools=[*TOOL_NAMES],
                    agent_id=agent_id(j),
                    context_window=CONTEXT_WINDOW,
                    **cfg,
                )

        agents.append(await _retry_store(get_or_create))
    return agents


# ====================================================================================== one incarnation
async def decide(system: stead.AgentSystem, agent: stead.Agent, emit: Emit) -> int:
    """Decide every pending approval of `agent` (`approves`); returns how many this call decided."""
    n = 0
    for approval in await _retry_store(agent.approvals):
        yes = approves(approval)

        async def one(approval: stead.Approval = approval, yes: bool = yes) -> stead.Decision:
            if yes:
                return await system.approve(approval.id, note="chaos")
            return await system.reject(approval.id, note="chaos")

        decision = await _retry_store(one)
        emit(f"DECIDED {approval.call_id} {decision.status} {int(decision.decided)}")
        n += decision.decided
    return n


async def decide_until_settled(system: stead.AgentSystem, agents: list[stead.Agent], emit: Emit) -> None:
    """Wait until no agent has anything to do but wait for a decision, decide, repeat (bounded)."""
    for _ in range(50):
        await asyncio.wait_for(asyncio.gather(*(a.wait_idle() for a in agents)), IDLE_TIMEOUT)
        waiting = [a for a in agents if a.state == "waiting"]
        if not waiting:
            return
        for agent in waiting:
            await decide(system, agent, emit)
    emit("VIOLATION agents kept waiting for approvals after 50 rounds of decisions")


async def compact_unless_waiting(agent: stead.Agent) -> bool:
    """`agent.compact()`, except that an agent waiting for decisions on held calls compacts after them (K1:
    the next safe boundary is after the batch): the driver does not wait for a human there — the durable
    request runs once a later decision (or the final incarnation's) settles the batch. False then. A
    compaction that does not end on an agent that is not waiting is a violation (reported by the idle
    timeout of the incarnation)."""
    compaction = asyncio.ensure_future(agent.compact())
    idle = asyncio.ensure_future(agent.wait_idle())
    try:
        await asyncio.wait({compaction, idle}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        idle.cancel()
    if not compaction.done() and agent.state == "waiting":
        compaction.add_done_callback(lambda t: t.cancelled() or t.exception())
        return False
    try:
        await compaction
    except (stead.CompactionFailed, stead.Closed, stead.StoreError) as e:
        if isinstance(e, stead.StoreCrashed):
            raise
    return True


async def drive(
    agents: list[stead.Agent], tasks: list[list[Op]], emit: Emit, system: stead.AgentSystem | None = None
) -> None:
    """Run the driver tasks concurrently. Markers: SEND before, ACC/REF after each acceptance."""

    async def one(ops: list[Op]) -> None:
        for op in ops:
            agent = agents[op.agent]
            a = op.agent
            if op.kind == "sleep":
                await asyncio.sleep(op.delay)
                continue
            if op.kind == "decide":
                if system is not None:
                    await decide(system, agent, emit)
                continue
            if op.kind == "abort":
                emit(f"ABORT {a}")
                await agent.abort()
                emit(f"ABORTED {a}")
                continue
            if op.kind == "compact":
                emit(f"COMPACT {a}")
                if await compact_unless_waiting(agent):
                    emit(f"COMPACTED {a}")
                else:
                    emit(f"COMPACT_DEFERRED {a}")
                continue
            inputs = [stead.Input(text, id=mid, delivery=d) for mid, d, text in op.items]  # type: ignore[arg-type]
            for mid, _, _ in op.items:
                emit(f"SEND {a} {mid}")
            try:
                accs = await agent.deliver(inputs)
            except (stead.InvalidInput, stead.StoreError) as e:
                if isinstance(e, stead.StoreCrashed):
                    raise
                for mid, _, _ in op.items:
                    emit(f"REF {a} {mid} {type(e).__name__}")
                continue
            if op.kind == "invalid":
                emit(f"VIOLATION invalid input was accepted: {op.items}")
            for acc in accs:
                emit(f"ACC {a} {acc.id} {int(acc.created)}")

    await asyncio.gather(*(one(ops) for ops in tasks))


def describe_stuck(agents: list[stead.Agent]) -> str:
    """Diagnostics for an agent that never became idle: its kernel flags and where its loop waits."""
    import io

    parts = []
    for a in agents:
        rt = a._rt
        if rt._idle.is_set():
            continue
        buf = io.StringIO()
        if rt._loop_task is not None:
            rt._loop_task.print_stack(limit=8, file=buf)
        parts.append(
            f"{a.id}: loop={rt._loop_task is not None} pending={rt.pending} accepting={rt._accepting} "
            f"aborting={rt.aborting} draining={rt.draining} blocked={rt.blocked} {buf.getvalue()!r}"
        )
    return "; ".join(parts)


async def check_memory(system: stead.AgentSystem, agents: list[stead.Agent], emit: Emit) -> None:
    """Live memory equals the store: the history mirror and the pending mirror."""
    for agent in agents:
        rt = agent._rt
        history = await _retry_store(agent.history)

        async def pending(agent: stead.Agent = agent) -> str | None:
            async with system.store.transaction() as tx:
                return await tx.get(agent.id, "pending")

        raw = await _retry_store(pending)
        if agent.active != (raw is not None):
            emit(f"VIOLATION {agent.id}: memory says active={agent.active}, the store has pending={raw}")
        live = rt.messages() if rt._records is not None else None
        if live is not None and live != history:
            pairs = zip(live, history, strict=False)
            i = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(live), len(history)))
            emit(
                f"VIOLATION {agent.id}: the in-memory conversation differs from the stored one at "
                f"message {i} (memory {len(live)} messages, store {len(history)}): "
                f"memory {live[i : i + 2]!r} store {history[i : i + 2]!r}"
            )


async def incarnation(db: Path, seed: int, inc: int, final: bool, emit: Emit) -> None:
    """The body of a worker process (killed at a random moment unless `final`)."""
    plan = make_plan(seed)
    World.effects = Path(str(db) + ".effects")
    World.requests = RequestLog(requests_path(db), f"incarnation {inc}")
    World.inc = inc
    World.emit = emit  # type: ignore[assignment]
    system = await open_system(db)
    agents = await ensure_agents(system, plan)
    emit("READY")
    if not final:
        await drive(agents, plan.incarnations[inc - 1], emit, system)
        emit("WORKDONE")
    else:
        await drive(
            agents, [[Op("send", j, [(f"fin{j}", "send", f"fin{j} :: T")])] for j in range(N_AGENTS)], emit
        )
    try:
        if final:
            await decide_until_settled(system, agents, emit)  # every held call decided: everything settles
        await asyncio.wait_for(asyncio.gather(*(a.wait_idle() for a in agents)), IDLE_TIMEOUT)
    except TimeoutError:
        stuck = describe_stuck(agents)
        emit(f"VIOLATION agents did not become idle within {IDLE_TIMEOUT}s (inc {inc}): {stuck}")
        return
    await check_memory(system, agents, emit)
    emit("IDLE")
    if final:
        await system.close()
        emit("FINAL")
        return
    await asyncio.Event().wait()  # until killed


# ====================================================================================== reading the store
@dataclass
class Snapshot:
    kv: dict[str, dict[str, str]]
    history: dict[str, list[dict[str, Any]]]


def snapshot(db: Path) -> Snapshot:
    """Read the file directly, as a new process would (no stead code involved)."""
    kv: dict[str, dict[str, str]] = defaultdict(dict)
    history: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not db.exists():
        return Snapshot(kv, history)
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "kv" in tables:
            for aid, k, v in conn.execute("SELECT agent_id, key, value FROM kv ORDER BY agent_id, key"):
                kv[aid][k] = v
            current: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for aid, rec in conn.execute("SELECT agent_id, record FROM history ORDER BY agent_id, seq"):
                current[aid].append(json.loads(rec))
            archive: dict[str, list[tuple[str, str]]] = defaultdict(list)
            if "history_archive" in tables:
                for aid, cid, rec in conn.execute(
                    "SELECT agent_id, compaction_id, record FROM history_archive ORDER BY agent_id, seq"
                ):
                    archive[aid].append((cid, rec))
            for aid in set(current) | set(archive):
                # K1: the invariants hold over every record the history ever held (archive + current);
                # the current history alone must start with at most one compaction record
                recs = current.get(aid, [])
                if any(r["k"] == "c" for r in recs[1:]):
                    history[aid].append({"k": "VIOLATION", "x": "a compaction record inside the history"})
                history[aid].extend(full_records(archive.get(aid, []), recs))
    finally:
        conn.close()
    return Snapshot(kv, history)


def requests_path(db: Path) -> Path:
    return Path(str(db) + ".requests")


def all_records(db: Path) -> list[tuple[str, dict[str, Any]]]:
    """(agent id, record) of the current history and the archive (every copy), read directly."""
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        rows = list(conn.execute("SELECT agent_id, record FROM history"))
        if "history_archive" in tables:
            rows += list(conn.execute("SELECT agent_id, record FROM history_archive"))
    finally:
        conn.close()
    return [(str(aid), json.loads(rec)) for aid, rec in rows]


def stored_sqlite(db: Path) -> Stored:
    """Every call and every stored version of each result (current history and archive), read directly."""
    return stored_from_records(all_records(db))


def _calls_and_results(recs: list[dict[str, Any]]) -> tuple[list[ToolCall], list[ToolResult]]:
    calls, results = [], []
    for r in recs:
        if r["k"] == "b":
            b = decode_block(r["b"])
            if isinstance(b, ToolCall):
                calls.append(b)
        elif r["k"] == "t":
            b = decode_block(r["b"])
            assert isinstance(b, ToolResult)
            results.append(b)
    return calls, results


def check_snapshot(snap: Snapshot, where: str, markers: Markers | None = None) -> list[str]:
    """Invariants that hold at any crash point."""
    out: list[str] = []
    for j in range(N_AGENTS):
        aid = agent_id(j)
        kv, recs = snap.kv.get(aid, {}), snap.history.get(aid, [])
        if any(r["k"] == "VIOLATION" for r in recs):
            out.append(f"{where} {aid}: a compaction record inside the current history")
        users = Counter(r["id"] for r in recs if r["k"] == "u")
        queued = Counter(
            json.loads(v)["id"] for k, v in kv.items() if k.startswith("q.") and k != "q.compact" and v
        )
        for a, mid in markers.accepted if markers is not None else ():
            if a == j and users[mid] + queued[mid] != 1:
                out.append(
                    f"{where} {aid}: accepted {mid} is in history {users[mid]}x, queued {queued[mid]}x"
                )
        for mid, n in users.items():
            if n > 1:
                out.append(f"{where} {aid}: message {mid} is in history {n} times")
            if mid in queued:
                out.append(f"{where} {aid}: message {mid} is both in history and queued")
        for mid, n in queued.items():
            if n > 1:
                out.append(f"{where} {aid}: message {mid} is queued {n} times")
        identities = {k[4:] for k in kv if k.startswith("msg.")}
        if identities != set(users) | set(queued):
            out.append(
                f"{where} {aid}: message identities {sorted(identities)} != history+queue "
                f"{sorted(set(users) | set(queued))}"
            )
        calls, results = _calls_and_results(recs)
        ids = Counter(c.id for c in calls)
        if any(n > 1 for n in ids.values()):
            out.append(f"{where} {aid}: duplicate tool call ids {ids}")
        res = Counter(r.call_id for r in results)
        for cid, n in res.items():
            if n > 1:
                out.append(f"{where} {aid}: call {cid} has {n} results")
            if cid not in ids:
                out.append(f"{where} {aid}: result for unknown call {cid}")
        entries = {k.split(".", 2)[2] for k in kv if k.startswith("tool.")}
        unanswered = {c.id for c in calls} - set(res)
        if unanswered != entries:
            out.append(f"{where} {aid}: calls without a result {unanswered} != dispatched entries {entries}")
        pending = kv.get("pending")
        if entries and (pending is None or json.loads(pending)["st"] != "tools"):
            out.append(f"{where} {aid}: dispatched entries without pending stage tools ({pending})")
        ledger = json.loads(kv.get("kv.a.ledger", "[]"))
        if queued and pending is None:
            last = ledger[-1] if ledger else None
            if not (last and last[0] == "s" and last[2] == "aborted"):
                out.append(f"{where} {aid}: queued work {dict(queued)} but settled (last ledger {last})")
        out += _check_ledger(ledger, pending, where, aid)
    return out


def _check_ledger(ledger: list[list[Any]], pending: str | None, where: str, aid: str) -> list[str]:
    """X3: activation (restored=False) and settlement pair up; restorations belong to the open period."""
    out: list[str] = []
    open_run: str | None = None
    opened_in = 0
    restored: Counter[tuple[str, int]] = Counter()
    for ev in ledger:
        if ev[0] == "a" and not ev[2]:
            if open_run is not None:
                out.append(f"{where} {aid}: activated {ev[1]} while {open_run} was still active: {ledger}")
            open_run, opened_in = ev[1], ev[3]
        elif ev[0] == "a":
            if ev[1] != open_run:
                out.append(f"{where} {aid}: restored {ev[1]} but the open period is {open_run}: {ledger}")
            restored[(ev[1], ev[3])] += 1
            if ev[3] <= opened_in or restored[(ev[1], ev[3])] > 1:
                out.append(f"{where} {aid}: restored=True must come once per restart: {ledger}")
        else:
            if ev[1] != open_run:
                out.append(f"{where} {aid}: settled {ev[1]} but the open period is {open_run}: {ledger}")
            open_run = None
    current = json.loads(pending)["run"] if pending is not None else None
    if current != open_run:
        out.append(f"{where} {aid}: pending run {current} but the ledger's open period is {open_run}")
    return out


# ====================================================================================== the final check
@dataclass
class Markers:
    sent: dict[tuple[int, str], int] = field(default_factory=dict)  # (agent, id) -> first incarnation
    accepted: dict[tuple[int, str], int] = field(default_factory=dict)  # -> first incarnation
    created: Counter[tuple[int, int, str]] = field(default_factory=Counter)  # (inc, agent, id)
    refused: set[tuple[int, str]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)

    def feed(self, inc: int, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "SEND":
            self.sent.setdefault((int(parts[1]), parts[2]), inc)
        elif parts[0] == "ACC":
            key = (int(parts[1]), parts[2])
            first = self.accepted.setdefault(key, inc)
            if parts[3] == "1":
                self.created[(inc, *key)] += 1
                if first < inc:
                    self.violations.append(
                        f"{key} was accepted in incarnation {first} and created again in {inc}"
                    )
                if self.created[(inc, *key)] > 1:
                    self.violations.append(f"{key} was created twice in incarnation {inc}")
        elif parts[0] == "REF":
            self.refused.add((int(parts[1]), parts[2]))
        elif parts[0] == "VIOLATION":
            self.violations.append(f"(incarnation {inc}) {line[10:]}")


EXPECTED_TURN_FAILURES = ("(scripted)", "the model's response ended before it was complete")


def unexpected_turn_failures(db: Path) -> list[str]:
    """A failed turn must be one the plan scripted (a fatal or exhausted provider flaw, a cut stream). Any
    other failure — an exception in the harness's own responder, say — would silently turn the flaws it
    exists to exercise into failed turns (it did so for seeds 7000–7150 once), so it is a violation. Reads
    the history and the archive directly."""
    out = []
    for aid, rec in all_records(db):
        text = str(rec.get("x", "")) if rec.get("k") == "s" else ""
        if text.startswith("The last turn failed:") and not any(e in text for e in EXPECTED_TURN_FAILURES):
            out.append(f"{aid}: unexpected turn failure: {text[:300]}")
    return out


def check_final(
    snap: Snapshot,
    markers: Markers,
    effects: list[tuple[int, str, str, str, str]],
    committed_in: dict[str, int],
) -> list[str]:
    """End-state invariants from the store, the side-effect log and the markers."""
    out = check_snapshot(snap, "final")
    all_calls: dict[str, ToolCall] = {}
    all_results: dict[str, ToolResult] = {}
    for j in range(N_AGENTS):
        aid = agent_id(j)
        kv, recs = snap.kv.get(aid, {}), snap.history.get(aid, [])
        left = [k for k in kv if k == "pending" or k.startswith(("q.", "tool.", "kv.c.", "kv.r."))]
        if left:
            out.append(f"final {aid}: not settled, leftover keys {left}")
        users = Counter(r["id"] for r in recs if r["k"] == "u")
        for (a, mid), _ in markers.accepted.items():
            if a == j and users[mid] != 1:
                out.append(f"final {aid}: accepted message {mid} is in history {users[mid]} times")
        for mid in users:
            if (j, mid) not in markers.sent:
                out.append(f"final {aid}: message {mid} in history was never sent")
            elif (j, mid) in markers.refused and (j, mid) not in markers.accepted and mid.startswith("x"):
                out.append(f"final {aid}: refused message {mid} is in history")
        calls, results = _calls_and_results(recs)
        all_calls.update({c.id or "": c for c in calls})
        all_results.update({r.call_id: r for r in results})
        txeff = {k[len("kv.a.txeff.") :] for k in kv if k.startswith("kv.a.txeff.")}
        tx_done = {r.call_id for r in results if r.output == "tx_op done" and not r.is_error}
        if txeff != tx_done:
            out.append(f"final {aid}: transactional effects {sorted(txeff)} != results {sorted(tx_done)}")
        for r in results:
            if "double effect" in r.output:
                out.append(f"final {aid}: a transactional call ran its committed effect twice: {r}")
    by_call: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for inc, _aid, name, cid, key in effects:
        by_call[cid].append((inc, name, key))
    for cid, runs in by_call.items():
        call = all_calls.get(cid)
        if call is None:
            out.append(f"effect of call {cid} ({runs}) whose call is not in any history (call id not kept)")
            continue
        name = runs[0][1]
        if name in ("plain_op", "recon_op", "gated_op") and len(runs) > 1:
            out.append(f"non-durable call {cid} ({name}) ran {len(runs)} times: {runs}")
        if name == "durable_op" and len({k for _, _, k in runs}) != 1:
            out.append(f"durable call {cid} lost its idempotency key: {runs}")
        done_inc = committed_in.get(cid)
        if done_inc is not None:
            late = [r for r in runs if r[0] > done_inc]
            if late:
                out.append(
                    f"call {cid} ran again after its result committed (incarnation {done_inc}): {runs}"
                )
            if sum(1 for r in runs if r[0] == done_inc) > 1:
                out.append(f"call {cid} ran twice in incarnation {done_inc}: {runs}")
    for cid, result in all_results.items():
        n = len(by_call.get(cid, []))
        once = ("plain_op done", "recon_op done", "recon_op done (reconciled)", "gated_op done")
        if result.output in once and n != 1:
            out.append(f"call {cid} answered {result.output!r} but its effect ran {n} times")
        if result.output.startswith(("rejected by reviewer", "Rejected: the user sent", "Cancelled:")) and n:
            out.append(f"call {cid} was never approved ({result.output!r}) but its effect ran {n} times")
        if result.output == "durable_op done" and n < 1:
            out.append(f"call {cid} answered 'durable_op done' but never ran")
        if result.output == IN_DOUBT_TEXT and all_calls[cid].name not in ("plain_op", "recon_op", "gated_op"):
            out.append(f"call {cid} of {all_calls[cid].name} was left in doubt")
    return out + markers.violations


def results_by_call(snap: Snapshot) -> set[str]:
    out: set[str] = set()
    for recs in snap.history.values():
        out |= {r["b"]["i"] for r in recs if r["k"] == "t"}
    return out


async def reload_twice(db: Path) -> list[str]:
    """R4: two fresh opens rebuild identical provider contexts for every agent."""
    views = []
    for _ in range(2):
        system = await stead.open(
            f"sqlite:///{db}", providers={"scripted": ScriptedProvider(respond)}, tools=TOOLS, restore=False
        )
        try:
            view = {}
            for j in range(N_AGENTS):
                try:
                    agent = await system.get(agent_id(j))
                except stead.AgentNotFound:
                    continue
                view[agent.id] = (await agent.history(), await agent.history())
        finally:
            await system.close()
        views.append(view)
    out = []
    for aid, (h1, h2) in views[0].items():
        if h1 != h2 or views[1].get(aid, (None,))[0] != h1:
            out.append(f"final {aid}: reloading history twice gave different provider contexts")
    return out


# ====================================================================================== one seed (kills)
@dataclass
class SeedResult:
    seed: int
    violations: list[str]
    kills: int
    seconds: float
    flaky: bool = False
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations


async def _run_worker(
    db: Path, seed: int, inc: int, final: bool, kill: tuple[str, float] | None, markers: Markers
) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        str(db),
        str(seed),
        str(inc),
        "final" if final else "run",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + (IDLE_TIMEOUT + 30)
    killed = False
    stderr_task = asyncio.ensure_future(proc.stderr.read())
    try:
        started: float | None = time.monotonic() if kill is not None and kill[0] == "spawn" else None
        while True:
            timeout = deadline - time.monotonic()
            if kill is not None and kill[0] in ("delay", "spawn") and started is not None:
                timeout = min(timeout, started + kill[1] - time.monotonic())
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), max(timeout, 0))
            except TimeoutError:
                if kill is None or time.monotonic() >= deadline:
                    return [f"incarnation {inc}: worker timed out (last markers {lines[-5:]})"]
                break  # the random delay is over: kill now
            if not raw:
                break
            line = raw.decode().rstrip("\n")
            lines.append(line)
            markers.feed(inc, line)
            if line == "READY" and started is None:
                started = time.monotonic()
            if kill is not None and started is not None:
                if kill[0] == "markers" and len(lines) >= kill[1]:
                    break
                if line == "IDLE":
                    break
    finally:
        if proc.returncode is None and kill is not None:
            proc.send_signal(signal.SIGKILL)
            killed = True
        # whatever the dead process wrote before dying is still in the pipe
        rest = await proc.stdout.read()
        for line in rest.decode().splitlines():
            lines.append(line)
            markers.feed(inc, line)
        await proc.wait()
    err = (await stderr_task).decode()
    if killed and proc.returncode != -signal.SIGKILL:
        return [f"incarnation {inc}: worker exited with {proc.returncode} before the kill: {err[-2000:]}"]
    if not killed and (proc.returncode != 0 or "FINAL" not in lines):
        return [f"incarnation {inc}: final worker failed ({proc.returncode}): {err[-2000:]}"]
    if "Traceback" in err:
        return [f"incarnation {inc}: worker logged a traceback: {err[-2000:]}"]
    return []


async def run_seed(seed: int, workdir: Path | None = None) -> SeedResult:
    t0 = time.monotonic()
    plan = make_plan(seed)
    with tempfile.TemporaryDirectory(prefix=f"chaos{seed}-", dir=workdir) as d:
        db = Path(d) / "chaos.db"
        markers = Markers()
        violations: list[str] = []
        committed_in: dict[str, int] = {}
        for inc in range(1, plan.kills + 2):
            final = inc == plan.kills + 1
            violations += await _run_worker(
                db, seed, inc, final, None if final else plan.kill_points[inc - 1], markers
            )
            snap = snapshot(db)
            for cid in results_by_call(snap):
                committed_in.setdefault(cid, inc)
            if not final:
                violations += check_snapshot(snap, f"after kill {inc}", markers)
            if violations:
                break
        if not violations:
            violations += check_final(snap, markers, read_effects(Path(str(db) + ".effects")), committed_in)
            violations += check_requests(read_requests([requests_path(db)]), stored_sqlite(db), HELD)
            violations += unexpected_turn_failures(db)
            violations += await reload_twice(db)
        stats = _stats(snap, read_effects(Path(str(db) + ".effects")), markers)
        stats["requests_checked"] = len(read_requests([requests_path(db)]))
    return SeedResult(seed, violations, plan.kills, time.monotonic() - t0, stats=stats)


def _stats(snap: Snapshot, effects: list[tuple[int, str, str, str, str]], markers: Markers) -> Counter[str]:
    c: Counter[str] = Counter()
    for recs in snap.history.values():
        calls, results = _calls_and_results(recs)
        c["messages"] += sum(1 for r in recs if r["k"] == "u")
        c["calls"] += len(calls)
        c["in_doubt"] += sum(1 for r in results if r.output == IN_DOUBT_TEXT)
        c["aborted_calls"] += sum(1 for r in results if r.output.startswith("Aborted"))
        c["approved_ran"] += sum(1 for r in results if r.output == "gated_op done")
        c["rejected"] += sum(1 for r in results if r.output.startswith(("rejected by", "Rejected: the user")))
        c["failed_turns"] += sum(1 for r in recs if r["k"] == "s")
        c["compactions"] += sum(1 for r in recs if r["k"] == "c")
    c["effects"] += len(effects)
    c["reran"] += len(effects) - len({e[3] for e in effects})
    c["refused"] += len(markers.refused)
    c["unconfirmed"] += len(set(markers.sent) - set(markers.accepted) - markers.refused)
    return c


# ====================================================================================== flaky-store mode
async def run_flaky_seed(seed: int, workdir: Path | None = None) -> SeedResult:
    """One in-process incarnation with transient store failures; then the same invariants, plus memory
    equals what a reload rebuilds."""
    t0 = time.monotonic()
    plan = make_plan(seed)
    rng = random.Random(f"flaky-{seed}")
    p = rng.uniform(0.02, 0.05)
    markers = Markers()
    violations: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"flaky{seed}-", dir=workdir) as d:
        db = Path(d) / "flaky.db"
        World.effects = Path(str(db) + ".effects")
        World.requests = RequestLog(requests_path(db), "the flaky process")
        World.inc = 1
        World.attempts.clear()
        World.emit = lambda line: markers.feed(1, line)  # type: ignore[assignment]
        faults = stead.store.Faults(flaky=p, seed=seed)
        system = await _retry_store(lambda: open_system(db, faults))
        try:
            agents = await ensure_agents(system, plan)
            tasks = [ops for inc in plan.incarnations for ops in inc]
            await drive(agents, tasks, World.emit, system)
            for j, agent in enumerate(agents):  # the final message, until it is accepted
                mid = f"fin{j}"
                World.emit(f"SEND {j} {mid}")

                async def final_send(agent: stead.Agent = agent, mid: str = mid) -> stead.Acceptance:
                    return await agent.send(f"{mid} :: T", id=mid)

                acc = await _retry_store(final_send)
                World.emit(f"ACC {j} {acc.id} {int(acc.created)}")
            try:
                await decide_until_settled(system, agents, World.emit)
                await asyncio.wait_for(asyncio.gather(*(a.wait_idle() for a in agents)), IDLE_TIMEOUT)
            except TimeoutError:
                violations.append(
                    f"agents did not become idle within {IDLE_TIMEOUT}s: {describe_stuck(agents)}"
                )
            faults.flaky = 0.0  # the checks below must not be disturbed
            await check_memory(system, agents, World.emit)
            live = {
                a.id: (a._rt.messages() if a._rt._records is not None else None, a.active) for a in agents
            }
        finally:
            faults.flaky = 0.0
            await system.close()
        snap = snapshot(db)
        # memory equals what a fresh open rebuilds (after close)
        system = await open_system(db)
        try:
            for j in range(N_AGENTS):
                agent = await system.get(agent_id(j))
                msgs, active = live[agent.id]
                if msgs is not None and msgs != await agent.history():
                    violations.append(f"{agent.id}: memory before close differs from a fresh open's history")
                if active != ("pending" in snap.kv.get(agent.id, {})):
                    violations.append(f"{agent.id}: memory active={active} differs from the store")
        finally:
            await system.close()
        for a, mid in markers.refused - set(markers.accepted):
            if any(r["k"] == "u" and r["id"] == mid for r in snap.history.get(agent_id(a), [])) or (
                f"msg.{mid}" in snap.kv.get(agent_id(a), {})
            ):
                violations.append(f"{agent_id(a)}: refused message {mid} left a trace")
        effects = read_effects(Path(str(db) + ".effects"))
        violations += check_final(snap, markers, effects, {})
        violations += check_requests(read_requests([requests_path(db)]), stored_sqlite(db), HELD)
        violations += unexpected_turn_failures(db)
        violations += await reload_twice(db)
        stats = _stats(snap, effects, markers)
        stats["transient_failures"] = faults.transient_failures
        stats["requests_checked"] = len(read_requests([requests_path(db)]))
    return SeedResult(seed, violations, 0, time.monotonic() - t0, flaky=True, stats=stats)


def run_seed_sync(seed: int, flaky: bool = False) -> SeedResult:
    """Entry point for process pools."""
    try:
        return asyncio.run(run_flaky_seed(seed) if flaky else run_seed(seed))
    except Exception as e:  # a crash of the harness itself is a failure of the seed, never silent
        import traceback

        return SeedResult(seed, [f"harness error: {e!r}\n{traceback.format_exc()}"], 0, 0.0, flaky)
