"""SEC2 helpers: rows a realtime session of an agent leaves, and a count of every kind of row the layers
keep about one agent (the deletion tests check they all go with it)."""

from __future__ import annotations

import time

from stead.store.base import Store

__all__ = ["agent_rows", "seed_realtime"]

_COUNTS = {
    "kv": "SELECT COUNT(*) FROM kv WHERE agent_id = ?",
    "history": "SELECT COUNT(*) FROM history WHERE agent_id = ?",
    "runs": "SELECT COUNT(*) FROM runs WHERE agent_id = ?",
    "run_steps": "SELECT COUNT(*) FROM run_steps WHERE run_id IN (SELECT id FROM runs WHERE agent_id = ?)",
    "approvals": "SELECT COUNT(*) FROM approvals WHERE agent_id = ?",
    "memory_notes": "SELECT COUNT(*) FROM memory_notes WHERE agent_id = ?",
    "memory_events": "SELECT COUNT(*) FROM memory_events WHERE agent_id = ?",
    "realtime_agents": "SELECT COUNT(*) FROM realtime_agents WHERE agent_id = ?",
    "realtime_sessions": "SELECT COUNT(*) FROM realtime_sessions WHERE agent_id = ?",
    "realtime_delegations": "SELECT COUNT(*) FROM realtime_delegations WHERE agent_id = ?",
    "realtime_transcripts": "SELECT COUNT(*) FROM realtime_transcripts WHERE session_id = 'rt-session-of-a'",
}


async def agent_rows(store: Store, agent_id: str, *, server: bool = True) -> dict[str, int]:
    """How many rows of each kind the store holds about `agent_id` (`stead_events` with the server)."""
    counts = dict(_COUNTS)
    if server:
        counts["stead_events"] = "SELECT COUNT(*) FROM stead_events WHERE agent_id = ?"
    out: dict[str, int] = {}
    async with store.transaction() as tx:
        for name, sql in counts.items():
            params = () if "?" not in sql else (agent_id,)
            out[name] = int((await tx.fetch(sql, params))[0][0])
    return out


async def seed_realtime(store: Store, agent_id: str) -> None:
    """The rows one realtime session of `agent_id` leaves: its name, the session, a transcript line and a
    delegation."""
    now = time.time()
    async with store.transaction() as tx:
        await tx.execute(
            "INSERT INTO realtime_agents(name, agent_id, created_at) VALUES (?, ?, ?)",
            (f"voice-{agent_id}", agent_id, now),
        )
        await tx.execute(
            "INSERT INTO realtime_sessions(id, agent_id, agent_name, run_id, prompt_step_id, model, status, "
            "started_at) VALUES ('rt-session-of-a', ?, 'voice', 'rt-run', 'rt-step', 'fake', 'closed', ?)",
            (agent_id, now),
        )
        await tx.execute(
            "INSERT INTO realtime_transcripts(session_id, seq, role, text, status, started_at) "
            "VALUES ('rt-session-of-a', 1, 'user', 'A said something private', 'complete', ?)",
            (now,),
        )
        await tx.execute(
            "INSERT INTO realtime_delegations(id, session_id, agent_id, call_id, run_id, step_id, target, "
            "child_agent_id, message_id, request, status, created_at) VALUES ('rt-del', 'rt-session-of-a', "
            "?, 'rt-call', 'rt-run', 'rt-step', 'helper', 'child', 'rt-msg', 'asked', 'running', ?)",
            (agent_id, now),
        )
