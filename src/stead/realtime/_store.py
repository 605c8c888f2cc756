"""The realtime plugin's tables, per store dialect, and the statements that read and write them.

Scripts are split on ';' by the store: no semicolons inside statements. Every statement below is plain SQL
that SQLite and PostgreSQL both run (`?` placeholders, `ON CONFLICT`, partial indexes); the two dialects
differ only in column types.

- `realtime_agents`: one stable id per realtime definition name (its runs and delegations hang off it).
- `realtime_sessions`: one row per session (reopened with the same id after a reconnect by the client).
- `realtime_delegations`: one row per `invoke_target_agent` call (`call_id` UNIQUE: a repeated call never
  starts a second child); `status` moves from `running` to a settled status once, `delivered_at` is set once,
  when the result was spoken.
- `realtime_transcripts`: one row per turn (`in_progress` → `complete`), ordered by `seq` per session.
"""

from __future__ import annotations

from stead.extend import Migrations

__all__ = ["MIGRATIONS", "MODULE"]

MODULE = "realtime"


def _schema(real: str, pk_suffix: str) -> str:
    return f"""
    CREATE TABLE realtime_agents (
        name TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL UNIQUE,
        created_at {real} NOT NULL
    ){pk_suffix};
    CREATE TABLE realtime_sessions (
        id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        agent_name TEXT NOT NULL,
        run_id TEXT NOT NULL,
        prompt_step_id TEXT NOT NULL,
        model TEXT,
        status TEXT NOT NULL CHECK (status IN ('open', 'closed', 'dropped', 'failed')),
        started_at {real} NOT NULL,
        ended_at {real},
        usage_json TEXT,
        error TEXT
    ){pk_suffix};
    CREATE INDEX realtime_sessions_by_agent ON realtime_sessions(agent_id, started_at);
    CREATE TABLE realtime_delegations (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        call_id TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        step_id TEXT NOT NULL,
        target TEXT NOT NULL,
        child_agent_id TEXT NOT NULL,
        child_run_id TEXT,
        message_id TEXT NOT NULL,
        request TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
        result_json TEXT,
        created_at {real} NOT NULL,
        settled_at {real},
        delivered_at {real}
    ){pk_suffix};
    CREATE INDEX realtime_delegations_undelivered ON realtime_delegations(agent_id, created_at)
        WHERE delivered_at IS NULL;
    CREATE TABLE realtime_transcripts (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        text TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('in_progress', 'complete')),
        item_id TEXT,
        audio_start_ms INTEGER,
        audio_end_ms INTEGER,
        started_at {real} NOT NULL,
        ended_at {real},
        PRIMARY KEY (session_id, seq)
    ){pk_suffix}
    """


MIGRATIONS: Migrations = {
    "sqlite": {MODULE: [_schema("REAL", " WITHOUT ROWID")]},
    "postgresql": {MODULE: [_schema("DOUBLE PRECISION", "")]},
}

DELEGATION_COLS = (
    "id, session_id, agent_id, call_id, run_id, step_id, target, child_agent_id, child_run_id, message_id, "
    "request, status, result_json, created_at, settled_at, delivered_at"
)
