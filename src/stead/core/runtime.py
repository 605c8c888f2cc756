"""The durable loop of one agent (docs/promises.md): run the next stage until nothing is owed; abort; drain.

The one rule everything follows: durable state changes in a transaction, and memory (the mirror, events)
changes only in that transaction's after-commit callbacks (`stead.core.mirror`). The pending record alone
says whether work is owed; every stage starts by reading it, the queues and the dispatched batch inside a
transaction, so the store — not memory — decides what happens next (C4).

Commits on the hot path (one user message, K tool round trips, a final answer — 2K+2 commits):
  accept              queue entry + identity + pending (activation)              1   stead.core.admission
  response with calls consumption + blocks + batch entries + pending=tools       1   stead.core.batch
  each result         result record + entry deleted (+ pending=inference)        1   stead.core.batch
  final answer        consumption + blocks + usage + settlement (or reopen)      1   stead.core.response
Below this module: inference turns (`inference`), tool batches (`batch`), the commits of a response
(`response`), consumption (`consume`), settlement (`settle`), abort (`abort`), admission (`admission`),
the agent's volatile state (`state`) and its mirror (`mirror`), held calls (`gate`, `decide`).

Waiting: when every unanswered call of the dispatched batch is held for a decision (`stead.core.gate`), the
loop stops without a provider request and the agent is `waiting`: `wait_idle` returns, the pending record
stays. A decision, a new message or an abort wakes it; a steered message rejects the held calls in its
consumption transaction (`stead.core.decide`). An agent whose only running calls wait on something outside
(a delegation whose child waits, `ToolContext.awaiting_input`) counts as waiting too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from stead._ids import new_id
from stead.core import records as R
from stead.core.abort import after_abort
from stead.core.admission import Inbound
from stead.core.batch import decode_batch, run_batch
from stead.core.compaction import at_boundary, compaction_stage, due, reject_waiters
from stead.core.config import AgentConfig, Env
from stead.core.consume import apply_settings, plan
from stead.core.decide import reject_for_steer
from stead.core.events import Activated, BlockReset
from stead.core.gate import decode_gates
from stead.core.hooks import RunContext
from stead.core.inference import Retry, find_provider, inference
from stead.core.outcome import Outcome
from stead.core.records import Pending, Queued
from stead.core.response import fail
from stead.core.settle import settle_in
from stead.core.state import AgentState, inside_agent
from stead.errors import Closed, LeaseLost, StoreCrashed, StoreError
from stead.messages import ToolResult, repair_text

__all__ = ["POISON_ATTEMPTS", "AgentRuntime", "Inbound", "inside_agent"]

log = logging.getLogger("stead.core")

POISON_ATTEMPTS = 3
"""C7: how many times in a row a stage may fail the same way (the store answering) before it stops."""


def _why(error: Exception) -> str:
    """A failure's one-line description: the same for the same input, different for different failures
    (an encoding error without the position, which may move with the ids in a record)."""
    if isinstance(error, UnicodeError):
        text = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
    else:
        first = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {first[0] if first else ''}".rstrip(": ")
    return repair_text(text[:300])


class AgentRuntime(AgentState):
    """The kernel of one agent. Created and owned by `AgentSystem`; users hold `stead.Agent`."""

    def __init__(self, agent_id: str, config: AgentConfig, env: Env) -> None:
        super().__init__(agent_id, config, env)
        self._loop_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._drained = asyncio.Event()  # set by drain(): a retry delay in progress ends early (X4)
        self._accepting = 0
        self.loop_runs = 0
        """How many times the loop's body has started; each start reads the store afresh, so a wake-up
        request made before a start is answered by it (`stead.core.fleet` uses this to skip waking an
        agent whose loop already looked after the request)."""
        self._stage_read = False
        self._poison: tuple[tuple[str, str], str, int] | None = None
        """The poison-input breaker (C7): (run id, stage), why the stage failed, how often in a row."""
        self.owned = True
        """This process runs the agent's loop. False on a PostgreSQL client, or on a worker for an agent
        another worker owns (`stead.core.fleet`): its handle accepts, reads and aborts, but never runs it."""

    # ------------------------------------------------------------------ ownership (stead.core.fleet)
    def disown(self, *, released: bool = False) -> None:
        """The lease is gone (lost, or released): stop the loop and the tools without writing or emitting
        anything, and drop everything this process knew about the agent; the next owner reloads it. A
        `released` agent (handed over after a drain) keeps its last committed pending record, so its
        handle still reports the work it owes."""
        self.owned = False
        pending = self.pending
        current = asyncio.current_task()
        for t in list(self.running.values()):
            if t is not current:
                t.cancel()
        if self._loop_task is not None and self._loop_task is not current:
            self._loop_task.cancel()
        self._forget()
        if released:
            self.pending = pending

    def adopt(self, pending: Pending | None) -> None:
        """This process now owns the agent (a claim): start from what the store says, as after a restart."""
        self._forget()
        self.owned = True
        self.draining = False
        self._drained.clear()
        self.blocked = None
        if pending is not None:
            self.restore(pending)
        else:
            self._set_idle()

    def _forget(self) -> None:
        self.turn = None
        self.pending = None
        self.restored = False
        self.aborting = False
        self.waiting = False
        self.attempt = 0
        self.last_error = None
        self._poison = None
        self.committing = None
        self.qseq.clear()
        self.dispatched_here.clear()
        self.outcomes.clear()
        self.running.clear()
        self.call_kvs.clear()
        self.executing.clear()
        self.awaiting_calls.clear()
        self.context_run = None
        self.context = None
        self._records = None
        self._builder = None
        self._messages = None
        self._settings = None
        self._set_idle()

    # ------------------------------------------------------------------ acceptance (stead.core.admission)
    def begin_accept(self) -> None:
        """An acceptance for this agent is in flight (`wait_idle` must not report idle meanwhile)."""
        self._accepting += 1
        self._idle.clear()

    def end_accept(self) -> None:
        self._accepting -= 1
        self._set_idle()

    # ------------------------------------------------------------------ state
    @property
    def _stopped(self) -> bool:
        return self.draining or self.closed or self.blocked is not None or not self.owned

    def _set_idle(self) -> None:
        if self.idle:
            self._idle.set()
        else:
            self._idle.clear()

    @property
    def idle(self) -> bool:
        """Nothing runs here but waiting: no acceptance in flight, and no loop with nothing owed (or stopped
        here), or the agent waits for decisions on held calls (or its running calls all wait on input)."""
        if self._accepting:
            return False
        if self._loop_task is None:
            return self.pending is None or self._stopped or self.waiting
        return self.waiting_on_calls

    @property
    def waiting_on_calls(self) -> bool:
        """The loop runs only calls that all wait for input from outside (`ToolContext.awaiting_input`)."""
        return bool(self.executing) and self.executing <= self.awaiting_calls

    def call_awaits_input(self, call_id: str, waiting: bool) -> None:
        """A running call starts or stops waiting for input from outside (a delegated child's approval)."""
        if waiting:
            self.awaiting_calls.add(call_id)
        else:
            self.awaiting_calls.discard(call_id)
        self._set_idle()

    @property
    def state_waiting(self) -> bool:
        """Whether the agent has nothing left to do but wait for decisions."""
        return (
            self.pending is not None
            and not self._stopped
            and ((self._loop_task is None and self.waiting) or self.waiting_on_calls)
        )

    # ------------------------------------------------------------------ the loop
    def wake(self) -> None:
        """Start the loop if work is owed and it is not running."""
        if self.blocked is not None and not self.draining and not self.closed:
            self.blocked = None  # new input may carry a provider this process has
        self.waiting = False  # a decision or new input: the next stage looks again
        if self._loop_task is None and self.pending is not None and not self._stopped:
            self._idle.clear()
            self._loop_task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"stead-agent-{self.id}"
            )
        self._set_idle()

    def restore(self, pending: Pending) -> None:
        """Mark as restored after a restart (R1): the next stage announces `restored=True`."""
        self.pending = pending
        self.restored = True
        self.wake()

    async def _loop(self) -> None:
        self.loop_runs += 1
        inside_agent.set(self.id)
        if self.env.pin_lease is not None:
            self.env.pin_lease(self.id)  # W6: a loop outliving its lease commits nothing
        task = asyncio.current_task()
        assert task is not None
        # a retry delay is slept inside the try below, so that an abort during the wait is handled (X1);
        # so is the poison-input breaker's look at the stage that just failed (C7)
        backoff: float | None = None
        failed: Exception | None = None
        try:
            if self.aborting and self.turn is None:
                # restarted by abort() after a cancellation that came before the previous task's first step
                more = await after_abort(self)
                self.aborting = False
                if not more:
                    return
            while not self._stopped:
                try:
                    try:
                        if failed is not None:
                            error, failed = failed, None
                            if await self._breaker(error):
                                backoff = None  # the failure is written instead (or the agent stopped)
                                continue
                        if backoff is not None:
                            delay, backoff = backoff, None
                            await asyncio.sleep(delay)
                            continue
                        more = await self._stage()
                        self._poison = None
                    except Retry as r:
                        # a drain ends the wait: the stage then stops before the next provider request (X4)
                        if not self.draining:
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(self._drained.wait(), r.delay)
                        continue
                except asyncio.CancelledError:
                    if not self.aborting:
                        raise  # the system abandoned or killed this agent
                    task.uncancel()
                    more = await after_abort(self)
                    self.aborting = False
                except LeaseLost as e:
                    self._lease_lost(e)
                    return
                except (StoreCrashed, Closed):
                    # the store is dead or closed (this process is as good as killed): stop for good
                    # instead of restarting the loop forever; the durable work stays for the next owner
                    self.draining = True
                    return
                except StoreError as e:
                    log.warning("agent %s: store error, retrying the stage: %s", self.id, e)
                    backoff = self.env.store_retry_delay
                    failed = e if self._stage_read else None
                    continue
                except Exception as e:
                    log.exception("agent %s: unexpected error in the loop", self.id)
                    backoff = self.env.store_retry_delay
                    failed = e if self._stage_read else None
                    continue
                if not more:
                    break
        except LeaseLost as e:  # raised while settling an abort (stead.core.abort)
            self._lease_lost(e)
        except (KeyboardInterrupt, SystemExit):
            # a real Ctrl-C (T8: a tool's own is its error result) or an exit: the process is ending, and
            # a loop started again here would run the unfinished calls a second time
            self.draining = True
            raise
        finally:
            self._loop_task = None
            self.turn = None
            self._set_idle()
            if self.pending is not None and not self._stopped and not self.aborting and not self.waiting:
                # work was accepted (or a held call decided) after the loop decided to stop: never strand it
                self.wake()
            elif self.compaction_waiters and self._loop_task is None:
                # K1: a compaction nobody will run here (drained, closed, blocked, settled) is rejected
                why = self.blocked or ("it is closed" if self.closed else "it stopped")
                reject_waiters(self, f"agent {self.id} will not run the compaction here: {why}")

    def _lease_lost(self, e: LeaseLost) -> None:
        """W2: another worker holds the agent now: stop here for good, never retry, write and emit nothing."""
        if e.retaken and self.owned:
            # W6: a loop that outlived a lease this process took again stops; a new loop runs it. What the
            # old loop computed is not committed under the new lease (a durable call runs again), whether
            # the new loop looks before or after the old one's run returned
            self.outcomes.clear()
            return
        log.warning("agent %s: lease lost, stopping its loop in this process: %s", self.id, e)
        self.disown()
        lost = self.env.lease_lost
        if lost is not None:
            lost(self.id)

    async def _stage(self) -> bool:
        """Read durable state and run the next stage. Returns whether the loop should continue."""
        self.turn = None
        self._stage_read = False
        self.committing = None
        take: list[Queued] | None = []
        steer_rejects = False
        async with self.env.store.transaction() as tx:
            pending = Pending.decode(await tx.get(self.id, R.PENDING))
            if pending is None:
                tx.after_commit(self._mark_settled_mirror)
                return False
            if not self.loaded or (pending.stage == "inference" and self.lacks_results()):
                await self.load(tx, self.id)  # C4: also when another process answered a call
            restored = self.restored
            if restored and self.hooks.wants("activated_tx"):
                await self.hooks.activated_tx(self.hook_ctx(tx, pending, restored=True))
            raw_queue = await tx.read_prefix(self.id, R.QUEUE)
            requested = any(k == R.COMPACT for k, _ in raw_queue)
            queued = [Queued.decode(k, v) for k, v in raw_queue if v and k != R.COMPACT]
            entries = await tx.read_prefix(self.id, R.TOOL) if pending.stage == "tools" else []
            if self.context_run != pending.run_id and self.hooks.wants("run_context"):
                # R4: the run's context, as made durable by its first inference (here or before a restart)
                raw_context = await tx.get(self.id, R.RUN_CONTEXT)
                if raw_context is not None:
                    found, run_id = RunContext.decode(json.loads(raw_context)), pending.run_id
                    tx.after_commit(lambda: self._publish_context(run_id, found))
            if restored:
                announced = pending
                tx.after_commit(lambda: self._announce_restored(announced))
            gates = decode_gates(entries) if entries else {}
            if pending.stage == "tools" and not entries:
                # every call was answered but the pending record still says tools (a decision raced the
                # batch's last commit): continue with the inference the results are owed
                inf = new_id()
                pending = pending.but(stage="inference", turn_id=inf, inference_id=inf)
                await tx.write(self.id, R.PENDING, pending.encode())
                published = pending
                tx.after_commit(lambda: setattr(self, "pending", published))
                return True
            if gates and all(call.id in gates and gates[call.id].held for _, call in decode_batch(entries)):
                # nothing of the batch can run before a decision: no provider request (wait), unless a
                # steered message came instead of a decision (it rejects the held calls)
                take = plan(
                    self, pending.but(inference_id=None), [q for q in queued if q.key.startswith(R.STEER)]
                )
                if not take:
                    tx.after_commit(self._mark_waiting)
                    return False
                steer_rejects = True
            elif pending.stage not in ("tools", "compaction"):
                take = plan(self, pending, queued)
                reason = self._compaction_due(pending, take, requested)
                if reason is not None:
                    # K1: a safe boundary; the decision is durable (R2: pending compaction runs first)
                    pending = pending.but(stage="compaction", compaction=reason)
                    await tx.write(self.id, R.PENDING, pending.encode())
                elif take is None:
                    error = self.last_error
                    await settle_in(self, tx, pending, Outcome.FAILED if error else Outcome.COMPLETED, error)
                    return False
        self.pending = pending
        self._stage_read = True  # the store answered this stage's reads: a later failure may be poison (C7)
        if steer_rejects:
            assert take
            await reject_for_steer(self, pending, take)  # False: a decision came first; the next stage runs
            return True
        if pending.stage == "tools":
            await run_batch(self, pending, decode_batch(entries), gates)
            return True
        if pending.stage == "compaction":
            if self.draining:
                return False  # X4: the summary would be a provider request; the stage stays durable
            return await compaction_stage(self, pending)
        if self.draining or take is None:
            return False  # X4: stop before the next provider request
        settings = apply_settings(self, take)[0]
        if find_provider(self, settings) is None:
            # This process cannot serve the agent (its provider is not registered here): leave the durable
            # work untouched for a process that can, instead of failing the turn.
            self.blocked = f"provider {settings.get('provider')!r} is not registered"
            log.warning("agent %s is blocked: %s", self.id, self.blocked)
            return False
        self.blocked = None
        return await inference(self, pending, take)

    # ------------------------------------------------------------------ the poison-input breaker (C7)
    async def _breaker(self, error: Exception) -> bool:
        """C7: the stage failed after the store answered its reads. The same stage failing the same way
        `POISON_ATTEMPTS` times in a row, while the store takes other writes, is input the store refuses
        (text it cannot encode, a value a plugin's table rejects), not an outage: stop retrying it. An
        inference turn fails (C6) without its output; a tool result that cannot be committed becomes an
        error result naming the error; anything else — or the same failure again — leaves the agent
        `blocked` (new input tries once more). Returns whether the loop goes on without a retry delay."""
        pending = self.pending
        if pending is None:
            return False
        key, why = (pending.run_id, pending.stage), _why(error)
        last = self._poison
        count = last[2] + 1 if last is not None and last[:2] == (key, why) else 1
        self._poison = (key, why, count)
        if count < POISON_ATTEMPTS or not await self._store_takes_writes():
            return False
        told = f"the store refused to write it {count} times in a row ({why})"
        log.error("agent %s: poison input: %s", self.id, told)
        try:
            if count == POISON_ATTEMPTS and await self._drop_poison(pending, told):
                return True
        except (asyncio.CancelledError, LeaseLost):
            raise
        except Exception:
            log.exception("agent %s: the failure of a poisoned stage could not be written either", self.id)
        self.blocked = f"its writes keep failing: {told}"
        log.error("agent %s is blocked: %s", self.id, self.blocked)
        return True

    async def _store_takes_writes(self) -> bool:
        """Whether the store commits a write for this agent now (its pending record, unchanged): failures
        while it does not are an outage, retried as ever."""
        try:
            async with self.env.store.transaction() as tx:
                raw = await tx.get(self.id, R.PENDING)
                if raw is not None:
                    await tx.write(self.id, R.PENDING, raw)
        except (StoreCrashed, Closed):
            self.draining = True
            return False
        except LeaseLost:
            raise
        except StoreError:
            return False
        return True

    async def _drop_poison(self, pending: Pending, told: str) -> bool:
        """Write the failure in place of what could not be written (C7); False when there is no such
        failure to write for this stage."""
        turn = self.turn
        if pending.stage == "inference" and turn is not None and turn.pending.run_id == pending.run_id:
            if (turn.partial or turn.held) and self.listening:
                self.emit(BlockReset())  # S3: what observers saw of the refused output is dropped
            turn.held.clear()
            turn.calls.clear()
            turn.partial = False
            await fail(self, turn, f"its output could not be stored: {told}")
            return True
        cid = self.committing
        if pending.stage == "tools" and cid is not None:
            # the call ran (a transactional one's writes rolled back with its refused commit): it is
            # answered with this error result and never runs again
            self.outcomes[cid] = ToolResult(
                cid, f"The result of this call could not be stored ({told}); it is not run again.", True
            )
            return True
        return False

    def _mark_waiting(self) -> None:
        """After the stage's read: every unanswered call is held; published while the store lock was held,
        so a decision committed after this read always finds the flag set and wakes the agent."""
        self.waiting = True

    def _compaction_due(self, pending: Pending, take: list[Queued] | None, requested: bool) -> str | None:
        """K1: why to compact now (`requested`, `auto`), or None — only at a safe boundary."""
        if not at_boundary(self, pending):
            return None
        if requested:
            return "requested"
        if take is None:
            return None  # nothing owed: the run settles, and the next one measures before its first request
        settings, reset = apply_settings(self, take)
        if reset:
            return None  # K2: the conversation is about to be reset anyway
        return "auto" if due(self, pending, take, settings) else None

    def _announce_restored(self, pending: Pending) -> None:
        self.restored = False
        if self.listening:
            self.emit(Activated(pending.run_id, restored=True))
            if pending.stage == "inference" and pending.inference_id is not None:
                self.emit(BlockReset())  # an open request died with the previous process (R2)

    def _publish_context(self, run_id: str, context: RunContext) -> None:
        self.context_run, self.context = run_id, context

    def _mark_settled_mirror(self) -> None:
        self.pending = None
        self.restored = False

    # ------------------------------------------------------------------ abort (X1, stead.core.abort)
    async def abort(self) -> None:
        """Cancel the whole current turn. Finished blocks stay, the streaming block is dropped, running
        tools get aborted error results, exactly one `done: cancelled` is emitted, queued messages stay
        queued and the agent settles. A no-op when idle. For an agent another process runs (PostgreSQL),
        its owner is asked to abort (best effort: no effect if it has no turn in flight)."""
        if not self.owned:
            remote = self.env.remote_abort
            if remote is not None:
                await remote(self.id)
            return
        loop_task = self._loop_task
        if loop_task is None or loop_task.done():
            if self.waiting and self.pending is not None and not self._stopped:
                # X1: a waiting agent has no loop to cancel: run the abort (it cancels the held calls)
                self.aborting = True
                self.waiting = False
                self._loop_task = asyncio.get_running_loop().create_task(
                    self._loop(), name=f"stead-agent-{self.id}"
                )
                self._idle.clear()
                await asyncio.wait([self._loop_task])
            return
        if not self.aborting:
            self.aborting = True
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
        self.draining = True
        self._drained.set()
        self._set_idle()

    async def wait_stopped(self) -> None:
        task = self._loop_task
        if task is not None:
            await asyncio.wait([task])

    async def wait_idle(self) -> None:
        while True:
            await self._idle.wait()
            if self.idle:
                return
            self._idle.clear()

    def kill(self) -> None:
        """Abandon in-memory work without writing anything (used when the store died)."""
        self.draining = True
        for t in list(self.running.values()):
            t.cancel()
        if self._loop_task is not None:
            self._loop_task.cancel()

    def check_open(self) -> None:
        if self.closed:
            raise Closed(f"agent {self.id} is closed")
