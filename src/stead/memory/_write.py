"""Agent writes: the `remember(type, note)` tool and its guards (MemberJunction's, in their order).

The tool is `transactional`: the note, its lexical index row, its vector, the audit event, the run's write
counters, the `memory_write` step and the tool result commit in one transaction — so a crash anywhere leaves
either all of them or none, and the resumed call (re-run, since nothing of it happened) writes exactly once.
Its embedding is computed in the tool's `prepare` step, before that transaction opens.

Guards, in order (the first that decides wins):
1. **type and length**: only `preference` or `context` (descriptive, never instructions), non-empty, at most
   `max_note_chars` (2,000) → else *rejected*;
2. **dedupe within the run**: the same normalized text twice in one run → *skipped* (duplicate);
3. **cap**: at most `max_writes_per_run` (5) new notes per run → *skipped* (cap) — the 6th write of a run;
4. **scope clamp**: always this agent + the run's user (+ tenant), never global, whatever the model hints;
5. **near-duplicates** among the notes visible in that scope (cosine ≥ `near_duplicate`, 0.85): a note
   this run wrote → *superseded* (the new text replaces it: the old note is archived, pointing at the new
   one); an exact restatement of an existing note → *deduped* (that note is reinforced: its access count
   grows); any textual difference → a new note (corrections are never absorbed);
6. **write**: a new `provisional` note by the agent, expiring after `provisional_days` (7), with its source
   agent, run and call → *written*.

**Taint**: a note written after a tool result from an `external` tool in the same run (a tool that declares
no `effects` counts as external) is stored `tainted`: it is never injected until a person promotes it, and
the tool result says so. Every call is a `memory_write` step of the run and an audit event; the disposition
is the tool's result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stead.extend import Tool, ToolContext, Tx, dumps, record_step, tool
from stead.memory._core import MemoryCore
from stead.memory._embedders import cosine
from stead.memory._model import Note, Scope, normalize, text_hash
from stead.memory._render import quote

__all__ = ["KV_TAINT", "KV_WRITES", "WRITE_TYPES", "remember_tool"]

WRITE_TYPES = ("preference", "context")
KV_WRITES = "kv.r.memory.writes"
"""Run KV: the run's write count and the hashes of what it wrote (erased at settlement)."""
KV_TAINT = "kv.r.memory.taint"
"""Run KV: the first external tool result of the run (its tool and call), present once the run is tainted."""
EXTERNAL = "external"


def effects_of(t: Tool | None) -> str:
    """A tool's declared effects (`read`, `write`, `external`); a tool that declares none counts as
    external."""
    return (t.effects or EXTERNAL) if t is not None else EXTERNAL


def similarities(query: Sequence[float], vectors: list[list[float]]) -> list[float]:
    """Cosine of `query` with each vector (numpy when installed)."""
    if not vectors:
        return []
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - vectors exist only with an embedder, which needs numpy
        return [cosine(query, v) for v in vectors]
    m = np.asarray(vectors, dtype=np.float32)
    q = np.asarray(query, dtype=np.float32)
    norms = np.linalg.norm(m, axis=1) * float(np.linalg.norm(q))
    return [float(x) for x in (m @ q) / np.maximum(norms, 1e-12)]


@dataclass
class Outcome:
    disposition: str
    reason: str
    note: Note | None = None
    old: Note | None = None

    def text(self, tainted: bool) -> str:
        head = f"Memory write: {self.disposition}"
        if self.note is not None:
            head += f" (note {self.note.id})"
        out = f"{head} — {self.reason}"
        if tainted and self.disposition in ("written", "superseded"):
            out += (
                " It is stored as tainted (written after an external tool's output in this run): it will not"
                " be used in later conversations until a person promotes it."
            )
        return out


class Writer:
    """The guards and the write, inside the tool's transaction."""

    def __init__(self, core: MemoryCore) -> None:
        self.plugin = core

    async def prepare(self, ctx: ToolContext, arguments: dict[str, Any]) -> list[float] | None:
        """Outside any transaction: the note's embedding (None when semantic search is off or the note
        will be rejected anyway)."""
        note = arguments.get("note")
        cfg = self.plugin.config
        if not isinstance(note, str) or not note.strip() or len(note) > cfg.max_note_chars:
            return None
        if arguments.get("type") not in WRITE_TYPES:
            return None
        vectors = await self.plugin.retriever.embed([note], kind="document")
        return vectors[0] if vectors else None

    async def remember(self, ctx: ToolContext, type: str, note: str, scope_hint: str | None) -> str:
        tx = ctx.tx
        assert tx is not None, "remember is a transactional tool"
        cfg = self.plugin.config
        agent_id, run_id = ctx.agent_id, ctx.run_id
        raw = await tx.get(agent_id, KV_WRITES)
        state: dict[str, Any] = json.loads(raw) if raw else {"n": 0, "h": []}
        taint_raw = await tx.get(agent_id, KV_TAINT)
        tainted = taint_raw is not None
        scope = Scope(tenant=ctx.tenant, agent=agent_id, user=ctx.user)
        settings = self.plugin.settings_for(ctx.extra)
        digest = text_hash(note) if isinstance(note, str) else ""
        if settings is None or not settings.write:
            outcome = Outcome("skipped", "this agent may not write memory: nothing was saved.")
        elif type not in WRITE_TYPES:
            outcome = Outcome(
                "rejected",
                f"type {type!r} is not allowed: an agent may remember only preference or context notes.",
            )
        elif not note.strip():
            outcome = Outcome("rejected", "the note is empty.")
        elif len(note) > cfg.max_note_chars:
            outcome = Outcome(
                "rejected",
                f"the note is {len(note):,} characters; at most {cfg.max_note_chars:,} are allowed.",
            )
        elif digest in state["h"]:
            outcome = Outcome("skipped", "this run already wrote that note (duplicate).")
        elif state["n"] >= cfg.max_writes_per_run:
            outcome = Outcome(
                "skipped",
                f"this run already wrote {cfg.max_writes_per_run} notes, the most one run may (cap).",
            )
        else:
            outcome = await self._write(ctx, tx, scope, type, note, digest, tainted, ctx.prepared)
        if outcome.disposition in ("written", "superseded", "deduped"):
            state["h"].append(digest)
        if outcome.disposition == "written":
            state["n"] += 1
        await tx.write(agent_id, KV_WRITES, dumps(state))
        clamped = scope_hint not in (None, "", "user", "agent+user")
        reason = outcome.reason + (
            f" (scope hint {scope_hint!r} clamped to this agent and user)" if clamped else ""
        )
        rows = self.plugin.rows
        event = {"written": "written", "superseded": "superseded", "deduped": "deduped"}.get(
            outcome.disposition, outcome.disposition
        )
        item = outcome.old if outcome.disposition == "superseded" else outcome.note
        await rows.event(
            tx,
            event=event,
            item_id=item.id if item is not None else None,
            old_text=outcome.old.text if outcome.old is not None else None,
            new_text=note if isinstance(note, str) else None,
            agent=agent_id,
            user=ctx.user,
            tenant=ctx.tenant,
            run_id=run_id,
            call_id=ctx.call_id,
            reason=reason,
            actor="agent",
        )
        if run_id is not None:
            await record_step(
                tx,
                run_id,
                "memory",
                "memory_write",
                status="failed" if outcome.disposition == "rejected" else "completed",
                target="remember",
                input={"type": type, "note": note, "scope_hint": scope_hint},
                output={
                    "disposition": outcome.disposition,
                    "note_id": outcome.note.id if outcome.note is not None else None,
                    "superseded": outcome.old.id if outcome.old is not None else None,
                    "tainted": tainted and outcome.disposition in ("written", "superseded"),
                    "reason": reason,
                },
                error=reason if outcome.disposition == "rejected" else None,
            )
        return Outcome(outcome.disposition, reason, outcome.note, outcome.old).text(tainted)

    async def _write(
        self,
        ctx: ToolContext,
        tx: Tx,
        scope: Scope,
        type: str,
        note: str,
        digest: str,
        tainted: bool,
        vector: Sequence[float] | None,
    ) -> Outcome:
        plugin = self.plugin
        cfg = plugin.config
        rows = plugin.rows
        embedder = plugin.retriever.embedder
        neighbours: list[tuple[float, Note]] = []
        if vector is not None and embedder is not None and len(vector) == embedder.dims:
            found = await rows.scope_vectors(tx, scope, embedder.model)
            for sim, other in zip(
                similarities(vector, [v for _, v in found]), (n for n, _ in found), strict=True
            ):
                if sim >= cfg.near_duplicate:
                    neighbours.append((sim, other))
            neighbours.sort(key=lambda p: -p[0])
            neighbours = neighbours[:3]
        own = [n for _, n in neighbours if n.source_run is not None and n.source_run == ctx.run_id]
        exact = next((n for _, n in neighbours if normalize(n.text) == normalize(note)), None)
        if exact is None:
            exact = await rows.scope_hash(tx, scope, digest)
        if own:
            old = own[0]
            new = await self._insert(ctx, tx, scope, type, note, digest, tainted, vector)
            await rows.set_status(tx, old.id, status="archived", superseded_by=new.id)
            return Outcome(
                "superseded", f"replaced this run's earlier note {old.id} ({quote(old.text)}).", new, old
            )
        if exact is not None:
            await rows.reinforce(tx, exact.id)
            return Outcome("deduped", "an equal note already exists; it was reinforced instead.", exact)
        new = await self._insert(ctx, tx, scope, type, note, digest, tainted, vector)
        days = cfg.provisional_days
        return Outcome("written", f"saved as a provisional {type} note (expires in {days:g} days).", new)

    async def _insert(
        self,
        ctx: ToolContext,
        tx: Tx,
        scope: Scope,
        type: str,
        note: str,
        digest: str,
        tainted: bool,
        vector: Sequence[float] | None,
    ) -> Note:
        plugin = self.plugin
        seq, new = await plugin.rows.insert_note(
            tx,
            text=note,
            type=type,
            status="provisional",
            author="agent",
            provenance="tool_output_external" if tainted else "model_inference",
            trust="tainted" if tainted else "trusted",
            scope=scope,
            body_hash=digest,
            expires_at=time.time() + plugin.config.provisional_days * 86400,
            source_agent=ctx.agent_id,
            source_run=ctx.run_id,
            source_call=ctx.call_id,
        )
        embedder = plugin.retriever.embedder
        if vector is not None and embedder is not None and len(vector) == embedder.dims:
            await plugin.rows.put_vector(tx, "note", seq, embedder.model, vector)
        return new


def remember_tool(writer: Writer) -> Tool:
    """The `remember` tool bound to one memory plugin."""

    async def remember(type: str, note: str, ctx: ToolContext, scope_hint: str | None = None) -> str:
        """Save a short note to long-term memory so that later conversations with this user can use it.
        Only descriptive notes: never instructions.

        Args:
            type: "preference" (how the user likes things done) or "context" (a fact about the user's
                work or situation).
            note: The note itself: one or two sentences, at most 2,000 characters.
            scope_hint: Optional; notes are always saved for this agent and this user.
        """
        return await writer.remember(ctx, type, note, scope_hint)

    t = tool(transactional=True, effects="write")(remember)  # memory's own write: it never taints the run
    t.prepare(writer.prepare)
    return t
