"""One inference turn: build the provider request, stream the response, hold its blocks, retry what may be
retried, and end it — with a tool batch (`stead.core.batch`), a final answer (`stead.core.response`), or a
failure note (C6).

The request's context is the committed conversation plus the staged input (R4: a restarted process
builds the same context from the store). Deltas go to observers live; completed blocks are held and
committed at the next block boundary (S1). A retryable provider error or a stream that ends without a
terminal event keeps the completed blocks, drops the half-streamed one (`block_reset`, S3) and raises
`Retry` for the loop to sleep and run the stage again; the retry budget (attempts, or seconds with
`RetryPolicy.max_elapsed`) resets only on a complete response. Every request carries an output cap
(`ProviderRequest.max_output_tokens`, MR1): the agent's `max_output_tokens`, else the catalog's output limit
for its model, never more than the window minus the request's estimated size.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from stead._ids import new_id
from stead._tokens import estimate_messages, estimate_record, estimate_text, estimate_tools
from stead.core import records as R
from stead.core.batch import dispatch, run_batch
from stead.core.compaction import OVERFLOW_KEY, context_tokens, output_cap, write_state
from stead.core.consume import apply_settings
from stead.core.events import BlockReset
from stead.core.expire import expire
from stead.core.hooks import InstructionsInfo, ModelChangedInfo
from stead.core.records import Pending, Queued
from stead.core.response import commit_end, commit_held, commit_partial, fail, repaired, response_info
from stead.core.state import AgentState, Turn
from stead.core.structured import answer_errors
from stead.errors import ProviderError, StoreError, context_overflow
from stead.messages import Message, Text, ToolCall, Usage, dumps, encode_block, repair_text
from stead.providers.base import (
    BlockEnd,
    Done,
    ModelOptions,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
    UsageEvent,
)

__all__ = ["Retry", "find_provider", "inference", "owes_fresh_inference", "retry_delay"]

log = logging.getLogger("stead.core")


class Retry(Exception):
    """Stop this stage and run the stage again after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay


def owes_fresh_inference(st: AgentState, pending: Pending) -> str:
    """R2: reuse the pending inference id unless its response already produced a durable block."""
    inf = pending.inference_id
    if inf is None:
        return new_id()
    for rec in reversed(st.records or []):
        kind = rec.get("k")
        if kind == "b" and rec.get("i") == inf:
            return new_id()
        if kind not in ("b", "t"):
            break
    return inf


def find_provider(st: AgentState, settings: dict[str, Any]) -> Provider | None:
    provider = st.env.providers.get(str(settings.get("provider")))
    if provider is None and st.env.resolve_provider is not None:
        provider = st.env.resolve_provider(settings)
    return provider


async def inference(st: AgentState, pending: Pending, take: list[Queued]) -> bool:
    """Run one inference turn consuming `take`. Returns whether the loop goes on."""
    inf_id = owes_fresh_inference(st, pending)
    settings, reset = apply_settings(st, take)
    turn = Turn(inf_id, pending, take, settings=settings, reset=reset, started_at=time.time())
    st.turn = turn
    hooks = st.hooks
    if (reset and hooks.wants("model_changed")) or hooks.wants("before_inference"):
        ctx = st.hook_ctx(None, pending, inference_id=inf_id)
        ctx.settings = dict(settings)
        if reset:
            # K2: the hook may open the reset conversation with a handoff message (a decision, made
            # before the request so the live and the reloaded context are the same, R4)
            turn.handoff = await hooks.model_changed(ctx, ModelChangedInfo(dict(st.settings), dict(settings)))
        refusal = await hooks.before_inference(ctx)
        if refusal is not None:
            return await fail(st, turn, refusal, end_run=True)
    try:
        if hooks.wants("run_context"):
            await _run_context(st, turn)
        provider = _provider(st, settings)
        instructions = st.config.instructions
        if hooks.wants("instructions"):
            ctx = st.hook_ctx(None, pending, inference_id=inf_id)
            ctx.settings = dict(settings)
            instructions = await hooks.instructions(ctx, InstructionsInfo(instructions))
        schema = await _output_schema(st, turn.pending)
        request = _request(st, turn, settings, instructions, schema)
        reason, error = await _stream(st, turn, provider, request)
    except ProviderError as e:
        limit = context_overflow(e)
        if limit is not False and not turn.held and not turn.partial and not turn.consumed:
            # K1 overflow recovery: nothing of this response was kept, so this is still the boundary before
            # it; compact aggressively (once per run) and retry under a fresh inference id
            return await _overflow(st, turn, e, None if isinstance(limit, bool) else limit)
        delay = retry_delay(st, e.retry_after) if e.retryable else None
        if delay is not None:
            await commit_partial(st, turn)
            if turn.partial and st.listening:
                st.emit(BlockReset())  # S3: the half-streamed block observers saw is dropped
            raise Retry(delay) from e
        if turn.partial and st.listening:
            st.emit(BlockReset())
        return await fail(st, turn, str(e))
    except (asyncio.CancelledError, StoreError, Retry):
        raise
    except Exception as e:
        log.warning("agent %s: turn failed: %r", st.id, e)
        return await fail(st, turn, f"{type(e).__name__}: {e}")
    if reason is None:
        # S3: the stream ended without a terminal event
        await commit_partial(st, turn)
        if turn.partial and st.listening:
            st.emit(BlockReset())
        delay = retry_delay(st)
        if delay is not None:
            raise Retry(delay)
        return await fail(st, turn, "the model's response ended before it was complete")
    st.attempt = 0  # only a complete response resets the retry budget
    if reason in ("error", "cancelled"):
        return await fail(st, turn, error or f"the model's response ended with {reason!r}")
    if turn.usage is None:
        turn.usage = _estimated_usage(st, turn, request)
    if schema is not None and not turn.calls and reason == "stop":
        # a typed result: the final answer must fit the schema, or the run fails saying why
        _, problems = answer_errors("".join(b.text for b in turn.held if isinstance(b, Text)), schema)
        if problems:
            return await fail(st, turn, "the answer does not match the output schema: " + "; ".join(problems))
    return await _finish(st, turn, reason)


def retry_delay(st: AgentState, retry_after: float | None = None) -> float | None:
    """The delay before the next attempt of a failed request (counted in `st.attempt`), or None when the
    retry policy's budget — attempts, or seconds since the streak's first failure — is spent (MR3)."""
    now = time.monotonic()
    if st.attempt == 0:
        st.retry_since = now
    delay = st.env.retry.next_delay(st.attempt + 1, now - st.retry_since, retry_after)
    if delay is not None:
        st.attempt += 1
    return delay


def _request_size(st: AgentState, turn: Turn, request: ProviderRequest) -> int:
    """The estimated size of a request: the previous measurement plus what was appended since
    (`context_tokens`), or — first request, or a reset conversation — the whole request."""
    return _size_of(st, turn, request.instructions, request.tools, request.messages)


def _size_of(
    st: AgentState, turn: Turn, instructions: str, tools: list[ToolSpec], messages: list[Message]
) -> int:
    if st.records and not turn.reset:
        return context_tokens(st, turn.pending, turn.take)
    return estimate_text(instructions) + estimate_tools(tools) + estimate_messages(messages)


async def _output_schema(st: AgentState, pending: Pending) -> dict[str, Any] | None:
    """The output schema of the run: its own (read from the store once per run) or the agent's."""
    if not pending.structured:
        return st.config.output_schema
    cached = st.run_schema
    if cached is not None and cached[0] == pending.run_id:
        return cached[1]
    async with st.env.store.transaction() as tx:
        raw = await tx.get(st.id, R.OUTPUT_SCHEMA)
    schema = json.loads(raw) if raw is not None else None
    if not isinstance(schema, dict):
        schema = st.config.output_schema
    st.run_schema = (pending.run_id, schema)
    return schema


def _estimated_usage(st: AgentState, turn: Turn, request: ProviderRequest) -> Usage:
    """The server reported no usage: estimate it (flagged `estimated`), never record 0."""
    out = sum(estimate_record({"k": "b", "b": encode_block(b)}) for b in turn.held)
    return Usage(_request_size(st, turn, request), out, 0, None, True)


async def _overflow(st: AgentState, turn: Turn, error: ProviderError, window: int | None) -> bool:
    """The provider said the request does not fit. The first time in a run: enter the compaction stage
    (reason `overflow`) with the failed request recorded and its id retired. Again in the same run: the
    turn fails with a note naming the largest record."""
    async with st.env.store.transaction() as tx:
        used = await tx.get(st.id, OVERFLOW_KEY)
        if used is None:
            pending = turn.pending.but(stage="compaction", compaction="overflow")
            await tx.write(st.id, OVERFLOW_KEY, dumps(window or 0))
            await tx.write(st.id, R.PENDING, pending.encode())
            learned = window or st.learned_window
            if learned != st.learned_window:
                # the server named its window: automatic compaction uses it from now on
                await write_state(st, tx, st.compaction_failures, learned)
            if st.hooks.wants("response_tx"):
                ctx = st.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
                await st.hooks.response_tx(ctx, response_info(turn, "error", str(error)))

            def published() -> None:
                st.pending = pending
                st.learned_window = learned

            tx.after_commit(published)
    if used is None:
        st.turn = None
        return True
    return await fail(st, turn, f"{error}; {_largest(st, turn)}")


def _largest(st: AgentState, turn: Turn) -> str:
    """A note naming the record that takes most of the context (what still does not fit)."""
    recs = list(st.records or []) + [q.history_record() for q in turn.take]
    if not recs:
        return "the conversation is empty: the instructions and tools alone do not fit"
    names: dict[str, str] = {}
    best, best_n = recs[0], -1
    for raw in recs:
        rec = R.decode_record(raw)
        if isinstance(rec, R.BlockRecord) and isinstance(rec.block, ToolCall):
            names[str(rec.block.id)] = rec.block.name
        n = estimate_record(raw)
        if n > best_n:
            best, best_n = raw, n
    top = R.decode_record(best)
    if isinstance(top, R.ResultRecord):
        cid = top.result.call_id
        what = f"the result of {names.get(cid, 'a tool')} (call {cid})"
    elif isinstance(top, R.InputRecord):
        what = f"the {top.role} message {top.id}"
    elif isinstance(top, R.BlockRecord):
        what = f"an assistant block of response {top.inference_id}"
    else:
        what = "a system note"
    return (
        f"it still does not fit after compacting once: the largest record is {what}, about {best_n:,} tokens"
    )


async def _finish(st: AgentState, turn: Turn, reason: str) -> bool:
    if turn.calls:
        batch, gates = await dispatch(st, turn, reason)
        # The batch is part of this turn, whose durable state was read at its start and has been
        # written by this task since: run it now instead of re-reading what was just committed.
        await run_batch(st, turn.pending, batch, gates)
        return True
    return await commit_end(st, turn, results=[], note=None, settle=True, owe=False, reason=reason)


async def _run_context(st: AgentState, turn: Turn) -> None:
    """The run's context: the durable one (R4), or — before the run's first durable write — the hooks'
    answer, asked outside any transaction and staged with the turn's first durable write."""
    run_id = turn.pending.run_id
    if st.context_run == run_id:
        turn.context = st.context
        return
    ctx = st.hook_ctx(None, turn.pending, inference_id=turn.inference_id)
    ctx.settings = dict(turn.settings)
    ctx.message = turn.take[0].message() if turn.take else None
    found = await st.hooks.run_context(ctx)
    if found is not None:
        turn.context, turn.context_new = found, True


def _provider(st: AgentState, settings: dict[str, Any]) -> Provider:
    provider = find_provider(st, settings)
    if provider is None:
        raise ProviderError(f"no provider named {settings.get('provider')!r} is registered", retryable=False)
    return provider


def _request(
    st: AgentState,
    turn: Turn,
    settings: dict[str, Any],
    instructions: str,
    schema: dict[str, Any] | None = None,
) -> ProviderRequest:
    staged = [q.message() for q in turn.take]
    history = st.messages() if not turn.reset else []
    after = st.config.context.expire_tool_results_after_turns
    if after is not None and history:
        history = expire(history, after)
    if turn.reset and turn.handoff is not None:
        history = [Message("system", [Text(turn.handoff)])]
    specs = []
    tools = st.env.tools
    for name in st.offered_tools(turn.pending):
        t = tools.get(name)
        if t is not None:
            specs.append(ToolSpec(t.name, t.description, t.parameters))
    context = turn.context
    if context is not None and context.text:
        # one system message right after the instructions, in every request of the run (R4)
        history = [Message("system", [Text(context.text)]), *history]
    messages = history + staged if staged else list(history)
    # MR1: every request carries an output cap (the agent's, else the model's limit; within the window)
    cap = output_cap(st, settings, _size_of(st, turn, instructions, specs, messages))
    return ProviderRequest(
        model=str(settings.get("model", st.config.model)),
        instructions=instructions,
        messages=messages,
        tools=specs,
        agent_id=st.id,
        inference_id=turn.inference_id,
        effort=settings.get("effort"),
        max_output_tokens=cap,
        model_options=ModelOptions.decode(st.config.model_options),
        output_schema=schema,
    )


async def _stream(
    st: AgentState, turn: Turn, provider: Provider, request: ProviderRequest
) -> tuple[str | None, str | None]:
    """Stream one response. Completed blocks are held and committed at the next block boundary or at
    the end (S1); deltas go to observers live."""
    seen_ids: set[str] = set()
    turn.streaming = True
    reason: str | None = None
    error: str | None = None
    stream = provider.stream(request)
    async for ev in stream:
        if isinstance(ev, TextDelta | ReasoningDelta):
            if turn.first_token_at is None:
                turn.first_token_at = time.time()
            if not turn.partial and turn.held and not turn.calls:
                await commit_held(st, turn)
            turn.partial = True
            if st.listening:
                text = repair_text(ev.text)  # S5 (the block it belongs to is repaired at its end)
                st.emit(ev if text is ev.text else type(ev)(text))
        elif isinstance(ev, BlockEnd):
            turn.partial = False
            block = repaired(st, ev.block, "model output")
            if isinstance(block, ToolCall):
                cid = block.id or new_id()
                if cid in seen_ids:
                    log.warning("agent %s: duplicate tool call id %s dropped", st.id, cid)
                    continue
                seen_ids.add(cid)
                block = ToolCall(block.name, block.arguments, cid, block.repaired)
                turn.calls.append(block)
            if turn.first_token_at is None:
                turn.first_token_at = time.time()
            turn.held.append(block)
        elif isinstance(ev, UsageEvent):
            turn.usage = ev.usage
            if st.listening:
                st.emit(ev)
        elif isinstance(ev, Done):
            reason, error = ev.reason, ev.error
            turn.model_call = ev.model_call
            break
    turn.streaming = False
    if reason is not None:
        # left at its terminal event: close it now. Left to the garbage collector, an async generator is
        # closed by a task the loop's finalizer hook schedules (call_soon_threadsafe: a wake-up write on
        # the loop's socket) — per response, that showed in the profile
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                # the response is complete; a provider's failing clean-up must not fail the turn (the
                # garbage collector's finalizer would have logged it too)
                log.warning("agent %s: closing the provider's stream failed", st.id, exc_info=True)
    return reason, error
