"""The memory plugin's tables, per store dialect (module `memory`).

Both dialects hold the same rows: notes, examples, their vectors (float32, L2-normalized, one row per item
and embedding model) and the audit trail. Lexical search is SQLite's FTS5 (a table per item kind, its rowid
the item's `seq`, written by the same statements that write the item) or PostgreSQL's `tsvector` (a
generated column with a GIN index). Vectors are plain BLOB / `bytea` rows scored exactly (numpy) — no
extension is needed on either. `seq` columns only ever grow (AUTOINCREMENT / identity), so an in-memory
vector index can catch up by reading rows past the last `seq` it saw.

Scripts are split on `;` by the SQLite store: no semicolon may appear inside a statement.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "MODULE"]

MODULE = "memory"

_SCOPE_COLS = """
        tenant TEXT,
        agent_id TEXT,
        user_id TEXT,
        scope_primary TEXT,
        scope_secondary TEXT,"""

_NOTE_CHECKS = """
        CHECK (type IN ('preference', 'context', 'constraint', 'issue')),
        CHECK (status IN ('active', 'provisional', 'archived')),
        CHECK (author IN ('human', 'agent', 'system')),
        CHECK (trust IN ('trusted', 'tainted'))"""

_EVENT_CHECK = (
    "CHECK (event IN ('written', 'superseded', 'deduped', 'rejected', 'skipped', 'expired', 'promoted', "
    "'archived', 'deleted'))"
)


def _notes(seq: str, real: str, extra: str = "") -> str:
    return f"""
    CREATE TABLE memory_notes (
        seq {seq},
        id TEXT NOT NULL UNIQUE,{_SCOPE_COLS}
        type TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        author TEXT NOT NULL,
        provenance TEXT NOT NULL,
        trust TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_accessed_at {real},
        expires_at {real},
        source_agent_id TEXT,
        source_run_id TEXT,
        source_call_id TEXT,
        superseded_by TEXT,
        body_hash TEXT NOT NULL,
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL,{extra}{_NOTE_CHECKS}
    );
    CREATE INDEX memory_notes_by_user ON memory_notes(
        user_id, agent_id, tenant, scope_primary, status, trust, expires_at, scope_secondary
    );
    CREATE INDEX memory_notes_by_agent ON memory_notes(agent_id);
    CREATE INDEX memory_notes_by_hash ON memory_notes(body_hash);
    CREATE INDEX memory_notes_by_run ON memory_notes(source_run_id);
    CREATE TABLE memory_examples (
        seq {seq},
        id TEXT NOT NULL UNIQUE,{_SCOPE_COLS}
        input TEXT NOT NULL,
        output TEXT NOT NULL,
        rating {real},
        status TEXT NOT NULL,
        author TEXT NOT NULL,
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL,{extra.replace("body", "input")}
        CHECK (status IN ('active', 'archived')),
        CHECK (author IN ('human', 'agent', 'system'))
    );
    CREATE INDEX memory_examples_by_agent ON memory_examples(
        agent_id, user_id, tenant, scope_primary, status, scope_secondary
    )"""


def _vectors_and_events(seq: str, real: str, blob: str) -> str:
    return f"""
    CREATE TABLE memory_vectors (
        seq {seq},
        kind TEXT NOT NULL,
        item_seq BIGINT NOT NULL,
        model TEXT NOT NULL,
        dims INTEGER NOT NULL,
        embedding {blob} NOT NULL,
        UNIQUE (kind, item_seq, model),
        CHECK (kind IN ('note', 'example'))
    );
    CREATE INDEX memory_vectors_by_model ON memory_vectors(model, kind, seq);
    CREATE TABLE memory_events (
        seq {seq},
        id TEXT NOT NULL,
        item_id TEXT,
        kind TEXT NOT NULL,
        event TEXT NOT NULL,
        old_body TEXT,
        new_body TEXT,
        agent_id TEXT,
        user_id TEXT,
        tenant TEXT,
        run_id TEXT,
        call_id TEXT,
        reason TEXT,
        actor TEXT NOT NULL,
        created_at {real} NOT NULL,
        {_EVENT_CHECK}
    );
    CREATE INDEX memory_events_by_item ON memory_events(item_id);
    CREATE INDEX memory_events_by_run ON memory_events(run_id)"""


_SQLITE = (
    _notes("INTEGER PRIMARY KEY AUTOINCREMENT", "REAL")
    + ";"
    + """
    CREATE VIRTUAL TABLE memory_notes_fts USING fts5(body, tokenize='porter unicode61');
    CREATE VIRTUAL TABLE memory_examples_fts USING fts5(input, tokenize='porter unicode61');"""
    + _vectors_and_events("INTEGER PRIMARY KEY AUTOINCREMENT", "REAL", "BLOB")
)

_TSV = "\n        tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED,"
_POSTGRES = (
    _notes("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "DOUBLE PRECISION", _TSV)
    + ";"
    + """
    CREATE INDEX memory_notes_tsv ON memory_notes USING GIN (tsv);
    CREATE INDEX memory_examples_tsv ON memory_examples USING GIN (tsv);"""
    + _vectors_and_events("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "DOUBLE PRECISION", "BYTEA")
)

MIGRATIONS: dict[str, dict[str, list[str]]] = {
    "sqlite": {MODULE: [_SQLITE]},
    "postgresql": {MODULE: [_POSTGRES]},
}
