"""The `approvals` table, per store dialect, and the statements the policy plugin runs (portable SQL: `?`
placeholders, which both stores accept)."""

from __future__ import annotations

__all__ = ["COLUMNS", "MIGRATIONS", "MODULE"]

MODULE = "policy"

_TABLE = """
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    root_run_id TEXT NOT NULL,
    call_id TEXT NOT NULL UNIQUE,
    tool TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    effects TEXT NOT NULL,
    destructive INTEGER NOT NULL DEFAULT 0,
    mode TEXT NOT NULL,
    reason TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired', 'cancelled')),
    decision_note TEXT,
    edited_arguments_json TEXT,
    decided_by TEXT,
    created_at {real} NOT NULL,
    decided_at {real},
    expires_at {real}
);
CREATE INDEX approvals_by_status ON approvals(status, created_at);
CREATE INDEX approvals_by_agent ON approvals(agent_id, created_at);
CREATE INDEX approvals_by_root ON approvals(root_run_id, created_at);
CREATE INDEX approvals_expiring ON approvals(expires_at) WHERE status = 'pending' AND expires_at IS NOT NULL
"""

MIGRATIONS = {
    "sqlite": {MODULE: [_TABLE.format(real="REAL")]},
    "postgresql": {MODULE: [_TABLE.format(real="DOUBLE PRECISION")]},
}

COLUMNS = (
    "id, agent_id, run_id, root_run_id, call_id, tool, arguments_json, effects, destructive, mode, reason, "
    "status, decision_note, edited_arguments_json, decided_by, created_at, decided_at, expires_at"
)
INSERT = (
    f"INSERT INTO approvals({COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, ?, NULL, ?)"
)
SELECT = f"SELECT {COLUMNS} FROM approvals"
DECIDE = (
    "UPDATE approvals SET status = ?, decision_note = ?, edited_arguments_json = ?, decided_by = ?, "
    "decided_at = ? WHERE id = ? AND status = 'pending'"
)
DECIDE_CALL = (
    "UPDATE approvals SET status = ?, decision_note = ?, decided_by = ?, decided_at = ? "
    "WHERE call_id = ? AND status = 'pending'"
)
DUE = "SELECT id FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?"
NEXT_EXPIRY = "SELECT MIN(expires_at) FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL"
