"""`system.memory`: notes and examples for people and programs (the agents' own writes go through the
guarded `remember` tool).

Every change is one transaction holding the item, its lexical index row, its vector and its audit event;
the embedding is computed before that transaction opens. `agent` is an agent id; a note with no agent
applies to every agent of its user, one with no user to every user of its agent, one with neither (and no
tenant) to everyone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from stead.extend import InvalidInput, NotFound
from stead.memory._core import MemoryCore
from stead.memory._model import AUTHORS, NOTE_STATUSES, NOTE_TYPES, Event, Example, Note, Scope, text_hash
from stead.memory._retrieval import STRATEGIES

__all__ = ["Memory"]


def _check_text(what: str, text: object, limit: int = 100_000) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{what} is empty")
    if len(text) > limit:
        raise InvalidInput(f"{what} is {len(text):,} characters; at most {limit:,}")
    return text


class Memory:
    """Long-term memory of one system's agents (`system.memory`)."""

    def __init__(self, core: MemoryCore) -> None:
        self._plugin = core

    @property
    def semantic(self) -> bool:
        """Whether searches use vectors (an embedder is configured and works) besides words."""
        return self._plugin.retriever.semantic

    @property
    def embedder(self) -> Any:
        """The embedder in use (None: lexical search only)."""
        return self._plugin.retriever.embedder

    def _writable(self) -> None:
        self._plugin.check_writable()

    def _scope(
        self,
        *,
        tenant: str | None,
        agent: str | None,
        user: str | None,
        primary: str | None = None,
        secondary: Mapping[str, Any] | None = None,
    ) -> Scope:
        return Scope(
            tenant=tenant,
            agent=agent,
            user=user,
            primary=primary,
            secondary=dict(secondary) if secondary else None,
            mode=self._plugin.config.scope_mode,
        )

    # ------------------------------------------------------------------ notes
    async def add(
        self,
        text: str,
        *,
        type: str = "context",
        user: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        status: str = "active",
        priority: int = 0,
        expires_at: float | None = None,
        author: str = "human",
        primary: str | None = None,
        secondary: Mapping[str, Any] | None = None,
    ) -> Note:
        """Store a note (a person's: trusted, `active` unless told otherwise) and return it."""
        self._writable()
        _check_text("a note", text)
        if type not in NOTE_TYPES:
            raise InvalidInput(f"note type must be one of {', '.join(NOTE_TYPES)}, not {type!r}")
        if status not in NOTE_STATUSES:
            raise InvalidInput(f"note status must be one of {', '.join(NOTE_STATUSES)}, not {status!r}")
        if author not in AUTHORS:
            raise InvalidInput(f"author must be one of {', '.join(AUTHORS)}, not {author!r}")
        plugin = self._plugin
        scope = self._scope(tenant=tenant, agent=agent, user=user, primary=primary, secondary=secondary)
        vectors = await plugin.retriever.embed([text], kind="document")  # before the transaction
        embedder = plugin.retriever.embedder
        async with plugin.store.transaction() as tx:
            seq, note = await plugin.rows.insert_note(
                tx,
                text=text,
                type=type,
                status=status,
                author=author,
                provenance="direct_user" if author == "human" else author,
                trust="trusted",
                scope=scope,
                body_hash=text_hash(text),
                priority=priority,
                expires_at=expires_at,
            )
            if vectors and embedder is not None:
                await plugin.rows.put_vector(tx, "note", seq, embedder.model, vectors[0])
            await plugin.rows.event(
                tx,
                event="written",
                item_id=note.id,
                new_text=text,
                agent=agent,
                user=user,
                tenant=tenant,
                reason="added",
                actor=author,
            )
        return note

    async def search(
        self,
        query: str,
        *,
        user: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        limit: int = 5,
        strategy: str = "relevant",
        primary: str | None = None,
        secondary: Mapping[str, Any] | None = None,
        provisional: bool = True,
        tainted: bool = False,
        lists: list[Literal["lexical", "vector"]] | None = None,
    ) -> list[Note]:
        """The notes an agent `agent` would see for `user` (and `tenant`), best first, each with its
        `score`: `relevant` fuses lexical and vector search (RRF); `recent` and `priority` order by date or
        importance. Archived, expired and (unless `tainted=True`) tainted notes are left out."""
        if strategy not in STRATEGIES:
            raise InvalidInput(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        scope = self._scope(tenant=tenant, agent=agent, user=user, primary=primary, secondary=secondary)
        return await self._plugin.retriever.notes(
            scope,
            query,
            limit=limit,
            strategy=strategy,
            provisional=provisional,
            tainted=tainted,
            lists=lists,
        )

    async def notes(
        self,
        *,
        user: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[Note]:
        """Stored notes, newest first, filtered by exact user, agent, tenant and status (None: any)."""
        if status is not None and status not in NOTE_STATUSES:
            raise InvalidInput(f"note status must be one of {', '.join(NOTE_STATUSES)}, not {status!r}")
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            return await plugin.rows.list_notes(
                tx, tenant=tenant, agent=agent, user=user, status=status, limit=limit
            )

    async def get(self, note_id: str) -> Note:
        """One note by id; `stead.NotFound` when there is none."""
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            found = await plugin.rows.note(tx, note_id)
        if found is None:
            raise NotFound(f"no memory note with id {note_id!r}")
        return found[1]

    async def _change(self, note_id: str, event: str, **changes: Any) -> Note:
        self._writable()
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            found = await plugin.rows.note(tx, note_id)
            if found is None:
                raise NotFound(f"no memory note with id {note_id!r}")
            _, note = found
            await plugin.rows.set_status(tx, note_id, **changes)
            await plugin.rows.event(
                tx,
                event=event,
                item_id=note_id,
                old_text=note.text,
                agent=note.agent,
                user=note.user,
                tenant=note.tenant,
                reason=f"{note.status}/{note.trust} → {changes.get('status')}",
                actor="human",
            )
            after = await plugin.rows.note(tx, note_id)
        assert after is not None
        return after[1]

    async def promote(self, note_id: str) -> Note:
        """A person confirms a note: `active`, trusted (a tainted note becomes injectable), no expiry."""
        return await self._change(note_id, "promoted", status="active", trust="trusted", clear_expiry=True)

    async def archive(self, note_id: str) -> Note:
        """Retire a note: kept (and audited), never injected or found again."""
        return await self._change(note_id, "archived", status="archived")

    async def delete(self, note_id: str) -> None:
        """Remove a note with its index rows and vector (its audit events stay)."""
        self._writable()
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            found = await plugin.rows.note(tx, note_id)
            if found is None:
                raise NotFound(f"no memory note with id {note_id!r}")
            seq, note = found
            await plugin.rows.delete_note(tx, seq, note_id)
            await plugin.rows.event(
                tx,
                event="deleted",
                item_id=note_id,
                old_text=note.text,
                agent=note.agent,
                user=note.user,
                tenant=note.tenant,
                reason="deleted",
                actor="human",
            )

    async def expire(self) -> int:
        """Archive every provisional note past its expiry (one `expired` event each); how many."""
        self._writable()
        plugin = self._plugin
        now = time.time()
        async with plugin.store.transaction() as tx:
            due = await plugin.rows.expired(tx, now)
            for _, note in due:
                await plugin.rows.set_status(tx, note.id, status="archived")
                await plugin.rows.event(
                    tx,
                    event="expired",
                    item_id=note.id,
                    old_text=note.text,
                    agent=note.agent,
                    user=note.user,
                    tenant=note.tenant,
                    reason="provisional note expired",
                    actor="system",
                )
        return len(due)

    async def events(self, *, note_id: str | None = None, run_id: str | None = None) -> list[Event]:
        """The audit trail (oldest first), optionally of one note or one run."""
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            rows = await plugin.rows.events(tx, item_id=note_id, run_id=run_id)
        return [
            Event(
                id=r[0],
                item_id=r[1],
                kind=r[2],
                event=r[3],
                old_text=r[4],
                new_text=r[5],
                agent=r[6],
                user=r[7],
                run_id=r[8],
                call_id=r[9],
                reason=r[10],
                actor=r[11],
                created_at=float(r[12]),
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ examples
    async def add_example(
        self,
        input: str,
        output: str,
        *,
        rating: float | None = None,
        user: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        primary: str | None = None,
        secondary: Mapping[str, Any] | None = None,
    ) -> Example:
        """Store an input → output example (shown to agents as a worked example, best rated first under
        the `priority` strategy)."""
        self._writable()
        _check_text("an example's input", input)
        _check_text("an example's output", output)
        plugin = self._plugin
        scope = self._scope(tenant=tenant, agent=agent, user=user, primary=primary, secondary=secondary)
        vectors = await plugin.retriever.embed([input], kind="document")
        embedder = plugin.retriever.embedder
        async with plugin.store.transaction() as tx:
            seq, example = await plugin.rows.insert_example(
                tx, input=input, output=output, rating=rating, scope=scope, author="human"
            )
            if vectors and embedder is not None:
                await plugin.rows.put_vector(tx, "example", seq, embedder.model, vectors[0])
            await plugin.rows.event(
                tx,
                event="written",
                kind="example",
                item_id=example.id,
                new_text=input,
                agent=agent,
                user=user,
                tenant=tenant,
                reason="added",
                actor="human",
            )
        return example

    async def examples(self, *, user: str | None = None, agent: str | None = None) -> list[Example]:
        """Stored examples, newest first (exact user and agent filters)."""
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            return await plugin.rows.list_examples(tx, agent=agent, user=user)

    async def search_examples(
        self,
        query: str,
        *,
        user: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        limit: int = 3,
        strategy: str = "relevant",
    ) -> list[Example]:
        """The examples an agent would be shown for `query`, best first."""
        scope = self._scope(tenant=tenant, agent=agent, user=user)
        return await self._plugin.retriever.examples(scope, query, limit=limit, strategy=strategy)

    async def delete_example(self, example_id: str) -> None:
        self._writable()
        plugin = self._plugin
        async with plugin.store.transaction() as tx:
            found = await plugin.rows.example(tx, example_id)
            if found is None:
                raise NotFound(f"no memory example with id {example_id!r}")
            await plugin.rows.delete_example(tx, found[0], example_id)
            await plugin.rows.event(
                tx,
                event="deleted",
                kind="example",
                item_id=example_id,
                old_text=found[1].input,
                reason="deleted",
                actor="human",
            )
