"""Compaction (K1): keep a long-lived conversation inside the model's window, at safe boundaries only.

When. The loop enters the durable stage `compaction` (the pending record, R2 orders it after a dispatched
batch and before owed inference) only at a safe boundary: before a turn's first inference, or after a batch
settled and before its continuation (`at_boundary`); an idle agent asked to compact (`agent.compact()`)
is activated straight into it and needs no inference. Three reasons: `auto` — the next request would exceed
`window − reserve` (`due`), unless the circuit breaker is open (3 consecutive failures); `requested` — a
`q.compact` entry written by `agent.compact()` (concurrent requests share it); `overflow` — the provider
said the context is too long (once per run, `stead.core.inference`).

What. Passes, cheapest first (`prepare`): stub old tool results (their first 500 characters and
`…[cut: 12,403 characters]`), clamp any kept record larger than a quarter of the window; then — when that
is not enough, or always when requested — a model-written summary of the previous summary plus the evicted
records (`summarize`), chunked to fit the summarizer's own window, by the agent's model or the policy's
`compaction_model`, as `ProviderRequest(purpose="compaction")`. The cut (`choose_cut`) lands only where the
kept tail starts a message (a user/system message or the first block of a response) and no kept result
answers an evicted call, so a call never loses its result and reasoning never loses the call it precedes;
the newest user message always stays (pinned after the summary when it is older than the cut).

How. The replacement is one transaction (`_replace`): `before_compaction` hooks see the evicted records,
the whole history moves to the archive (`Tx.archive_history`), `[c, *kept]` is appended, the request entry
is deleted, the pending record goes back to `inference`, the summary requests' prompt steps and the
`compaction_tx` hooks (the run record's `compaction` step) are written — all or nothing. A crash before its
commit leaves the old history and the durable stage, so the next owner re-runs the compaction; a failure
(`_fail`) leaves the history untouched, rejects the request, and counts toward the breaker. Memory changes
only after commit (the mirror, the waiters of `agent.compact()`, the `Compacted` event).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from stead._ids import new_id
from stead._tokens import estimate_record, estimate_text, estimate_tools
from stead.core import records as R
from stead.core.events import Activated, Compacted
from stead.core.hooks import CompactionInfo, ResponseInfo
from stead.core.records import Pending, Queued, build_messages
from stead.core.state import AgentState
from stead.errors import CompactionFailed, ProviderError
from stead.messages import (
    Block,
    Message,
    Reasoning,
    Text,
    ToolCall,
    Usage,
    decode_usage,
    dumps,
    repair_text,
    text_of,
)
from stead.providers.base import Done, Provider, ProviderRequest, ToolSpec, UsageEvent

__all__ = [
    "BREAKER",
    "Budget",
    "at_boundary",
    "budget",
    "choose_cut",
    "compaction_stage",
    "context_tokens",
    "due",
    "output_cap",
    "reject_waiters",
    "request",
]

log = logging.getLogger("stead.core")

BREAKER = 3
"""Consecutive failed compactions after which automatic compaction stops (until one succeeds)."""
MAX_OUTPUT = 20_000
MARGIN = 13_000
STUB_CHARS = 500
OVERFLOW_KEY = "kv.r.stead.overflow"
"""Run KV: the overflow recovery of this run was used (once per run; cleared at settlement)."""
DEFAULT_SUMMARIZER_WINDOW = 32_000
DEFAULT_MAX_OUTPUT = 4_096
"""The output cap of a turn when neither the agent nor the catalog gives one (a model the catalog does not
list, a registered provider's own model name)."""
MIN_OUTPUT = 256
"""The least room left for an answer by the window bound (`output_cap`): the request's size is an estimate
(about ±20 %), and a request that does not fit is refused by the server anyway (overflow recovery)."""

SUMMARY_INSTRUCTIONS = (
    "You maintain the running summary of a conversation between a user and an AI agent that uses tools. "
    "Older messages are being removed from the agent's context; your summary replaces them, so the agent "
    "must be able to continue its work from the summary alone. Keep: what the user asked for and still "
    "wants, decisions and constraints, facts learned (names, numbers, identifiers, paths, URLs), which "
    "tools were called and what they returned (in brief), what failed, open questions and where the work "
    "stands now. Merge the previous summary with the new messages into one updated summary. Write plain "
    "text, no preamble, at most {words} words."
)


# ---------------------------------------------------------------------------------------------- budgets
@dataclass(frozen=True, slots=True)
class Budget:
    """The token budgets of one agent's context (estimates, `stead._tokens`)."""

    window: int | None
    threshold: int | None
    """Compact automatically when the next request would reach this (window − reserve)."""
    keep: int
    """Tokens of recent history kept verbatim after a summary."""
    clamp: int
    """A kept record larger than this is clamped."""
    target: int
    """What the cheap passes alone must reach to skip the summary."""
    summary_tokens: int
    """The most the summary may take."""


def window_of(st: AgentState, settings: dict[str, Any]) -> int | None:
    """The model's window: the agent's policy, else the catalog's `context_window` for its model."""
    policy = st.config.context
    if policy.window:
        return policy.window
    if st.env.context_window is not None:
        known = st.env.context_window(settings)
        if known is not None:
            return known
    return st.learned_window


def output_cap(st: AgentState, settings: dict[str, Any], size: int) -> int:
    """MR1: the output cap of a turn's request of about `size` tokens: the agent's `max_output_tokens`,
    else the catalog's output limit for the model `settings` name, else `DEFAULT_MAX_OUTPUT` — and never
    more than the window minus the request (at least `MIN_OUTPUT`, or the agent's own smaller cap)."""
    cap = st.config.context.max_output_tokens
    if cap is None and st.env.output_limit is not None:
        cap = st.env.output_limit(settings)
    if cap is None:
        cap = DEFAULT_MAX_OUTPUT
    w = window_of(st, settings)
    if w is not None:
        cap = min(cap, max(w - size, MIN_OUTPUT))
    return max(cap, 1)


async def write_state(st: AgentState, tx: Any, failures: int, window: int | None) -> None:
    """Inside `tx`: the compaction state key (breaker count, learned window); absent when both are empty."""
    if failures or window:
        await tx.write(st.id, R.COMPACTION, dumps({"fails": failures, "window": window}))
    elif st.compaction_failures or st.learned_window:
        await tx.delete(st.id, R.COMPACTION)


def budget(st: AgentState, settings: dict[str, Any], *, window: int | None = None) -> Budget:
    policy = st.config.context
    w = window or window_of(st, settings)
    if w is None:
        keep = policy.keep_recent_tokens or 20_000
        return Budget(None, None, keep, max(keep, 8_000), keep * 2, 4_000)
    reserve = policy.reserve if policy.reserve is not None else min(MAX_OUTPUT + MARGIN, w // 4)
    threshold = max(w - reserve, 1)
    keep = policy.keep_recent_tokens or w // 4
    return Budget(w, threshold, keep, max(w // 4, 64), int(threshold * 0.7), max(min(w // 8, 8_000), 64))


def _overhead(st: AgentState, pending: Pending | None) -> int:
    """Instructions and tool specifications: what every request carries besides the messages."""
    specs = []
    for name in st.offered_tools(pending):
        t = st.env.tools.get(name)
        if t is not None:
            specs.append(ToolSpec(t.name, t.description, t.parameters))
    return estimate_text(st.config.instructions) + estimate_tools(specs)


def context_tokens(st: AgentState, pending: Pending | None, staged: list[Queued]) -> int:
    """The size of the next request: the last response's reported (or estimated) usage — its input plus
    its output — plus an estimate of every record appended since and of the staged input. Usage from
    before the last compaction is stale: then the whole history is estimated."""
    recs = st.records or []
    # usage measured before the last compaction is stale, also on the copies it kept (its first `n` records).
    # A compaction replaces the whole history with `[c, *kept]`: its record, if any, is the first one (an
    # O(1) look, not a scan of a long history on every turn)
    ci = 0 if recs and recs[0].get("k") == "c" else -1
    fresh_from = ci + int(recs[ci].get("n", 1)) if ci >= 0 else 0
    base: int | None = None
    start = max(ci, 0)
    for i in range(len(recs) - 1, fresh_from - 1, -1):
        rec = recs[i]
        if rec.get("k") == "b" and "u" in rec:
            u = decode_usage(rec["u"])
            base, start = u.input_tokens + u.output_tokens, i + 1
            break
    total = base if base is not None else _overhead(st, pending)
    total += sum(estimate_record(r) for r in recs[start:])
    for q in staged:
        total += estimate_record(q.history_record())
    return total


def at_boundary(st: AgentState, pending: Pending) -> bool:
    """K1: a safe boundary — before a turn's first inference (no response owed), or after a batch
    settled and before its continuation (the last record is a tool result) — and not inside a retry."""
    if pending.stage != "inference" or st.attempt:
        return False
    if pending.inference_id is None:
        return True
    recs = st.records or []
    return bool(recs) and recs[-1].get("k") == "t"


def due(st: AgentState, pending: Pending, staged: list[Queued], settings: dict[str, Any]) -> bool:
    """Whether an automatic compaction is due: the next request would reach window − reserve."""
    if not st.config.context.auto or st.compaction_failures >= BREAKER:
        return False
    b = budget(st, settings)
    return b.threshold is not None and context_tokens(st, pending, staged) >= b.threshold


# ---------------------------------------------------------------------------------------------- the cut
def _starts_message(recs: list[R.HistoryRecord], i: int) -> bool:
    rec = recs[i]
    if isinstance(rec, R.InputRecord | R.NoteRecord):
        return True
    if not isinstance(rec, R.BlockRecord):
        return False
    prev = recs[i - 1] if i > 0 else None
    return not (isinstance(prev, R.BlockRecord) and prev.inference_id == rec.inference_id)


def safe_cuts(recs: list[dict[str, Any]]) -> list[int]:
    """Every index where a kept tail may start: a message starts there and no record from there on
    answers a call made before it (walking back, the calls whose results were seen but not the calls)."""
    unmatched: set[str] = set()
    out: list[int] = []
    typed = [R.decode_record(r) for r in recs]
    for i in range(len(typed) - 1, -1, -1):
        rec = typed[i]
        if isinstance(rec, R.ResultRecord):
            unmatched.add(rec.result.call_id)
        elif isinstance(rec, R.BlockRecord) and isinstance(rec.block, ToolCall):
            unmatched.discard(str(rec.block.id))
        if not unmatched and _starts_message(typed, i):
            out.append(i)
    out.reverse()
    return out


def choose_cut(recs: list[dict[str, Any]], keep: int, start: int = 0) -> int:
    """The index where the kept tail starts: the earliest safe cut after `start` whose tail fits `keep`
    tokens — at least the last safe one (the newest message or response is always kept); `len(recs)` when
    there is no safe cut after `start`."""
    cuts = [c for c in safe_cuts(recs) if c > start]
    if not cuts:
        return len(recs)
    sizes = [estimate_record(r) for r in recs]
    suffix = [0] * (len(recs) + 1)
    for i in range(len(recs) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + sizes[i]
    for c in cuts:
        if suffix[c] <= keep:
            return c
    return cuts[-1]


# ---------------------------------------------------------------------------------------------- passes
def _cut_text(text: str, keep_chars: int) -> tuple[str, int] | None:
    n = len(text)
    if n <= keep_chars + 40:
        return None
    return f"{text[:keep_chars]}…[cut: {n - keep_chars:,} characters]", n


def _stub(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A tool result record cut to its first characters (None when it is short already)."""
    r = R.decode_record(rec)
    if not isinstance(r, R.ResultRecord) or r.cut is not None:
        return None
    cut = _cut_text(r.result.output, STUB_CHARS)
    if cut is None:
        return None
    return R.ResultRecord(replace(r.result, output=cut[0]), cut[1]).encode()


def _clamp(rec: dict[str, Any], limit: int) -> dict[str, Any] | None:
    """A record larger than `limit` tokens cut to about `limit` (None when it fits or cannot be cut: tool
    calls keep their arguments, signed reasoning its text)."""
    if estimate_record(rec) <= limit:
        return None
    chars = max(limit * 3, STUB_CHARS)
    r = R.decode_record(rec)
    if isinstance(r, R.ResultRecord):
        cut = _cut_text(r.result.output, chars)
        return None if cut is None else R.ResultRecord(replace(r.result, output=cut[0]), cut[1]).encode()
    if isinstance(r, R.BlockRecord):
        block = r.block
        if isinstance(block, Text) or (isinstance(block, Reasoning) and not block.signature):
            cut = _cut_text(block.text, chars)
            return None if cut is None else replace(r, block=replace(block, text=cut[0]), cut=cut[1]).encode()
        return None
    if isinstance(r, R.InputRecord):
        blocks: list[Block] = []
        total, changed = 0, False
        for b in r.content:
            if isinstance(b, Text):
                cut = _cut_text(b.text, chars)
                if cut is not None:
                    b, changed = replace(b, text=cut[0]), True
                    total += cut[1]
            blocks.append(b)
        return replace(r, content=blocks, cut=total).encode() if changed else None
    if isinstance(r, R.NoteRecord):
        cut = _cut_text(r.text, chars)
        return None if cut is None else replace(r, text=cut[0], cut=cut[1]).encode()
    return None


@dataclass
class Prepared:
    """What a compaction will do, computed from the mirror (pure; nothing is written)."""

    id: str
    reason: str
    records: list[dict[str, Any]]
    previous_summary: str | None
    evicted: list[dict[str, Any]]
    kept: list[dict[str, Any]]
    """The records after the `c` record, as they will be written (stubs and clamps applied)."""
    passes: list[str]
    needs_summary: bool
    tokens_before: int
    overhead: int
    budget: Budget
    started_at: float = field(default_factory=time.time)


def prepare(
    st: AgentState, pending: Pending, reason: str, settings: dict[str, Any], window: int | None = None
) -> Prepared:
    recs = list(st.records or [])
    overhead = _overhead(st, pending)
    b = budget(st, settings, window=window)
    if reason == "overflow":
        w = window or b.window or max(overhead + sum(estimate_record(r) for r in recs), 1_000)
        b = Budget(w, b.threshold, max(w // 8, 64), max(w // 8, 64), w // 2, max(min(w // 10, 8_000), 64))
    before = overhead + sum(estimate_record(r) for r in recs)
    typed = [R.decode_record(r) for r in recs]
    head = typed[0] if typed else None
    start = 1 if isinstance(head, R.CompactionRecord) else 0
    previous = head.summary if isinstance(head, R.CompactionRecord) and head.summary else None
    keep = min(b.keep, max(before // 4, 1)) if reason == "requested" else b.keep
    cut = choose_cut(recs, keep, start)
    passes: list[str] = []

    # pass 1 (cheapest): stub the tool results outside the recent window, keep everything else
    stubbed = list(recs[start:])
    for i in range(start, cut):
        s = _stub(recs[i])
        if s is not None:
            stubbed[i - start] = s
            if "stub" not in passes:
                passes.append("stub")
    # pass 2: clamp single records larger than a quarter of the window
    for i, rec in enumerate(stubbed):
        c = _clamp(rec, b.clamp)
        if c is not None:
            stubbed[i] = c
            if "clamp" not in passes:
                passes.append("clamp")
    cheap_tokens = overhead + sum(estimate_record(r) for r in stubbed) + (estimate_text(previous or "") + 8)
    if (reason == "auto" and cheap_tokens <= b.target) or cut <= start:
        return Prepared(new_id(), reason, recs, previous, [], stubbed, passes, False, before, overhead, b)
    # pass 3: summarize the previous summary and everything before the cut (but the newest user message)
    newest_user = max(
        (i for i, r in enumerate(typed) if isinstance(r, R.InputRecord) and r.role == "user"), default=-1
    )
    evicted = [r for i, r in enumerate(recs[start:cut], start) if i != newest_user]
    kept = [recs[newest_user]] if start <= newest_user < cut else []
    kept += recs[cut:]
    passes = ["clamp"] if any(_clamp(r, b.clamp) is not None for r in kept) else []
    kept = [_clamp(r, b.clamp) or r for r in kept]
    passes.append("summary")
    return Prepared(new_id(), reason, recs, previous, evicted, kept, passes, True, before, overhead, b)


# ---------------------------------------------------------------------------------------------- summary
def _render(recs: list[dict[str, Any]], names: dict[str, str], limit_chars: int) -> list[str]:
    """The evicted records as transcript lines for the summarizer (each line at most `limit_chars`)."""
    lines: list[str] = []
    for raw in recs:
        rec = R.decode_record(raw)
        text = ""
        if isinstance(rec, R.InputRecord):
            text = f"[{rec.role}] {text_of(rec.content)}"
        elif isinstance(rec, R.BlockRecord):
            b = rec.block
            if isinstance(b, Text):
                text = f"[assistant] {b.text}"
            elif isinstance(b, Reasoning):
                text = f"[assistant thinking] {b.text}"
            elif isinstance(b, ToolCall):
                names[str(b.id)] = b.name
                args = b.arguments
                text = f"[assistant called {b.name}] {args if isinstance(args, str) else json.dumps(args)}"
        elif isinstance(rec, R.ResultRecord):
            result = rec.result
            what = "error from" if result.is_error else "result of"
            text = f"[{what} {names.get(result.call_id, 'a tool')}] {result.output}"
        elif isinstance(rec, R.NoteRecord):
            text = f"[note] {rec.text}"
        if text:
            if len(text) > limit_chars:
                text = text[:limit_chars] + f"…[cut: {len(text) - limit_chars:,} characters]"
            lines.append(text)
    return lines


class _Failed(Exception):
    pass


class _Stopped(Exception):
    """Draining: stop before the next provider request (X4); the durable stage stays for the next owner."""


async def _one_summary(
    st: AgentState,
    provider: Provider,
    settings: dict[str, Any],
    previous: str | None,
    chunk: list[str],
    words: int,
    prompts: list[ResponseInfo],
    limit: tuple[int, int],
) -> str:
    """One summary request. `limit` is (the summary's cap, the summarizer's window): the request carries
    the cap, never more than the window minus the request (MR1)."""
    body = (
        f"Previous summary:\n{previous or '(none yet)'}\n\nMessages to add to the summary:\n"
        + "\n".join(chunk)
        + "\n\nWrite the updated summary."
    )
    instructions = SUMMARY_INSTRUCTIONS.format(words=words)
    cap, window = limit
    size = estimate_text(instructions) + estimate_text(body)
    request = ProviderRequest(
        model=str(settings.get("model")),
        instructions=instructions,
        messages=[Message("user", [Text(body)])],
        tools=[],
        agent_id=st.id,
        inference_id=new_id(),
        purpose="compaction",
        max_output_tokens=max(min(cap, window - size), min(cap, 64)),
    )
    attempt = 0
    since = time.monotonic()
    while True:
        if st.draining:
            raise _Stopped
        started = time.time()
        first: float | None = None
        texts: list[str] = []
        usage: Usage | None = None
        reason: str | None = None
        error: str | None = None
        try:
            async for ev in provider.stream(request):
                if first is None:
                    first = time.time()
                if isinstance(ev, UsageEvent):
                    usage = ev.usage
                elif isinstance(ev, Done):
                    reason, error = ev.reason, ev.error
                    break
                elif getattr(ev, "type", None) == "block_end":
                    block = ev.block  # type: ignore[union-attr]
                    if isinstance(block, Text):
                        texts.append(block.text)
        except ProviderError as e:
            delay = (
                st.env.retry.next_delay(attempt + 1, time.monotonic() - since, e.retry_after)
                if e.retryable
                else None
            )
            if delay is not None:
                attempt += 1
                await asyncio.sleep(delay)
                continue
            reason, error = "error", str(e)
        text = repair_text("".join(texts).strip())  # S5: the summary is stored
        if error is not None:
            error = repair_text(error)
        if reason is None:
            reason, error = "error", "the summary's response ended before it was complete"
        elif reason in ("stop", "length") and not text:
            reason, error = "error", "the summarizer returned no text"
        if usage is None and reason != "error":
            usage = Usage(
                estimate_text(request.instructions) + estimate_text(body), estimate_text(text), 0, None, True
            )
        prompts.append(
            ResponseInfo(
                inference_id=request.inference_id,
                provider=str(settings.get("provider")),
                model=str(settings.get("model")),
                reason=reason,
                usage=usage,
                started_at=started,
                first_token_at=first,
                ended_at=time.time(),
                error=error,
                purpose="compaction",
            )
        )
        if reason in ("error", "cancelled"):
            raise _Failed(error or f"the summary's response ended with {reason!r}")
        return text


def _summarizer(st: AgentState) -> dict[str, Any]:
    chosen = st.config.context.compaction_model
    if chosen:
        return {**st.settings, **chosen}
    return dict(st.settings)


async def summarize(st: AgentState, prep: Prepared, prompts: list[ResponseInfo]) -> str:
    """The previous summary plus the evicted records, summarized in chunks that fit the summarizer's window
    (a rolling summary: each chunk updates the summary so far)."""
    settings = _summarizer(st)
    provider = st.env.providers.get(str(settings.get("provider")))
    if provider is None and st.env.resolve_provider is not None:
        provider = st.env.resolve_provider(settings)
    if provider is None:
        raise _Failed(f"no provider named {settings.get('provider')!r} can write the summary")
    window = window_of(st, settings) if st.config.context.compaction_model else prep.budget.window
    window = window or DEFAULT_SUMMARIZER_WINDOW
    out_tokens = prep.budget.summary_tokens
    # the summary's cap: its budget plus the half that `_clip` tolerates (tokens past that are cut anyway),
    # within the summarizer's own output limit when the catalog knows it
    cap = out_tokens * 3 // 2
    known = st.env.output_limit(settings) if st.env.output_limit is not None else None
    limit = (min(cap, known) if known else cap, window)
    room = max(window - out_tokens - estimate_text(SUMMARY_INSTRUCTIONS) - 64, 256)
    lines = _render(prep.evicted, {}, max(room // 2, 128) * 3)
    words = max(int(out_tokens * 0.7), 40)
    summary = prep.previous_summary
    chunk: list[str] = []
    used = estimate_text(summary or "")
    for line in lines:
        size = estimate_text(line) + 1
        if chunk and used + size > room:
            summary = _clip(
                await _one_summary(st, provider, settings, summary, chunk, words, prompts, limit), out_tokens
            )
            chunk, used = [], estimate_text(summary)
        chunk.append(line)
        used += size
    if chunk or summary is None:
        summary = _clip(
            await _one_summary(st, provider, settings, summary, chunk, words, prompts, limit), out_tokens
        )
    return summary


def _clip(text: str, tokens: int) -> str:
    """A summary longer than 1.5× its budget is cut (a summarizer that ignores its word limit)."""
    if estimate_text(text) <= tokens * 3 // 2:
        return text
    keep = max(tokens * 4, 200)
    return text[:keep] + "…[summary cut]"


# ---------------------------------------------------------------------------------------------- requests
async def request(st: AgentState, tx: Any) -> str:
    """Inside `tx`: request a compaction (`agent.compact()`): the `q.compact` entry (shared when one is
    there already) and, for an idle agent, the pending record in stage `compaction` (the activation).
    Returns the request's id."""
    raw = await tx.get(st.id, R.COMPACT)
    if raw is not None:
        return str(json.loads(raw)["id"])
    rid = new_id()
    await tx.write(st.id, R.COMPACT, dumps({"id": rid, "at": time.time()}))
    activated: Pending | None = None
    if await tx.get(st.id, R.PENDING) is None:
        activated = Pending("compaction", new_id(), activated_at=time.time(), compaction="requested")
        await tx.write(st.id, R.PENDING, activated.encode())
        if st.hooks.wants("activated_tx"):
            await st.hooks.activated_tx(st.hook_ctx(tx, activated))

    def published() -> None:
        if activated is not None:
            st.pending = activated
            if st.listening:
                st.emit(Activated(activated.run_id, restored=False))
        st.wake()

    tx.after_commit(published)
    return rid


def reject_waiters(st: AgentState, why: str, *, rejected: bool = True) -> None:
    """Every `agent.compact()` waiting here gets `CompactionFailed` (never left pending)."""
    waiters, st.compaction_waiters = st.compaction_waiters, []
    for fut in waiters:
        if not fut.done():
            fut.set_exception(CompactionFailed(why, rejected=rejected))


def _resolve(st: AgentState, info: CompactionInfo) -> None:
    waiters, st.compaction_waiters = st.compaction_waiters, []
    for fut in waiters:
        if not fut.done():
            fut.set_result(info)


# ---------------------------------------------------------------------------------------------- the stage
async def compaction_stage(st: AgentState, pending: Pending) -> bool:
    """Run the durable `compaction` stage. Returns whether the loop goes on."""
    reason = pending.compaction or "auto"
    settings = dict(st.settings)
    window: int | None = None
    if reason == "overflow":
        async with st.env.store.transaction() as tx:
            raw = await tx.get(st.id, OVERFLOW_KEY)
        hint = json.loads(raw) if raw else None
        window = int(hint) if isinstance(hint, int) and hint > 1 else None
    prep = prepare(st, pending, reason, settings, window)
    prompts: list[ResponseInfo] = []
    try:
        summary = await summarize(st, prep, prompts) if prep.needs_summary else None
    except _Stopped:
        reject_waiters(st, f"agent {st.id} stopped before its compaction ran")
        return False
    except _Failed as e:
        log.warning("agent %s: compaction failed: %s", st.id, e)
        await _fail(st, pending, prep, prompts, str(e))
        return True
    except Exception as e:  # a provider that raised something else: fail the compaction, not the loop
        log.warning("agent %s: compaction failed: %r", st.id, e)
        await _fail(st, pending, prep, prompts, f"{type(e).__name__}: {e}")
        return True
    await _replace(st, pending, prep, summary, prompts)
    return True


def _after(pending: Pending, reason: str) -> Pending:
    """The pending record once the compaction is over: owed inference resumes (an overflowing one under a
    fresh id: the failed request's id is retired, R2)."""
    inf = pending.inference_id
    if reason == "overflow" and inf is not None:
        inf = new_id()
    return pending.but(stage="inference", compaction=None, inference_id=inf, turn_id=inf or pending.turn_id)


def _info(
    prep: Prepared,
    summary: str | None,
    new: list[dict[str, Any]],
    prompts: list[ResponseInfo],
    error: str | None,
) -> CompactionInfo:
    after = prep.overhead + sum(estimate_record(r) for r in new) if error is None else prep.tokens_before
    return CompactionInfo(
        id=prep.id,
        reason=prep.reason,
        tokens_before=prep.tokens_before,
        tokens_after=after,
        records_before=len(prep.records),
        records_after=len(new) if error is None else len(prep.records),
        passes=tuple(prep.passes),
        evicted=tuple(build_messages(prep.evicted)),
        kept=tuple(build_messages(prep.kept)),
        previous_summary=prep.previous_summary,
        summary=summary,
        summary_inference_ids=tuple(p.inference_id for p in prompts),
        started_at=prep.started_at,
        ended_at=time.time(),
        error=error,
    )


async def _record_prompts(st: AgentState, tx: Any, pending: Pending, prompts: list[ResponseInfo]) -> None:
    if prompts and st.hooks.wants("response_tx"):
        for p in prompts:
            await st.hooks.response_tx(st.hook_ctx(tx, pending, inference_id=p.inference_id), p)


async def _replace(
    st: AgentState, pending: Pending, prep: Prepared, summary: str | None, prompts: list[ResponseInfo]
) -> None:
    """The replacement: one transaction, all or nothing."""
    # without a new summary only the cheap passes ran: the earlier summary (if any) still stands
    text = summary if summary is not None else prep.previous_summary
    head = R.CompactionRecord(prep.id, 1 + len(prep.kept), prep.reason, text).encode()
    new = [head, *prep.kept]
    info = _info(prep, head.get("x"), new, prompts, None)
    head["tb"], head["ta"] = info.tokens_before, info.tokens_after
    # effective: under the threshold, and a real gain (a compaction that frees nothing — the input being
    # staged is what is large — counts toward the breaker, so it is not repeated on every stage)
    gained = info.tokens_after <= prep.tokens_before * 0.9
    effective = gained and (prep.budget.threshold is None or info.tokens_after < prep.budget.threshold)
    after = _after(pending, prep.reason)
    hooks = st.hooks
    async with st.env.store.transaction() as tx:
        ctx = (
            st.hook_ctx(tx, pending)
            if hooks.wants("before_compaction") or hooks.wants("compaction_tx")
            else None
        )
        if ctx is not None and hooks.wants("before_compaction"):
            await hooks.before_compaction(ctx, info)
        await tx.archive_history(st.id, prep.id)
        await tx.append(st.id, [dumps(r) for r in new])
        requested = await tx.delete(st.id, R.COMPACT)
        await tx.write(st.id, R.PENDING, after.encode())
        failures = 0 if effective else st.compaction_failures + 1
        await write_state(st, tx, failures, st.learned_window)
        await _record_prompts(st, tx, pending, prompts)
        if ctx is not None and hooks.wants("compaction_tx"):
            await hooks.compaction_tx(ctx, info)

        def published() -> None:
            st.publish_records(new, reset=True)
            st.pending = after
            st.compaction_failures = failures
            if st.listening:
                st.emit(Compacted(info.id, info.reason, info.tokens_before, info.tokens_after))
            if requested or prep.reason == "requested" or st.compaction_waiters:
                _resolve(st, info)

        tx.after_commit(published)


async def _fail(
    st: AgentState, pending: Pending, prep: Prepared, prompts: list[ResponseInfo], error: str
) -> None:
    """A failed compaction: the history is untouched, a request is rejected (a failed attempt is not
    retried forever), the breaker counts it, the run goes on."""
    info = _info(prep, None, prep.records, prompts, error)
    after = _after(pending, prep.reason)
    async with st.env.store.transaction() as tx:
        await tx.delete(st.id, R.COMPACT)
        await tx.write(st.id, R.PENDING, after.encode())
        failures = st.compaction_failures + 1
        await write_state(st, tx, failures, st.learned_window)
        await _record_prompts(st, tx, pending, prompts)
        if st.hooks.wants("compaction_tx"):
            await st.hooks.compaction_tx(st.hook_ctx(tx, pending), info)

        def published() -> None:
            st.pending = after
            st.compaction_failures = failures
            reject_waiters(st, f"the compaction failed: {error}", rejected=False)

        tx.after_commit(published)
