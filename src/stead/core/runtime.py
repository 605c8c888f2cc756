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
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

from stead._ids import new_id
from stead.core import records as R
from stead.core.config import SETTING_NAMES, AgentConfig, Env
from stead.core.events import (
    Activated,
    BlockReset,
    Event,
    MessageConsumed,
    Settled,
)
from stead.core.hooks import HookContext, ResponseInfo
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
    dumps,
    encode_block,
    encode_usage,
)
from stead.providers.base import (
    BlockEnd,
    Done,
    DoneReason,
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
                more = await self._after_abort()
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
                    more = await self._after_abort()
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
                    await self._settle_in(tx, pending, self.last_error)
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
        self._records, self._settings = records, settings

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
                return await self._fail(turn, refusal, end_run=True)
        try:
            provider = self._provider(settings)
            request = self._request(turn, settings)
            reason, error = await self._stream(turn, provider, request)
        except ProviderError as e:
            if e.retryable and self._attempt + 1 < self.env.retry.max_attempts:
                self._attempt += 1
                await self._commit_partial(turn)
                if turn.partial:
                    self.emit(BlockReset())  # S3: the half-streamed block observers saw is dropped
                raise _Retry(self.env.retry.delay(self._attempt, e.retry_after)) from e
            if turn.partial:
                self.emit(BlockReset())
            return await self._fail(turn, str(e))
        except (asyncio.CancelledError, StoreError, _Retry):
            raise
        except Exception as e:
            log.warning("agent %s: turn failed: %r", self.id, e)
            return await self._fail(turn, f"{type(e).__name__}: {e}")
        if reason is None:
            # S3: the stream ended without a terminal event
            await self._commit_partial(turn)
            if turn.partial:
                self.emit(BlockReset())
            if self._attempt + 1 < self.env.retry.max_attempts:
                self._attempt += 1
                raise _Retry(self.env.retry.delay(self._attempt))
            return await self._fail(turn, "the model's response ended before it was complete")
        self._attempt = 0  # only a complete response resets the retry budget
        if reason in ("error", "cancelled"):
            return await self._fail(turn, error or f"the model's response ended with {reason!r}")
        return await self._finish(turn, reason)

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
                    await self._commit_held(turn)
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
    async def _write_consumption(self, tx: Tx, turn: _Turn) -> list[dict[str, Any]]:
        """Stage C1 inside `tx`: delete the queue entries, append them to history (after a reset if the
        settings demand one), persist changed settings, run the consumption hooks."""
        if turn.consumed:
            return []
        recs: list[dict[str, Any]] = []
        hooks = self.env.hooks
        old_mode = str(self.settings.get("permission_mode", "auto"))
        for q in turn.take:
            await tx.delete(self.id, q.key)
            recs.append(q.history_record())
        if turn.reset:
            await tx.clear(self.id)
            await tx.delete_prefix(self.id, "kv.h.")
            if turn.handoff is not None:
                recs.insert(0, {"k": "s", "x": turn.handoff})  # K2: the handoff opens the new conversation
        if recs:
            await tx.append(self.id, [dumps(r) for r in recs])
        if turn.settings is not self.settings:
            await tx.write(self.id, R.SETTINGS, dumps(turn.settings))
        if hooks:
            ctx = self.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
            ctx.settings = dict(turn.settings)
            new_mode = str(turn.settings.get("permission_mode", "auto"))
            if new_mode != old_mode:
                await hooks.permission_mode_changed_tx(ctx, old_mode, new_mode)
            for q in turn.take:
                await hooks.message_consumed_tx(
                    ctx,
                    Message(
                        q.role,
                        [decode_block(b) for b in q.content],
                        id=q.id,
                        metadata=q.metadata,
                    ),
                )
        return recs

    def _consumption_published(self, turn: _Turn, recs: list[dict[str, Any]]) -> None:
        if turn.consumed:
            return
        turn.consumed = True
        self._settings = turn.settings
        if turn.reset:
            self._publish_records([], reset=True)
        for q in turn.take:
            self.emit(
                MessageConsumed(
                    Message(
                        q.role,
                        [decode_block(b) for b in q.content],
                        id=q.id,
                        metadata=q.metadata,
                    )
                )
            )

    def _block_records(self, turn: _Turn, blocks: list[Block], usage: Usage | None) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = [
            {"k": "b", "i": turn.inference_id, "b": encode_block(b)} for b in blocks
        ]
        if recs and usage is not None:
            recs[-1]["u"] = encode_usage(usage)
        return recs

    async def _commit_held(self, turn: _Turn) -> None:
        """Commit completed blocks mid-response (the next block started streaming)."""
        blocks = list(turn.held)
        async with self.env.store.transaction() as tx:
            consumed = await self._write_consumption(tx, turn)
            recs = self._block_records(turn, blocks, None)
            await tx.append(self.id, [dumps(r) for r in recs])
            if self.env.hooks:
                for b in blocks:
                    await self.env.hooks.block_tx(
                        self.hook_ctx(tx, turn.pending, inference_id=turn.inference_id), b
                    )
            pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
            await tx.write(self.id, R.PENDING, pending.encode())

            def published() -> None:
                self._consumption_published(turn, consumed)
                self._publish_records(consumed + recs)
                turn.pending = pending
                self.pending = pending
                for b in blocks:
                    self.emit(BlockEnd(b))

            tx.after_commit(published)
        turn.held.clear()

    async def _commit_partial(self, turn: _Turn) -> None:
        """A response was cut off or failed retryably: keep its completed blocks; calls it emitted get
        error results (T4) so the conversation never keeps a call without one."""
        if not turn.held and (turn.consumed or not turn.take):
            return
        results = [
            ToolResult(
                c.id or "", "The response was cut off before this call could run; it was not run.", True
            )
            for c in turn.calls
        ]
        await self._commit_end(turn, results=results, note=None, settle=False, owe=True, reason="error")

    async def _finish(self, turn: _Turn, reason: str) -> bool:
        if turn.calls:
            from stead.core.batch import dispatch, run_batch

            entries = await dispatch(self, turn, reason)
            # The batch is part of this turn, whose durable state was read at its start and has been
            # written by this task since: run it now instead of re-reading what was just committed.
            await run_batch(self, turn.pending, entries)
            return True
        return await self._commit_end(turn, results=[], note=None, settle=True, owe=False, reason=reason)

    async def _fail(self, turn: _Turn, error: str, *, end_run: bool = False) -> bool:
        """C6/T4: the turn failed. Its input counts as consumed, its calls get error results, and a system
        note tells the next inference; queued work is still answered — unless `end_run` (a guardrail
        refused the inference), which settles the run with queued messages left queued, like an abort."""
        self._attempt = 0
        self.last_error = error
        results = [ToolResult(c.id or "", f"Not run: the turn failed ({error}).", True) for c in turn.calls]
        return await self._commit_end(
            turn,
            results=results,
            note=f"The last turn failed: {error}",
            settle=True,
            owe=False,
            reason="error",
            error=error,
            force_settle=end_run,
        )

    async def _commit_end(
        self,
        turn: _Turn,
        *,
        results: list[ToolResult],
        note: str | None,
        settle: bool,
        owe: bool,
        reason: str,
        error: str | None = None,
        force_settle: bool = False,
    ) -> bool:
        """The last commit of a response without a tool batch: consumption, blocks, usage, error results,
        a note; then settlement (if nothing is queued), or the pending record for what comes next."""
        blocks = list(turn.held)
        more = True
        async with self.env.store.transaction() as tx:
            consumed = await self._write_consumption(tx, turn)
            # S4: a failed or cut-off response keeps the previous usage measurement
            usage = turn.usage if reason not in ("error", "cancelled") else None
            recs = self._block_records(turn, blocks, usage)
            recs += [R.result_record(r) for r in results]
            if note is not None:
                recs.append({"k": "s", "x": note})
            if recs:
                await tx.append(self.id, [dumps(r) for r in recs])
            hooks = self.env.hooks
            if hooks:
                ctx = self.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
                for b in blocks:
                    await hooks.block_tx(ctx, b)
                await hooks.response_tx(ctx, self._response_info(turn, reason, error))
            if usage is not None and not blocks:
                # S4: the usage rides on the response's last block record; without blocks it gets a key
                await tx.write(self.id, R.USAGE, dumps(encode_usage(usage)))
            pending: Pending | None
            if owe:
                pending = turn.pending.but(turn_id=turn.inference_id, inference_id=turn.inference_id)
                await tx.write(self.id, R.PENDING, pending.encode())
            else:
                queued = await tx.read_prefix(self.id, R.QUEUE)
                if settle and (force_settle or not any(v for _, v in queued)):
                    pending = None
                    more = False  # settled below, after `published`: the response's Done precedes Settled
                else:
                    pending = turn.pending.but(turn_id=None, inference_id=None)
                    await tx.write(self.id, R.PENDING, pending.encode())

            def published() -> None:
                self._consumption_published(turn, consumed)
                self._publish_records(consumed + recs)
                turn.pending = pending or turn.pending
                if pending is not None:
                    self.pending = pending
                for b in blocks:
                    self.emit(BlockEnd(b))
                if not owe:
                    turn.done_emitted = True
                    self.emit(
                        Done(
                            cast(DoneReason, reason),
                            error=error,
                            usage=turn.usage,
                            inference_id=turn.inference_id,
                        )
                    )

            tx.after_commit(published)
            if not more:
                await self._settle_in(tx, turn.pending, error)
        turn.held.clear()
        turn.calls.clear()
        return more

    def _response_info(self, turn: _Turn, reason: str, error: str | None) -> ResponseInfo:
        return ResponseInfo(
            inference_id=turn.inference_id,
            provider=str(turn.settings.get("provider")),
            model=str(turn.settings.get("model")),
            reason=reason,
            usage=turn.usage,
            started_at=turn.started_at,
            first_token_at=turn.first_token_at,
            ended_at=time.time(),
            error=error,
        )

    # ------------------------------------------------------------------ settlement (X2)
    async def _settle_in(self, tx: Tx, pending: Pending, error: str | None) -> None:
        """Inside `tx`: delete the pending record, run the settle hook, clear run-scoped KV."""
        await tx.delete(self.id, R.PENDING)
        await tx.delete_prefix(self.id, R.RUN_KV)
        hooks = self.env.hooks
        ctx = self.hook_ctx(tx, pending) if hooks else None
        reopened: Pending | None = None
        if ctx is not None:
            await hooks.settled_tx(ctx, error)
            # X2: work accepted inside this very transaction (by the hook) re-created the pending record;
            # it was published first by its own after-commit callback and must not be overwritten here
            reopened = Pending.decode(await tx.get(self.id, R.PENDING))
        self.last_error = None

        def published() -> None:
            self.pending = reopened
            self._restored = False  # X3: a restored period that ended unannounced (aborted) is over
            self.emit(Settled(pending.run_id, error))
            if ctx is not None:
                ctx.tx = None
                task = asyncio.get_running_loop().create_task(hooks.settled(ctx, error))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

        tx.after_commit(published)

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

    async def _after_abort(self) -> bool:
        turn = self._turn
        for t in list(self.running.values()):
            t.cancel()
        try:
            while True:
                try:
                    await self._commit_abort(turn)
                    return False
                except StoreCrashed:
                    self._draining = True
                    return False
                except StoreError:
                    await asyncio.sleep(self.env.store_retry_delay)
        finally:
            self._turn = None

    async def _commit_abort(self, turn: _Turn | None) -> None:
        """One transaction: the aborted turn's input, finished blocks and error results, then settlement."""
        from stead.core.batch import abort_batch

        async with self.env.store.transaction() as tx:
            pending = Pending.decode(await tx.get(self.id, R.PENDING))
            if pending is None:
                return
            recs: list[dict[str, Any]] = []
            consumed: list[dict[str, Any]] = []
            if turn is not None:
                consumed = await self._write_consumption(tx, turn)
                recs += self._block_records(turn, list(turn.held), None)  # S4: cancelled: no measurement
                recs += [
                    R.result_record(ToolResult(c.id or "", "Aborted before it ran.", True))
                    for c in turn.calls
                ]
                if recs:
                    await tx.append(self.id, [dumps(r) for r in recs])
            aborted_calls = await abort_batch(self, tx)
            recs += aborted_calls
            # one `done: cancelled` for the cancelled turn, also when it was running its tool batch (X1)
            done_needed = turn is None or not turn.done_emitted or bool(aborted_calls)
            partial = turn is not None and turn.partial
            inf_id = turn.inference_id if turn is not None else None

            def published() -> None:
                if turn is not None:
                    self._consumption_published(turn, consumed)
                self._publish_records(consumed + recs)
                if partial:
                    self.emit(BlockReset())
                if done_needed:
                    self.emit(Done("cancelled", inference_id=inf_id))

            tx.after_commit(published)
            await self._settle_in(tx, pending, "aborted")  # after `published`: Done precedes Settled

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

    async def events(self) -> AsyncIterator[Event]:
        q = self.subscribe()
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    return
                yield ev
        finally:
            self.unsubscribe(q)

    def close_streams(self) -> None:
        for q in list(self._subscribers):
            q.put_nowait(None)

    def check_open(self) -> None:
        if self.closed:
            raise Closed(f"agent {self.id} is closed")
