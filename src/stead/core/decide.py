"""Decisions on held tool calls (`stead.core.gate`): release, refusal, and the refusals the kernel makes
itself when a steered message arrives (abort's are in `stead.core.batch.abort_batch`).

Each runs inside one transaction — the decider's own, if it has one open (a policy plugin updates its
approval row in it, so the row and the call's state commit together or not at all):

- `release_call`: a held call becomes `go` (approved, not started), optionally with edited arguments; the
  agent's loop claims and runs it once (T5 flags apply from the claim on).
- `refuse_call`: a held call gets its one error result (T3: the entry is deleted — the claim —, the result
  appended, the call-bound KV erased); if it was the batch's last entry, the pending record moves back to
  `inference` so the agent continues with the next provider request.
- `reject_for_steer`: when every unanswered call of the batch is held and a steered message is queued, the
  held calls are rejected in the transaction that consumes that message ("the user sent a new message
  instead"), and the agent continues with an inference that sees both.

A decision on a call that is no longer held (decided before, answered by an abort, not found) changes
nothing and returns False. After the commit: `ApprovalDecided` is emitted and the agent is woken.
"""

from __future__ import annotations

import json
from typing import Any

from stead._ids import new_id
from stead.core import records as R
from stead.core.batch import commit_result
from stead.core.consume import apply_settings, consumption_published, write_consumption
from stead.core.events import ApprovalDecided
from stead.core.gate import GATE_KEY, Gate, encode_entry
from stead.core.hooks import CallDecidedInfo
from stead.core.records import Pending, Queued
from stead.core.state import AgentState, Turn
from stead.messages import ToolCall, ToolResult, decode_block
from stead.store.base import Tx

__all__ = ["STEERED_TEXT", "HeldCall", "held_calls", "refuse_call", "reject_for_steer", "release_call"]

STEERED_TEXT = "Rejected: the user sent a new message instead of deciding on this call; it never ran."


class HeldCall:
    """A batch entry with its gate, as stored."""

    __slots__ = ("call", "gate", "key")

    def __init__(self, key: str, call: ToolCall, gate: Gate | None) -> None:
        self.key = key
        self.call = call
        self.gate = gate


async def _entry(tx: Tx, agent_id: str, call_id: str) -> HeldCall | None:
    for key, raw in await tx.read_prefix(agent_id, R.TOOL):
        if not key.endswith("." + call_id):
            continue
        d: dict[str, Any] = json.loads(raw)
        call = decode_block(d)
        assert isinstance(call, ToolCall)
        return HeldCall(key, call, Gate.decode(d.get(GATE_KEY)))
    return None


async def held_calls(tx: Tx, agent_id: str) -> list[HeldCall]:
    """The calls of the agent's dispatched batch that wait for a decision, in call order."""
    return _held_entries(await tx.read_prefix(agent_id, R.TOOL))


def _held_entries(entries: list[tuple[str, str]]) -> list[HeldCall]:
    out: list[HeldCall] = []
    for key, raw in entries:
        d = json.loads(raw)
        gate = Gate.decode(d.get(GATE_KEY))
        if gate is not None and gate.held:
            call = decode_block(d)
            assert isinstance(call, ToolCall)
            out.append(HeldCall(key, call, gate))
    return out


async def _held(st: AgentState, tx: Tx, call_id: str) -> tuple[HeldCall, Pending] | None:
    pending = Pending.decode(await tx.get(st.id, R.PENDING))
    if pending is None or pending.stage != "tools":
        return None
    entry = await _entry(tx, st.id, call_id)
    if entry is None or entry.gate is None or not entry.gate.held:
        return None
    return entry, pending


async def _notify_owner(st: AgentState, tx: Tx) -> None:
    """W3 for decisions: on PostgreSQL the worker that runs the agent (another process, perhaps) is woken
    when, and only if, the decision commits; where this process runs it, its own after-commit wakes it."""
    notify = tx.store.capabilities.owner_notify
    if notify is not None:
        await notify.notify_owner(tx, st.id)


def _published(
    st: AgentState, call_id: str, gate: Gate, decision: str, note: str | None, run_id: str
) -> None:
    if st.listening:
        st.emit(ApprovalDecided(call_id, gate.ref, decision, note, run_id))
    if st.pending is not None:
        st.wake()  # only where this process runs the agent (a decider that did not resume it stays out)


async def release_call(
    st: AgentState,
    call_id: str,
    *,
    arguments: dict[str, Any] | None = None,
    note: str | None = None,
    result_note: str | None = None,
) -> bool:
    """The held call may run (`go`), with `arguments` instead of the model's when given (validated by the
    caller). `result_note` starts its result. False when the call is not held."""
    async with st.env.store.transaction() as tx:
        found = await _held(st, tx, call_id)
        if found is None:
            return False
        entry, pending = found
        gate = entry.gate
        assert gate is not None
        call = entry.call
        if arguments is not None:
            call = ToolCall(call.name, arguments, call.id)
        await tx.write(st.id, entry.key, encode_entry(call, gate.but(state="go", note=result_note)))
        if st.hooks.wants("call_decided_tx"):
            await st.hooks.call_decided_tx(st.hook_ctx(tx, pending), CallDecidedInfo(call, "approved", note))
        await _notify_owner(st, tx)
        tx.after_commit(lambda: _published(st, call_id, gate, "approved", note, pending.run_id))
    return True


async def refuse_call(
    st: AgentState, call_id: str, output: str, *, decision: str = "rejected", note: str | None = None
) -> bool:
    """The held call gets the error result `output` in this transaction (it never runs); `decision` names
    why (`rejected`, `expired`, ...). False when the call is not held."""
    async with st.env.store.transaction() as tx:
        found = await _held(st, tx, call_id)
        if found is None:
            return False
        entry, pending = found
        gate = entry.gate
        assert gate is not None
        if st.hooks.wants("call_decided_tx"):
            info = CallDecidedInfo(entry.call, decision, note)
            await st.hooks.call_decided_tx(st.hook_ctx(tx, pending), info)
        tool = st.env.tools.get(entry.call.name)
        result = ToolResult(call_id, output, True)
        tracked = st.pending is not None
        await commit_result(st, pending, entry.key, entry.call, result, None, tool, track=tracked)
        await _notify_owner(st, tx)
        tx.after_commit(lambda: _published(st, call_id, gate, decision, note, pending.run_id))
    return True


async def reject_for_steer(st: AgentState, pending: Pending, take: list[Queued]) -> bool:
    """One transaction: every held call of the batch gets the steered-message rejection, the steered
    message(s) `take` are consumed (with the settings they carry), and the pending record owes a fresh
    inference. The caller saw every unanswered call of the batch held; that is checked again in this
    transaction, because a decision may have committed since (T2): a call approved in between must run
    before the batch ends, so nothing is written and False is returned (the next stage runs it)."""
    settings, reset = apply_settings(st, take)
    inf = new_id()
    turn = Turn(inf, pending, take, settings=settings, reset=reset)
    decided: list[tuple[str, Gate]] = []
    async with st.env.store.transaction() as tx:
        entries = await tx.read_prefix(st.id, R.TOOL)
        held = _held_entries(entries)
        if not held or len(held) != len(entries):
            return False
        for entry in held:
            cid = entry.call.id or ""
            assert entry.gate is not None
            if st.hooks.wants("call_decided_tx"):
                await st.hooks.call_decided_tx(
                    st.hook_ctx(tx, pending), CallDecidedInfo(entry.call, "rejected", STEERED_TEXT)
                )
            tool = st.env.tools.get(entry.call.name)
            await commit_result(
                st, pending, entry.key, entry.call, ToolResult(cid, STEERED_TEXT, True), False, tool
            )
            decided.append((cid, entry.gate))
        consumed = await write_consumption(st, tx, turn)
        new_pending = pending.but(stage="inference", turn_id=inf, inference_id=inf)
        await tx.write(st.id, R.PENDING, new_pending.encode())

        def published() -> None:
            consumption_published(st, turn)
            st.publish_records(consumed)
            st.pending = new_pending
            if st.listening:
                for cid, gate in decided:
                    st.emit(ApprovalDecided(cid, gate.ref, "rejected", STEERED_TEXT, pending.run_id))

        tx.after_commit(published)
    return True
