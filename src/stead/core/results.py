"""Run results from the durable record: which run consumed a message, and how that run ended.

The kernel owns the link message → run → outcome, in the agent's own history (no plugin needed): a
consumed-input record carries the id of the run that consumed it (`"run"`), and settlement appends one
end-of-run record (`{"k":"e","run":…,"o":outcome,"x":error}`, read as an `EndRecord`) in the settling
transaction. A run's records are those after the previous run's end record up to its own, so its result —
final text, messages, summed usage, outcome — is computed from committed records alone, the same in any
process after any crash (`agent.run` uses this).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from stead.core.outcome import Outcome
from stead.core.records import (
    CompactionRecord,
    EndRecord,
    InputRecord,
    build_messages,
    decode_record,
    full_records,
)
from stead.messages import Message, Usage
from stead.store.base import Tx

__all__ = ["RunResult", "RunState", "read_run_records", "read_run_state", "run_state", "waiting_result"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """The result of one settled run (`agent.run(...)`)."""

    run_id: str
    outcome: Outcome
    text: str
    """The final assistant text (the text of the run's last assistant message; empty if it had none)."""
    messages: list[Message]
    """The run's messages, from its first consumed input to its last record."""
    usage: Usage
    """Token usage summed over the run's responses (`cost` is None when no response had a price)."""
    error: str | None = None
    """Why the run did not complete (None when it did)."""
    message_id: str | None = None
    """The message this result was asked for."""
    payload: dict[str, Any] | None = None
    """The run's payload as it ended (`send(..., payload=...)` starts it; flows and payload tools change
    it); None when the run had none."""
    output: Any = None
    """A typed result's parsed JSON answer (a run with an output schema, `agent.run(..., output_schema=)`
    or a definition's `output:`); None otherwise."""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.COMPLETED


@dataclass(frozen=True, slots=True)
class RunState:
    """Where a consumed message stands: its run is still working (`result` None) or settled. `run_id` is
    None only for a message consumed before runs were linked to their input."""

    run_id: str | None
    result: RunResult | None


def _usage(messages: list[Message]) -> Usage:
    inp = out = cached = 0
    cost: float | None = None
    estimated = False
    for m in messages:
        u = m.usage
        if u is None:
            continue
        estimated = estimated or u.estimated
        inp += u.input_tokens
        out += u.output_tokens
        cached += u.cached_tokens
        if u.cost is not None:
            cost = (cost or 0.0) + u.cost
    return Usage(inp, out, cached, cost, estimated)


def run_state(records: list[dict[str, Any]], message_id: str) -> RunState | None:
    """From an agent's history records: the run that consumed `message_id` and its result if it settled;
    None when no record of the message is in the history (still queued, or removed by a reset)."""
    start = 0
    consumed = False
    run_id: str | None = None
    typed = [decode_record(r) for r in records]
    for i, rec in enumerate(typed):
        if isinstance(rec, EndRecord):
            if consumed and (run_id is None or rec.run_id == run_id):
                # a compaction's summary is not part of any run's messages
                own = [records[j] for j in range(start, i) if not isinstance(typed[j], CompactionRecord)]
                messages = build_messages(own)
                text = next((m.text for m in reversed(messages) if m.role == "assistant"), "")
                result = RunResult(
                    rec.run_id,
                    rec.outcome,
                    text,
                    messages,
                    _usage(messages),
                    rec.error,
                    message_id,
                    rec.payload,
                )
                return RunState(rec.run_id, result)
            start = i + 1
        elif isinstance(rec, InputRecord) and not consumed and rec.id == message_id:
            consumed = True
            run_id = rec.run_id
    if not consumed:
        return None
    return RunState(run_id, None)


async def history_from_end(tx: Tx, agent_id: str) -> AsyncGenerator[dict[str, Any], None]:
    """The committed history records of `agent_id`, newest first, read in pages that grow (32 records,
    then ×4 up to 4,096): a reader that stops early pays only for what it read."""
    before: int | None = None
    limit = 32
    while True:
        page = await tx.load_before(agent_id, before, limit)
        for _, raw in page:
            yield json.loads(raw)
        if len(page) < limit:
            return
        before = page[-1][0]
        limit = min(limit * 4, 4096)


async def read_run_records(tx: Tx, agent_id: str, message_id: str) -> list[dict[str, Any]] | None:
    """The current-history records of the run that consumed `message_id`, read from the end: from just
    after the end record that precedes the message's consumed-input record, to the last record. None when
    the message is not in the current history. Costs O(records since that run began), not O(history):
    `run_state` and `waiting_result` over this slice equal them over the whole history (everything before
    it is settled runs that cannot match the message)."""
    tail: list[dict[str, Any]] = []  # newest first
    found = False
    async with aclosing(history_from_end(tx, agent_id)) as records:
        async for rec in records:
            typed = decode_record(rec)
            if found and isinstance(typed, EndRecord):
                break
            tail.append(rec)
            if not found and isinstance(typed, InputRecord) and typed.id == message_id:
                found = True
    if not found:
        return None
    tail.reverse()
    return tail


async def read_run_state(tx: Tx, agent_id: str, message_id: str) -> RunState | None:
    """`run_state` over the committed history of `agent_id`, read inside `tx` — with the records earlier
    compactions archived when the message's run is not settled in the current history (K1: a compaction
    never loses a run's result). A settled run is found reading only its own records (`read_run_records`)."""
    tail = await read_run_records(tx, agent_id, message_id)
    state = None if tail is None else run_state(tail, message_id)
    if state is not None and state.result is not None:
        return state
    archive = await tx.load_archive(agent_id)
    if not archive:
        return state
    current = [json.loads(r) for r in await tx.load(agent_id)]
    return run_state(full_records(archive, current), message_id)


def waiting_result(records: list[dict[str, Any]], message_id: str) -> RunResult | None:
    """The result so far of the unsettled run that consumed `message_id`, with outcome `awaiting_input`
    (the agent waits for decisions on held calls); None when that run settled or the message is unknown."""
    state = run_state(records, message_id)
    if state is None or state.result is not None:
        return None
    start = 0
    for i, rec in enumerate(records):
        if isinstance(decode_record(rec), EndRecord):
            start = i + 1
    messages = build_messages(records[start:])
    text = next((m.text for m in reversed(messages) if m.role == "assistant"), "")
    return RunResult(
        state.run_id or "", Outcome.AWAITING_INPUT, text, messages, _usage(messages), None, message_id
    )
