"""Consumption: which queued messages a turn takes (C2), the settings they bring (C3, K2), and the staged
write that moves them from their queue into history (C1).

Consumption is staged: a turn reads the queues, shows the chosen messages to the model, and commits their
consumption together with the response's first durable write (`write_consumption` runs inside that
transaction). So a message is never both queued and in history, and never neither; if the process dies
before that write, the message is still queued and the next owner consumes it again. A failed or aborted
turn commits its consumption with the failure note or the abort, so a failing input is answered once.
"""

from __future__ import annotations

from typing import Any

from stead.core import records as R
from stead.core.config import SETTING_NAMES
from stead.core.events import MessageConsumed
from stead.core.hooks import MessageConsumedInfo, PermissionModeChangedInfo
from stead.core.records import Pending, Queued
from stead.core.state import AgentState, Turn
from stead.messages import Message, dumps
from stead.store.base import Tx

__all__ = ["apply_settings", "consumption_published", "plan", "write_consumption"]


def plan(st: AgentState, pending: Pending, queued: list[Queued]) -> list[Queued] | None:
    """Which queued messages the next inference consumes (C2); None when nothing is owed. Steering
    outranks sends; sends are taken only when no inference is owed (tool results, a retried request)."""
    steer = [q for q in queued if q.key.startswith(R.STEER)]
    if steer:
        return steer if st.config.steering_mode == "all" else steer[:1]
    if pending.inference_id is not None:
        return []
    sends = [q for q in queued if q.key.startswith(R.SEND)]
    if sends:
        return sends if st.config.send_mode == "all" else sends[:1]
    return None


def apply_settings(st: AgentState, take: list[Queued]) -> tuple[dict[str, Any], bool]:
    """C3/K2: settings carried by consumed messages, later ones winning; whether they reset history."""
    current = st.settings
    if not any(q.settings for q in take):
        return current, False
    new = dict(current)
    for q in take:
        for k, v in q.settings.items():
            if k in SETTING_NAMES and v is not None:
                new[k] = v
    if new == current:
        return current, False
    return new, not st.env.compatible(current, new)


def _message(q: Queued) -> Message:
    return q.message()


async def write_consumption(st: AgentState, tx: Tx, turn: Turn) -> list[dict[str, Any]]:
    """Inside `tx`: delete the turn's queue entries, append them to history (after a reset if the settings
    demand one), persist changed settings, run the consumption hooks. Returns the records appended."""
    if turn.consumed:
        return []
    if turn.context_new and turn.context is not None:
        await tx.write(st.id, R.RUN_CONTEXT, dumps(turn.context.encode()))  # R4: staged like the input
    recs: list[dict[str, Any]] = []
    hooks = st.hooks
    old_mode = str(st.settings.get("permission_mode", "auto"))
    run_id = turn.pending.run_id
    for q in turn.take:
        await tx.delete(st.id, q.key)
        recs.append(q.history_record(run_id))
    if turn.reset:
        await tx.clear(st.id)
        await tx.delete_prefix(st.id, "kv.h.")
        if turn.handoff is not None:
            recs.insert(0, {"k": "s", "x": turn.handoff})  # K2: the handoff opens the new conversation
    if recs:
        await tx.append(st.id, [dumps(r) for r in recs])
    if turn.settings is not st.settings:
        await tx.write(st.id, R.SETTINGS, dumps(turn.settings))
    new_mode = str(turn.settings.get("permission_mode", "auto"))
    mode_changed = new_mode != old_mode and hooks.wants("permission_mode_changed_tx")
    if mode_changed or (turn.take and hooks.wants("message_consumed_tx")):
        ctx = st.hook_ctx(tx, turn.pending, inference_id=turn.inference_id)
        ctx.settings = dict(turn.settings)
        if mode_changed:
            await hooks.permission_mode_changed_tx(ctx, PermissionModeChangedInfo(old_mode, new_mode))
        if hooks.wants("message_consumed_tx"):
            for q in turn.take:
                await hooks.message_consumed_tx(ctx, MessageConsumedInfo(_message(q)))
    return recs


def consumption_published(st: AgentState, turn: Turn) -> None:
    """After the commit that consumed the turn's input: the mirror's settings, a reset history, events."""
    if turn.consumed:
        return
    turn.consumed = True
    if turn.context_new:
        turn.context_new = False
        st.context_run, st.context = turn.pending.run_id, turn.context
    st.publish_settings(turn.settings)
    if turn.reset:
        st.publish_records([], reset=True)
    if st.listening:
        for q in turn.take:
            st.emit(MessageConsumed(_message(q)))
