"""The memory tables through a transaction: every SQL statement the plugin runs, per dialect where SQLite
and PostgreSQL differ (lexical search and its index rows). Placeholders are `?` on both (the PostgreSQL store
translates them). Nothing here commits: callers pass the transaction the change belongs to.
"""

from __future__ import annotations

import json
import re
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any

from stead.extend import Tx, new_id
from stead.memory._model import Example, Note, Scope

__all__ = [
    "EXAMPLE_COLS",
    "NOTE_COLS",
    "decode_vector",
    "encode_vector",
    "fts_query",
    "lexical_tokens",
]

NOTE_COLS = (
    "seq, id, body, type, status, author, provenance, trust, priority, tenant, agent_id, user_id, "
    "scope_primary, scope_secondary, created_at, updated_at, expires_at, source_agent_id, source_run_id, "
    "source_call_id, superseded_by, access_count"
)
EXAMPLE_COLS = (
    "seq, id, input, output, rating, status, tenant, agent_id, user_id, scope_primary, scope_secondary, "
    "created_at"
)

# English function words: they carry no topic, and OR-ing them into the lexical query lets any note that
# shares "the" or "is" with the query rank (measured: docs/benchmarks.md, memory retrieval).
STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are aren as at be because been before being
    below between both but by can cannot could did do does doing don down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it its
    itself just let me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them themselves then
    there these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves s t ll re ve d m o y also i'm
    it's please like get got tell know want need thing things something anything really much many
    """.split()  # noqa: SIM905
)
_WORD = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_TOKENS = 32


def lexical_tokens(text: str, *, stopwords: bool = True) -> list[str]:
    """The words a lexical query looks for: lowercase `\\w+` tokens, stopwords dropped (unless that leaves
    nothing), duplicates removed, at most 32."""
    tokens = _WORD.findall(text.lower())
    kept = [t for t in tokens if t not in STOPWORDS] if stopwords else tokens
    if not kept:
        kept = tokens
    return list(dict.fromkeys(kept))[:MAX_QUERY_TOKENS]


def fts_query(tokens: Sequence[str]) -> str:
    """An FTS5 MATCH expression that is always valid: every token quoted, OR-ed. Tokens are `\\w+` runs, so
    they hold no quote; raw text in MATCH raises errors (`dark-mode` → "no such column: mode")."""
    return " OR ".join(f'"{t}"' for t in tokens)


def encode_vector(vector: Sequence[float]) -> bytes:
    """float32, little-endian."""
    a = array("f", vector)
    if sys.byteorder == "big":  # pragma: no cover
        a.byteswap()
    return a.tobytes()


def decode_vector(blob: bytes) -> list[float]:
    a = array("f")
    a.frombytes(bytes(blob))
    if sys.byteorder == "big":  # pragma: no cover
        a.byteswap()
    return a.tolist()


def _secondary(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    value = json.loads(raw)
    return value if isinstance(value, dict) else None


def note_from_row(r: Sequence[Any], score: float | None = None) -> Note:
    return Note(
        id=r[1],
        text=r[2],
        type=r[3],
        status=r[4],
        author=r[5],
        provenance=r[6],
        trust=r[7],
        priority=int(r[8]),
        tenant=r[9],
        agent=r[10],
        user=r[11],
        scope_primary=r[12],
        scope_secondary=_secondary(r[13]),
        created_at=float(r[14]),
        updated_at=float(r[15]),
        expires_at=None if r[16] is None else float(r[16]),
        source_agent=r[17],
        source_run=r[18],
        source_call=r[19],
        superseded_by=r[20],
        access_count=int(r[21]),
        score=score,
    )


def example_from_row(r: Sequence[Any], score: float | None = None) -> Example:
    return Example(
        id=r[1],
        input=r[2],
        output=r[3],
        rating=None if r[4] is None else float(r[4]),
        status=r[5],
        tenant=r[6],
        agent=r[7],
        user=r[8],
        scope_primary=r[9],
        scope_secondary=_secondary(r[10]),
        created_at=float(r[11]),
        score=score,
    )


def scope_sql(scope: Scope, alias: str = "") -> tuple[str, list[Any]]:
    """Items visible in `scope`: each of tenant, agent, user and primary scope empty on the item or equal
    (an empty caller field matches only empty item fields). Secondary dimensions are checked in Python
    (`Scope.admits`)."""
    a = alias
    sql = (
        f"({a}tenant IS NULL OR {a}tenant = ?) AND ({a}agent_id IS NULL OR {a}agent_id = ?) "
        f"AND ({a}user_id IS NULL OR {a}user_id = ?) AND ({a}scope_primary IS NULL OR {a}scope_primary = ?)"
    )
    return sql, [scope.tenant, scope.agent, scope.user, scope.primary]


def visible_sql(
    alias: str = "", *, provisional: bool = True, tainted: bool = False, archived: bool = False
) -> tuple[str, list[Any]]:
    """Notes that may be shown: not archived, not expired, trusted (unless asked otherwise)."""
    a = alias
    statuses = ["active"] + (["provisional"] if provisional else []) + (["archived"] if archived else [])
    marks = ", ".join("?" for _ in statuses)
    sql = f"{a}status IN ({marks}) AND ({a}expires_at IS NULL OR {a}expires_at > ?)"
    params: list[Any] = [*statuses, time.time()]
    if not tainted:
        sql += f" AND {a}trust = 'trusted'"
    return sql, params


class MemorySql:
    """SQL for one store dialect (`sqlite` or `postgresql`)."""

    def __init__(self, dialect: str) -> None:
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"memory supports sqlite and postgresql stores, not {dialect!r}")
        self.dialect = dialect

    # ------------------------------------------------------------------ notes
    async def insert_note(
        self,
        tx: Tx,
        *,
        text: str,
        type: str,
        status: str,
        author: str,
        provenance: str,
        trust: str,
        scope: Scope,
        body_hash: str,
        priority: int = 0,
        expires_at: float | None = None,
        source_agent: str | None = None,
        source_run: str | None = None,
        source_call: str | None = None,
        note_id: str | None = None,
    ) -> tuple[int, Note]:
        now = time.time()
        nid = note_id or new_id()
        secondary = json.dumps(dict(scope.secondary), sort_keys=True) if scope.secondary else None
        await tx.execute(
            "INSERT INTO memory_notes(id, tenant, agent_id, user_id, scope_primary, scope_secondary, type, "
            "body, status, author, provenance, trust, priority, access_count, expires_at, source_agent_id, "
            "source_run_id, source_call_id, body_hash, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?)",
            (
                nid,
                scope.tenant,
                scope.agent,
                scope.user,
                scope.primary,
                secondary,
                type,
                text,
                status,
                author,
                provenance,
                trust,
                priority,
                expires_at,
                source_agent,
                source_run,
                source_call,
                body_hash,
                now,
                now,
            ),
        )
        (row,) = await tx.fetch(f"SELECT {NOTE_COLS} FROM memory_notes WHERE id = ?", (nid,))
        seq = int(row[0])
        if self.dialect == "sqlite":
            await tx.execute("INSERT INTO memory_notes_fts(rowid, body) VALUES (?, ?)", (seq, text))
        return seq, note_from_row(row)

    async def note(self, tx: Tx, note_id: str) -> tuple[int, Note] | None:
        rows = await tx.fetch(f"SELECT {NOTE_COLS} FROM memory_notes WHERE id = ?", (note_id,))
        return (int(rows[0][0]), note_from_row(rows[0])) if rows else None

    async def notes_by_seq(self, tx: Tx, seqs: Sequence[int]) -> dict[int, Note]:
        out: dict[int, Note] = {}
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            for r in await tx.fetch(f"SELECT {NOTE_COLS} FROM memory_notes WHERE seq IN ({marks})", chunk):
                out[int(r[0])] = note_from_row(r)
        return out

    async def set_status(
        self,
        tx: Tx,
        note_id: str,
        *,
        status: str,
        trust: str | None = None,
        clear_expiry: bool = False,
        superseded_by: str | None = None,
    ) -> int:
        sets = ["status = ?", "updated_at = ?"]
        params: list[Any] = [status, time.time()]
        if trust is not None:
            sets.append("trust = ?")
            params.append(trust)
        if clear_expiry:
            sets.append("expires_at = NULL")
        if superseded_by is not None:
            sets.append("superseded_by = ?")
            params.append(superseded_by)
        return await tx.execute(f"UPDATE memory_notes SET {', '.join(sets)} WHERE id = ?", (*params, note_id))

    async def reinforce(self, tx: Tx, note_id: str) -> None:
        now = time.time()
        await tx.execute(
            "UPDATE memory_notes SET access_count = access_count + 1, last_accessed_at = ?, updated_at = ? "
            "WHERE id = ?",
            (now, now, note_id),
        )

    async def delete_note(self, tx: Tx, seq: int, note_id: str) -> None:
        await tx.execute("DELETE FROM memory_vectors WHERE kind = 'note' AND item_seq = ?", (seq,))
        if self.dialect == "sqlite":
            await tx.execute("DELETE FROM memory_notes_fts WHERE rowid = ?", (seq,))
        await tx.execute("DELETE FROM memory_notes WHERE id = ?", (note_id,))

    async def delete_agent(self, tx: Tx, agent_id: str) -> None:
        """SEC2: every note and example scoped to the agent, with their index rows and vectors, and the
        audit events about it (they quote bodies): a re-created id starts with none."""
        for kind, table in (("note", "memory_notes"), ("example", "memory_examples")):
            owned = f"SELECT seq FROM {table} WHERE agent_id = ?"
            await tx.execute(
                f"DELETE FROM memory_vectors WHERE kind = '{kind}' AND item_seq IN ({owned})", (agent_id,)
            )
            if self.dialect == "sqlite":
                await tx.execute(f"DELETE FROM {table}_fts WHERE rowid IN ({owned})", (agent_id,))
            await tx.execute(f"DELETE FROM {table} WHERE agent_id = ?", (agent_id,))
        await tx.execute("DELETE FROM memory_events WHERE agent_id = ?", (agent_id,))

    async def list_notes(
        self,
        tx: Tx,
        *,
        tenant: str | None,
        agent: str | None,
        user: str | None,
        status: str | None,
        limit: int | None = None,
    ) -> list[Note]:
        where: list[str] = []
        params: list[Any] = []
        for col, value in (("tenant", tenant), ("agent_id", agent), ("user_id", user), ("status", status)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = f"SELECT {NOTE_COLS} FROM memory_notes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, seq DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [note_from_row(r) for r in await tx.fetch(sql, params)]

    async def expired(self, tx: Tx, now: float) -> list[tuple[int, Note]]:
        rows = await tx.fetch(
            f"SELECT {NOTE_COLS} FROM memory_notes WHERE status = 'provisional' AND expires_at IS NOT NULL "
            "AND expires_at <= ?",
            (now,),
        )
        return [(int(r[0]), note_from_row(r)) for r in rows]

    # ------------------------------------------------------------------ examples
    async def insert_example(
        self, tx: Tx, *, input: str, output: str, rating: float | None, scope: Scope, author: str
    ) -> tuple[int, Example]:
        now = time.time()
        eid = new_id()
        secondary = json.dumps(dict(scope.secondary), sort_keys=True) if scope.secondary else None
        await tx.execute(
            "INSERT INTO memory_examples(id, tenant, agent_id, user_id, scope_primary, scope_secondary, "
            "input, output, rating, status, author, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?)",
            (
                eid,
                scope.tenant,
                scope.agent,
                scope.user,
                scope.primary,
                secondary,
                input,
                output,
                rating,
                author,
                now,
                now,
            ),
        )
        (row,) = await tx.fetch(f"SELECT {EXAMPLE_COLS} FROM memory_examples WHERE id = ?", (eid,))
        seq = int(row[0])
        if self.dialect == "sqlite":
            await tx.execute("INSERT INTO memory_examples_fts(rowid, input) VALUES (?, ?)", (seq, input))
        return seq, example_from_row(row)

    async def examples_by_seq(self, tx: Tx, seqs: Sequence[int]) -> dict[int, Example]:
        out: dict[int, Example] = {}
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            for r in await tx.fetch(
                f"SELECT {EXAMPLE_COLS} FROM memory_examples WHERE seq IN ({marks})", chunk
            ):
                out[int(r[0])] = example_from_row(r)
        return out

    async def example(self, tx: Tx, example_id: str) -> tuple[int, Example] | None:
        rows = await tx.fetch(f"SELECT {EXAMPLE_COLS} FROM memory_examples WHERE id = ?", (example_id,))
        return (int(rows[0][0]), example_from_row(rows[0])) if rows else None

    async def delete_example(self, tx: Tx, seq: int, example_id: str) -> None:
        await tx.execute("DELETE FROM memory_vectors WHERE kind = 'example' AND item_seq = ?", (seq,))
        if self.dialect == "sqlite":
            await tx.execute("DELETE FROM memory_examples_fts WHERE rowid = ?", (seq,))
        await tx.execute("DELETE FROM memory_examples WHERE id = ?", (example_id,))

    async def list_examples(self, tx: Tx, *, agent: str | None, user: str | None) -> list[Example]:
        where: list[str] = ["status = 'active'"]
        params: list[Any] = []
        for col, value in (("agent_id", agent), ("user_id", user)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = (
            f"SELECT {EXAMPLE_COLS} FROM memory_examples WHERE {' AND '.join(where)} ORDER BY created_at DESC"
        )
        return [example_from_row(r) for r in await tx.fetch(sql, params)]

    # ------------------------------------------------------------------ search pieces
    def _table(self, kind: str) -> str:
        return "memory_notes" if kind == "note" else "memory_examples"

    async def count_visible(
        self, tx: Tx, kind: str, scope: Scope, limit: int, *, provisional: bool = True, tainted: bool = False
    ) -> int:
        """How many items are visible in `scope`, counting no further than `limit + 1` (an index scan of at
        most that many entries: "more than `limit`" is all a caller needs to know)."""
        where, params = self._visible_where(kind, scope, provisional, tainted)
        table = self._table(kind)
        count = await tx.fetch(
            f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {where} LIMIT {int(limit) + 1}) AS c", params
        )
        return int(count[0][0])

    async def candidates(
        self,
        tx: Tx,
        kind: str,
        scope: Scope,
        *,
        provisional: bool = True,
        tainted: bool = False,
        limit: int | None = None,
    ) -> tuple[list[int], list[tuple[int, Any]]] | None:
        """Every item visible in `scope`: the seqs of those without secondary dimensions, and (seq,
        secondary JSON) of those with some (still to be checked with `Scope.admits`). The first query reads
        a covering index only. With `limit`: None when more than `limit` items are visible (the caller
        searches the other way round: best vectors first, visibility checked after)."""
        where, params = self._visible_where(kind, scope, provisional, tainted)
        table = self._table(kind)
        # counted in SQL (an index scan), not shipped: a wide scope costs no list of ids
        wide = limit is not None and (
            await self.count_visible(tx, kind, scope, limit, provisional=provisional, tainted=tainted) > limit
        )
        if wide:
            return None
        plain = await tx.fetch(f"SELECT seq FROM {table} WHERE {where} AND scope_secondary IS NULL", params)
        dims = await tx.fetch(
            f"SELECT seq, scope_secondary FROM {table} WHERE {where} AND scope_secondary IS NOT NULL",
            params,
        )
        return [int(r[0]) for r in plain], [(int(r[0]), r[1]) for r in dims]

    async def visible_among(
        self,
        tx: Tx,
        kind: str,
        scope: Scope,
        seqs: Sequence[int],
        *,
        provisional: bool = True,
        tainted: bool = False,
    ) -> list[tuple[int, Any]]:
        """(seq, secondary JSON or None) of those of `seqs` visible in `scope` (the same rule as
        `candidates`; secondary dimensions still to be checked with `Scope.admits`)."""
        where, params = self._visible_where(kind, scope, provisional, tainted)
        table = self._table(kind)
        out: list[tuple[int, Any]] = []
        # the ids first, then one primary-key lookup each (SQLite's CROSS JOIN fixes that order: left to
        # itself it may scan the scope's index instead, reading every visible row)
        join = "CROSS JOIN" if self.dialect == "sqlite" else "JOIN"
        for i in range(0, len(seqs), 500):
            chunk = [int(x) for x in seqs[i : i + 500]]
            marks = ", ".join("(?)" for _ in chunk)
            rows = await tx.fetch(
                f"WITH ids(seq) AS (VALUES {marks}) SELECT n.seq, n.scope_secondary FROM ids "
                f"{join} {table} n ON n.seq = ids.seq WHERE {where}",
                [*chunk, *params],
            )
            out.extend((int(r[0]), r[1]) for r in rows)
        return out

    def _visible_where(
        self, kind: str, scope: Scope, provisional: bool, tainted: bool
    ) -> tuple[str, list[Any]]:
        where, params = scope_sql(scope)
        if kind == "note":
            vis, vparams = visible_sql(provisional=provisional, tainted=tainted)
        else:
            vis, vparams = "status = 'active'", []
        return f"{where} AND {vis}", [*params, *vparams]

    async def lexical(
        self,
        tx: Tx,
        kind: str,
        scope: Scope,
        tokens: Sequence[str],
        limit: int,
        *,
        provisional: bool = True,
        tainted: bool = False,
    ) -> list[tuple[int, Any]]:
        """(seq, secondary JSON or None) of the best lexical matches visible in `scope`, best first (BM25 /
        ts_rank_cd; ties by seq), secondary dimensions still to be checked with `Scope.admits`."""
        if not tokens:
            return []
        table = self._table(kind)
        where, params = scope_sql(scope, "n.")
        if kind == "note":
            vis, vparams = visible_sql("n.", provisional=provisional, tainted=tainted)
        else:
            vis, vparams = "n.status = 'active'", []
        if self.dialect == "sqlite":
            fts = f"{table}_fts"
            sql = (
                f"SELECT n.seq, n.scope_secondary FROM {fts} JOIN {table} n ON n.seq = {fts}.rowid "
                f"WHERE {fts} MATCH ? AND {where} AND {vis} ORDER BY bm25({fts}), n.seq LIMIT {int(limit)}"
            )
            rows = await tx.fetch(sql, [fts_query(tokens), *params, *vparams])
        else:
            query = " | ".join(tokens)
            sql = (
                f"SELECT n.seq, n.scope_secondary FROM {table} n WHERE n.tsv @@ to_tsquery('english', ?) "
                f"AND {where} AND {vis} "
                f"ORDER BY ts_rank_cd(n.tsv, to_tsquery('english', ?)) DESC, n.seq DESC LIMIT {int(limit)}"
            )
            rows = await tx.fetch(sql, [query, *params, *vparams, query])
        return [(int(r[0]), r[1]) for r in rows]

    async def lexical_any(self, tx: Tx, kind: str, tokens: Sequence[str], limit: int) -> list[int] | None:
        """Seqs of the best lexical matches of every item, visible or not, best first, in the same order as
        `lexical` (BM25, then seq) — SQLite only (None on PostgreSQL, whose lexical index lives in the
        items' own table: its `lexical` joins nothing). Without the join to the items table, FTS5 ranks
        1,000,000 notes' ~24,000 matches in ~20 ms instead of ~110 ms; the caller checks visibility of
        the few it keeps."""
        if self.dialect != "sqlite" or not tokens:
            return None
        fts = f"{self._table(kind)}_fts"
        rows = await tx.fetch(
            f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? ORDER BY bm25({fts}), rowid LIMIT {int(limit)}",
            [fts_query(tokens)],
        )
        return [int(r[0]) for r in rows]

    async def ordered(
        self,
        tx: Tx,
        kind: str,
        scope: Scope,
        order: str,
        limit: int,
        *,
        provisional: bool = True,
        tainted: bool = False,
    ) -> list[tuple[int, Any]]:
        """(seq, secondary) in scope by `order`: `recent` (newest first) or `priority` (priority, then
        type — constraints, preferences, issues, context — then newest; examples: best rated, then
        newest)."""
        where, params = scope_sql(scope)
        table = self._table(kind)
        if kind == "note":
            vis, vparams = visible_sql(provisional=provisional, tainted=tainted)
            by = (
                "created_at DESC, seq DESC"
                if order == "recent"
                else "priority DESC, CASE type WHEN 'constraint' THEN 0 WHEN 'preference' THEN 1 "
                "WHEN 'issue' THEN 2 ELSE 3 END, created_at DESC, seq DESC"
            )
        else:
            vis, vparams = "status = 'active'", []
            by = (
                "created_at DESC, seq DESC"
                if order == "recent"
                else "CASE WHEN rating IS NULL THEN 1 ELSE 0 END, rating DESC, created_at DESC, seq DESC"
            )
        rows = await tx.fetch(
            f"SELECT seq, scope_secondary FROM {table} WHERE {where} AND {vis} "
            f"ORDER BY {by} LIMIT {int(limit)}",
            [*params, *vparams],
        )
        return [(int(r[0]), r[1]) for r in rows]

    # ------------------------------------------------------------------ vectors
    async def put_vector(self, tx: Tx, kind: str, item_seq: int, model: str, vector: Sequence[float]) -> None:
        await tx.execute(
            "INSERT INTO memory_vectors(kind, item_seq, model, dims, embedding) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (kind, item_seq, model) DO NOTHING",
            (kind, item_seq, model, len(vector), encode_vector(vector)),
        )

    async def vectors_after(
        self, tx: Tx, kind: str, model: str, after: int, limit: int | None = None
    ) -> list[tuple[int, int, bytes]]:
        """(vector seq, item seq, float32 bytes) of `model`'s vectors written after vector seq `after`, in
        seq order (at most `limit`)."""
        rows = await tx.fetch(
            "SELECT seq, item_seq, embedding FROM memory_vectors WHERE kind = ? AND model = ? AND seq > ? "
            "ORDER BY seq" + ("" if limit is None else f" LIMIT {int(limit)}"),
            (kind, model, after),
        )
        return [(int(r[0]), int(r[1]), bytes(r[2])) for r in rows]

    async def count_vectors_after(self, tx: Tx, kind: str, model: str, after: int) -> int:
        """How many of `model`'s vectors were written after vector seq `after` (an index range)."""
        rows = await tx.fetch(
            "SELECT count(*) FROM memory_vectors WHERE kind = ? AND model = ? AND seq > ?",
            (kind, model, after),
        )
        return int(rows[0][0])

    async def scope_vectors(self, tx: Tx, scope: Scope, model: str) -> list[tuple[Note, list[float]]]:
        """Live notes visible in `scope` (as retrieval sees them), with their `model` vectors: the
        near-duplicate check of agent writes."""
        where, params = scope_sql(scope, "n.")
        rows = await tx.fetch(
            f"SELECT {', '.join('n.' + c.strip() for c in NOTE_COLS.split(','))}, v.embedding "
            # CROSS JOIN: SQLite keeps this order (the scope's notes first, by index), PostgreSQL plans freely
            "FROM memory_notes n CROSS JOIN memory_vectors v "
            f"WHERE n.status IN ('active', 'provisional') AND {where} "
            "AND v.kind = 'note' AND v.item_seq = n.seq AND v.model = ?",
            (*params, model),
        )
        return [(note_from_row(r), decode_vector(r[-1])) for r in rows]

    async def scope_hash(self, tx: Tx, scope: Scope, body_hash: str) -> Note | None:
        """A live note visible in `scope` with the same normalized text."""
        where, params = scope_sql(scope)
        rows = await tx.fetch(
            f"SELECT {NOTE_COLS} FROM memory_notes "
            f"WHERE body_hash = ? AND status IN ('active', 'provisional') AND {where} ORDER BY seq LIMIT 1",
            (body_hash, *params),
        )
        return note_from_row(rows[0]) if rows else None

    async def missing_vectors(self, tx: Tx, kind: str, model: str, limit: int) -> list[tuple[int, str]]:
        """Live items without a `model` vector (to re-embed after the embedder changed)."""
        table = self._table(kind)
        text = "body" if kind == "note" else "input"
        rows = await tx.fetch(
            f"SELECT t.seq, t.{text} FROM {table} t WHERE t.status != 'archived' AND NOT EXISTS "
            "(SELECT 1 FROM memory_vectors v WHERE v.kind = ? AND v.item_seq = t.seq AND v.model = ?) "
            f"ORDER BY t.seq LIMIT {int(limit)}",
            (kind, model),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    # ------------------------------------------------------------------ audit
    async def event(
        self,
        tx: Tx,
        *,
        event: str,
        kind: str = "note",
        item_id: str | None,
        old_text: str | None = None,
        new_text: str | None = None,
        agent: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        call_id: str | None = None,
        reason: str | None = None,
        actor: str = "human",
    ) -> str:
        eid = new_id()
        await tx.execute(
            "INSERT INTO memory_events(id, item_id, kind, event, old_body, new_body, agent_id, user_id, "
            "tenant, run_id, call_id, reason, actor, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                eid,
                item_id,
                kind,
                event,
                old_text,
                new_text,
                agent,
                user,
                tenant,
                run_id,
                call_id,
                reason,
                actor,
                time.time(),
            ),
        )
        return eid

    async def events(
        self, tx: Tx, *, item_id: str | None = None, run_id: str | None = None
    ) -> list[tuple[Any, ...]]:
        where: list[str] = []
        params: list[Any] = []
        if item_id is not None:
            where.append("item_id = ?")
            params.append(item_id)
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        sql = (
            "SELECT id, item_id, kind, event, old_body, new_body, agent_id, user_id, run_id, call_id, "
            "reason, actor, created_at FROM memory_events"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        return await tx.fetch(sql + " ORDER BY seq", params)
