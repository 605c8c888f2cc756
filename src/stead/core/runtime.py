"""The durable loop of one agent (DESIGN §5): acceptance, turns, streaming, settlement, abort, drain.

The one rule everything follows: durable state changes in a transaction, and memory (the history mirror,
the pending mirror, events) changes only in that transaction's after-commit callbacks. The pending record
alone says whether work is owed; every stage starts by reading it, the queues and the dispatched batch
inside a transaction, so the store — not memory — decides what happens next (C4).

Commits on the hot path (one user message, K tool round trips, a final answer — 2K+2 commits):
  accept              queue entry + identity + pending (activation)              1
  response with calls consumption + blocks + batch entries + pending=tools       1 per round trip
  each result         result record + entry deleted (+ pending=inference)        1 per call
  final answer        consumption + blocks + usage + settlement (or reopen)      1
Consumption is staged in memory and committed with the response's first durable write, so a message is
never both queued and in history, and never neither (C1); a crash before that write leaves it queued.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from stead._ids import new_id
from stead.core import records as R
from stead.core import turns as T
from stead.core.config import SETTING_NAMES, AgentConfig, Env
from stead.core.events import (
    Activated,
    BlockReset,
    Event,
)
from stead.core.hooks import HookContext
from stead.core.records import Pending, Queued
from stead.errors import Closed, ProviderError, StoreCrashed, StoreError
from stead.messages import (
    Block,
    Message,
    Role,
    Text,
    ToolCall,
    ToolResult,
    Usage,
    decode_block,
)
from stead.providers.base import (
    BlockEnd,
    Done,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
    UsageEvent,
)
from stead.store.base import Tx

__all__ = ["AgentRuntime", "Inbound", "inside_agent"]

log = logging.getLogger("stead.core")

inside_agent: ContextVar[str | None] = ContextVar("stead_inside_agent", default=None)
"""The id of the agent whose loop (or tool) the current task runs in."""


@dataclass
class Inbound:
    """A validated, copied message on its way into a queue."""

    id: str
    delivery: str  # "send" | "steer"
    role: Role
    content: list[dict[str, Any]]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]


@dataclass
class _Turn:
    """Volatile state of one inference turn (what abort and failure must settle)."""

    inference_id: str
    pending: Pending
    take: list[Queued]
    consumed: bool = False
    held: list[Block] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    streaming: bool = False
    partial: bool = False
    done_emitted: bool = False
    usage: Usage | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    reset: bool = False
    handoff: str | None = None
    started_at: float = 0.0
    first_token_at: float | None = None


class _Retry(Exception):
    """Internal: stop this stage and run the stage again after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay


class AgentRuntime:
    """The kernel of one agent. Created and owned by `AgentSystem`; users hold `stead.Agent`."""

    def __init__(self, agent_id: str, config: AgentConfig, env: Env) -> None:
        self.id = agent_id
        self.config = config
        self.env = env
        self.pending: Pending | None = None
        self._records: list[dict[str, Any]] | None = None
        self._messages: list[Message] | None = None
        self._settings: dict[str, Any] | None = None
        self._qseq: dict[str, tuple[int, int]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._turn: _Turn | None = None
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = 0
        self._aborting = False
        self._draining = False
        self.closed = False
        self._restored = False
        self._attempt = 0
        self.last_error: str | None = None
        self.blocked: str | None = None
        # tool execution state of this process incarnation (see stead.core.batch)
        self.dispatched_here: set[str] = set()
        self.outcomes: dict[str, ToolResult] = {}
        self.running: dict[str, asyncio.Task[ToolResult]] = {}
        self.call_kvs: dict[str, Any] = {}
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ small helpers
    @property
    def active(self) -> bool:
        """Whether work is owed (the pending record exists)."""
        return self.pending is not None

    def hook_ctx(
        self,
        tx: Tx | None,
        pending: Pending | None = None,
        *,
        restored: bool = False,
        inference_id: str | None = None,
    ) -> HookContext:
        p = pending or self.pending
        return HookContext(
            agent_id=self.id,
            agent_name=self.config.name,
            store=self.env.store,
            run_id=p.run_id if p else None,
            turn_id=p.turn_id if p else None,
            inference_id=inference_id or (p.inference_id if p else None),
            # P1: within a turn, the settings its consumption made effective (committed in the same tx)
            settings=dict(self._turn.settings if self._turn is not None else self.settings),
            tx=tx,
            restored=restored,
            extra=self.config.extra,
        )

    def offered_tools(self, pending: Pending | None) -> list[str]:
        """The tools this run offers to the model and allows to run (the `offered_tools` hook's view)."""
        if not self.env.hooks:
            return self.config.tools
        return self.env.hooks.offered_tools(self.hook_ctx(None, pending), list(self.config.tools))

    @property
    def settings(self) -> dict[str, Any]:
        return self._settings if self._settings is not None else self.config.initial_settings()

    def emit(self, event: Event) -> None:
        """Deliver to every observer; an observer that throws never stops the others (S2)."""
        for q in list(self._subscribers):
            q.put_nowait(event)
        if self.env.hooks:
            self.env.hooks.on_event(self.id, event)

    def subscribe(self) -> asyncio.Queue[Event | None]:
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Event | None]) -> None:
        self._subscribers.discard(q)

    def _set_idle(self) -> None:
        if self._loop_task is None and self._accepting == 0 and (self.pending is None or self._stopped):
            self._idle.set()
        else:
            self._idle.clear()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def _stopped(self) -> bool:
        return self._draining or self.closed or self.blocked is not None

    # ------------------------------------------------------------------ acceptance (A1–A7)
    async def accept(self, tx: Tx, item: Inbound) -> bool:
        """Write one accepted message inside `tx`. Returns False when the id was seen before (A3).

        The same transaction writes the identity, the queue entry and — if absent — the pending record;
        creating it is the activation, whose hook runs here too (A4). Memory and the loop change only after
        the commit (A6)."""
        if not await tx.write_if_absent(self.id, R.msg_key(item.id), item.delivery):
            return False
        prefix = R.STEER if item.delivery == "steer" else R.SEND
        value = Queued("", item.id, item.role, item.content, item.metadata, item.settings).encode()
        await self._enqueue(tx, prefix, value)
        activated: Pending | None = None
        if await tx.get(self.id, R.PENDING) is None:
            activated = Pending("inference", new_id(), activated_at=time.time())
            await tx.write_if_absent(self.id, R.PENDING, activated.encode())
            if self.env.hooks:
                ctx = self.hook_ctx(tx, activated)
                ctx.message = Message(
                    item.role, [decode_block(b) for b in item.content], id=item.id, metadata=item.metadata
                )
                await self.env.hooks.activated_tx(ctx)

        def published() -> None:
            if activated is not None:
                self.pending = activated
                self.emit(Activated(activated.run_id, restored=False))
            self.wake()

        tx.after_commit(published)
        return True

    def begin_accept(self) -> None:
        """An acceptance for this agent is in flight (`wait_idle` must not report idle meanwhile)."""
        self._accepting += 1
        self._idle.clear()

    def end_accept(self) -> None:
        self._accepting -= 1
        self._set_idle()

    async def _enqueue(self, tx: Tx, prefix: str, value: str) -> str:
        """Write `value` under the next queue key and return the key. Keys sort by (time slot, sequence);
        order survives restarts and a clock moving back."""
        last = self._qseq.get(prefix)
        if last is None:
            raw = await tx.last_key(self.id, prefix)
            if raw is None:
                last = (0, 0)
            else:
                slot_s, seq_s = raw[len(prefix) :].split(".")
                last = (int(slot_s), int(seq_s))
        now = int(time.time() * 1000)
        nxt = (now, 0) if now > last[0] else (last[0], last[1] + 1)
        key = R.queue_key(prefix, *nxt)
        while not await tx.write_if_absent(self.id, key, value):  # claim; collisions bump the sequence
            nxt = (nxt[0], nxt[1] + 1)
            key = R.queue_key(prefix, *nxt)
        self._qseq[prefix] = nxt
        return key

    # ------------------------------------------------------------------ the loop
    def wake(self) -> None:
        """Start the loop if work is owed and it is not running."""
        if self.blocked is not None and not self._draining and not self.closed:
            self.blocked = None  # new input may carry a provider this process has
        if self._loop_task is None and self.pending is not None and not self._stopped:
            self._idle.clear()
            self._loop_task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"stead-agent-{self.id}"
            )
        self._set_idle()

    def restore(self, pending: Pending) -> None:
        """Mark as restored after a restart (R1): the next stage announces `restored=True`."""
        self.pending = pending
        self._restored = True
        self.wake()

    async def _loop(self) -> None:
        inside_agent.set(self.id)
        task = asyncio.current_task()
        assert task is not None
        # a retry delay is slept inside the try below, so that an abort during the wait is handled (X1)
        backoff: float | None = None
        try:
            if self._aborting and self._turn is None:
                # restarted by abort() after a cancellation that came before the previous task's first step
                more = await T.after_abort(self)
                self._aborting = False
                if not more:
                    return
            while not self._stopped:
                try:
                    try:
                        if backoff is not None:
                            delay, backoff = backoff, None
                            await asyncio.sleep(delay)
                            continue
                        more = await self._stage()
                    except _Retry as r:
                        await asyncio.sleep(r.delay)
                        continue
                except asyncio.CancelledError:
                    if not self._aborting:
                        raise  # the system abandoned or killed this agent
                    task.uncancel()
                    more = await T.after_abort(self)
                    self._aborting = False
                except (StoreCrashed, Closed):
                    # the store is dead or closed (this process is as good as killed): stop for good
                    # instead of restarting the loop forever; the durable work stays for the next owner
                    self._draining = True
                    return
                except StoreError as e:
                    log.warning("agent %s: store error, retrying the stage: %s", self.id, e)
                    backoff = self.env.store_retry_delay
                    continue
                except Exception:
                    log.exception("agent %s: unexpected error in the loop", self.id)
                    backoff = self.env.store_retry_delay
                    continue
                if not more:
                    break
        finally:
            self._loop_task = None
            self._turn = None
            self._set_idle()
            if self.pending is not None and not self._stopped and not self._aborting:
                # work was accepted after the loop decided to stop: never strand it
                self.wake()

    async def _stage(self) -> bool:
        """Read durable state and run the next stage. Returns whether the loop should continue."""
        from stead.core.batch import run_batch

        store = self.env.store
        self._turn = None
        take: list[Queued] | None = []
        async with store.transaction() as tx:
            pending = Pending.decode(await tx.get(self.id, R.PENDING))
            if pending is None:
                tx.after_commit(self._mark_settled_mirror)
                return False
            if self._records is None:
                await self._load(tx)
            if self._restored:
                await self.env.hooks.activated_tx(self.hook_ctx(tx, pending, restored=True))
            queued = [Queued.decode(k, v) for k, v in await tx.read_prefix(self.id, R.QUEUE) if v]
            entries = await tx.read_prefix(self.id, R.TOOL) if pending.stage == "tools" else []
            if self._restored:
                restored_pending = pending

                def announce() -> None:
                    self._restored = False
                    self.emit(Activated(restored_pending.run_id, restored=True))
                    if restored_pending.stage == "inference" and restored_pending.inference_id is not None:
                        self.emit(BlockReset())  # an open request died with the previous process (R2)

                tx.after_commit(announce)
            if pending.stage == "tools":
                pass
            else:
                take = self._plan(pending, queued)
                if take is None:
                    await T.settle_in(self, tx, pending, self.last_error)
                    return False
        self.pending = pending
        if pending.stage == "tools":
            await run_batch(self, pending, entries)
            return True
        if self._draining or take is None:
            return False  # X4: stop before the next provider request
        if self._find_provider(self._apply_settings(take)[0]) is None:
            # This process cannot serve the agent (its provider is not registered here): leave the durable
            # work untouched for a process that can, instead of failing the turn.
            self.blocked = f"provider {self._apply_settings(take)[0].get('provider')!r} is not registered"
            log.warning("agent %s is blocked: %s", self.id, self.blocked)
            return False
        self.blocked = None
        return await self._inference(pending, take)

    def _plan(self, pending: Pending, queued: list[Queued]) -> list[Queued] | None:
        """Which queued messages the next inference consumes (C2); None when nothing is owed."""
        steer = [q for q in queued if q.key.startswith(R.STEER)]
        sends = [q for q in queued if q.key.startswith(R.SEND)]
        if steer:
            return steer if self.config.steering_mode == "all" else steer[:1]
        if pending.inference_id is not None:
            return []
        if sends:
            return sends if self.config.send_mode == "all" else sends[:1]
        return None

    async def _load(self, tx: Tx) -> None:
        raw = await tx.load(self.id)
        records = [json.loads(r) for r in raw]
        settings_raw = await tx.get(self.id, R.SETTINGS)
        settings = json.loads(settings_raw) if settings_raw else self.config.initial_settings()

        def publish() -> None:
            self._records = records
            self._messages = None
            self._settings = settings

        tx.after_commit(publish)
        # make the data visible to the rest of this stage, which runs before the commit
        self._records, self._settings, self._messages = records, settings, None

    def _mark_settled_mirror(self) -> None:
        self.pending = None
        self._restored = False

    def messages(self) -> list[Message]:
        """The conversation as the provider sees it (built from the history mirror)."""
        if self._messages is None:
            self._messages = R.build_messages(self._records or [])
        return self._messages

    def _publish_records(self, new: list[dict[str, Any]], *, reset: bool = False) -> None:
        if reset:
            self._records = list(new)
            self._messages = None
            return
        if self._records is None:
            return  # never loaded in this process: the next stage loads the whole history from the store
        self._records.extend(new)
        self._messages = None

    # ------------------------------------------------------------------ inference turns
    def _owes_fresh_inference(self, pending: Pending) -> str:
        """R2: reuse the pending inference id unless its response already produced a durable block."""
        inf = pending.inference_id
        if inf is None:
            return new_id()
        for rec in reversed(self._records or []):
            kind = rec.get("k")
            if kind == "b" and rec.get("i") == inf:
                return new_id()
            if kind not in ("b", "t"):
                break
        return inf

    async def _inference(self, pending: Pending, take: list[Queued]) -> bool:
        inf_id = self._owes_fresh_inference(pending)
        settings, reset = self._apply_settings(take)
        turn = _Turn(inf_id, pending, take, settings=settings, reset=reset, started_at=time.time())
        self._turn = turn
        if self.env.hooks:
            ctx = self.hook_ctx(None, pending, inference_id=inf_id)
            ctx.settings = dict(settings)
            if reset:
                # K2: the hook may open the reset conversation with a handoff message (a decision, made
                # before the request so the live and the reloaded context are the same, R4)
                turn.handoff = await self.env.hooks.model_changed(ctx, dict(self.settings), dict(settings))
            refusal = await self.env.hooks.before_inference(ctx)
            if refusal is not None:
                return await T.fail(self, turn, refusal, end_run=True)
        try:
            provider = self._provider(settings)
            request = self._request(turn, settings)
            reason, error = await self._stream(turn, provider, request)
        except ProviderError as e:
            if e.retryable and self._attempt + 1 < self.env.retry.max_attempts:
                self._attempt += 1
                await T.commit_partial(self, turn)
                if turn.partial:
                    self.emit(BlockReset())  # S3: the half-streamed block observers saw is dropped
                raise _Retry(self.env.retry.delay(self._attempt, e.retry_after)) from e
            if turn.partial:
                self.emit(BlockReset())
            return await T.fail(self, turn, str(e))
        except (asyncio.CancelledError, StoreError, _Retry):
            raise
        except Exception as e:
            log.warning("agent %s: turn failed: %r", self.id, e)
            return await T.fail(self, turn, f"{type(e).__name__}: {e}")
        if reason is None:
            # S3: the stream ended without a terminal event
            await T.commit_partial(self, turn)
            if turn.partial:
                self.emit(BlockReset())
            if self._attempt + 1 < self.env.retry.max_attempts:
                self._attempt += 1
                raise _Retry(self.env.retry.delay(self._attempt))
            return await T.fail(self, turn, "the model's response ended before it was complete")
        self._attempt = 0  # only a complete response resets the retry budget
        if reason in ("error", "cancelled"):
            return await T.fail(self, turn, error or f"the model's response ended with {reason!r}")
        return await T.finish(self, turn, reason)

    def _provider(self, settings: dict[str, Any]) -> Provider:
        provider = self._find_provider(settings)
        if provider is None:
            raise ProviderError(
                f"no provider named {settings.get('provider')!r} is registered", retryable=False
            )
        return provider

    def _find_provider(self, settings: dict[str, Any]) -> Provider | None:
        provider = self.env.providers.get(str(settings.get("provider")))
        if provider is None and self.env.resolve_provider is not None:
            provider = self.env.resolve_provider(settings)
        return provider

    def _apply_settings(self, take: list[Queued]) -> tuple[dict[str, Any], bool]:
        """C3/K2: settings carried by consumed messages, later ones winning; whether they reset history."""
        current = self.settings
        new = dict(current)
        for q in take:
            for k, v in q.settings.items():
                if k in SETTING_NAMES and v is not None:
                    new[k] = v
        if new == current:
            return current, False
        return new, not self.env.compatible(current, new)

    def _request(self, turn: _Turn, settings: dict[str, Any]) -> ProviderRequest:
        staged = [
            Message(q.role, [decode_block(b) for b in q.content], id=q.id, metadata=q.metadata)
            for q in turn.take
        ]
        history = self.messages() if not turn.reset else []
        if turn.reset and turn.handoff is not None:
            history = [Message("system", [Text(turn.handoff)])]
        specs = []
        for name in self.offered_tools(turn.pending):
            t = self.env.tools.get(name)
            if t is not None:
                specs.append(ToolSpec(t.name, t.description, t.parameters))
        return ProviderRequest(
            model=str(settings.get("model", self.config.model)),
            instructions=self.config.instructions,
            messages=history + staged,
            tools=specs,
            agent_id=self.id,
            inference_id=turn.inference_id,
            effort=settings.get("effort"),
        )

    async def _stream(
        self, turn: _Turn, provider: Provider, request: ProviderRequest
    ) -> tuple[str | None, str | None]:
        """Stream one response. Completed blocks are held and committed at the next block boundary or at
        the end (S1); deltas go to observers live."""
        seen_ids: set[str] = set()
        turn.streaming = True
        reason: str | None = None
        error: str | None = None
        async for ev in provider.stream(request):
            if isinstance(ev, TextDelta | ReasoningDelta):
                if turn.first_token_at is None:
                    turn.first_token_at = time.time()
                if not turn.partial and turn.held and not turn.calls:
                    await T.commit_held(self, turn)
                turn.partial = True
                self.emit(ev)
            elif isinstance(ev, BlockEnd):
                turn.partial = False
                block = ev.block
                if isinstance(block, ToolCall):
                    cid = block.id or new_id()
                    if cid in seen_ids:
                        log.warning("agent %s: duplicate tool call id %s dropped", self.id, cid)
                        continue
                    seen_ids.add(cid)
                    block = ToolCall(block.name, block.arguments, cid)
                    turn.calls.append(block)
                if turn.first_token_at is None:
                    turn.first_token_at = time.time()
                turn.held.append(block)
            elif isinstance(ev, UsageEvent):
                turn.usage = ev.usage
                self.emit(ev)
            elif isinstance(ev, Done):
                reason, error = ev.reason, ev.error
                break
        turn.streaming = False
        return reason, error

    # -- commits within a turn

    # ------------------------------------------------------------------ settlement (X2)

    # ------------------------------------------------------------------ abort (X1)
    async def abort(self) -> None:
        """Cancel the whole current turn. Finished blocks stay, the streaming block is dropped, running
        tools get aborted error results, exactly one `done: cancelled` is emitted, queued messages stay
        queued and the agent settles. A no-op when idle."""
        loop_task = self._loop_task
        if loop_task is None or loop_task.done():
            return
        if not self._aborting:
            self._aborting = True
            loop_task.cancel()
        if loop_task is not asyncio.current_task():
            await asyncio.wait([loop_task])
            if self._loop_task is loop_task:
                # cancelled before its first step, so its body (and the abort handling in it) never ran:
                # run the abort in a fresh loop task, which also keeps a concurrent wake from starting one
                self._loop_task = asyncio.get_running_loop().create_task(
                    self._loop(), name=f"stead-agent-{self.id}"
                )
                await asyncio.wait([self._loop_task])

    # ------------------------------------------------------------------ drain / close (X4)
    def drain(self) -> None:
        """Stop before the next provider request; durable work stays for the next owner."""
        self._draining = True
        self._set_idle()

    async def wait_stopped(self) -> None:
        task = self._loop_task
        if task is not None:
            await asyncio.wait([task])

    async def wait_idle(self) -> None:
        while True:
            await self._idle.wait()
            if self._loop_task is None and self._accepting == 0 and (self.pending is None or self._stopped):
                return
            self._idle.clear()

    def kill(self) -> None:
        """Abandon in-memory work without writing anything (used when the store died)."""
        self._draining = True
        for t in list(self.running.values()):
            t.cancel()
        if self._loop_task is not None:
            self._loop_task.cancel()

    def close_streams(self) -> None:
        for q in list(self._subscribers):
            q.put_nowait(None)

    def check_open(self) -> None:
        if self.closed:
            raise Closed(f"agent {self.id} is closed")
