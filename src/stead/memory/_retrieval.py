"""Retrieval: lexical and vector search over notes and examples, fused with reciprocal rank fusion.

- **Lexical**: SQLite FTS5 (porter stemming) or PostgreSQL `tsvector`, queried with the query's words —
  stopwords dropped, every token quoted, so no input can break the query.
- **Vector**: exact cosine between the query's embedding and every candidate's stored vector
  (`stead.memory._index`).
- **Fusion** (`rrf`): score = Σ weight / (k + rank) over the lists an item appears in (k = 60, ranks from
  1). A vector-only hit must reach `min_similarity`, so an unrelated note is not injected merely for being
  the least unrelated one.

Strategies: `relevant` (fused; nothing when nothing is relevant; with an empty query: `priority`),
`recent` (newest first), `priority` (priority, then constraints, preferences, issues, context, then
newest; examples: best rated first). An optional reranker reorders the fused top candidates; when it
fails, the fused order stands.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from stead.extend import Store, Tx
from stead.memory._embedders import NO_SEMANTIC_HINT, Embedder
from stead.memory._index import PAGE, VectorIndex
from stead.memory._model import Example, Note, Scope
from stead.memory._sql import MemorySql, lexical_tokens

__all__ = ["RRF_K", "Retriever", "Strategy", "rrf"]

log = logging.getLogger("stead.memory")

RRF_K = 60
Strategy: TypeAlias = Literal["relevant", "recent", "priority"]
STRATEGIES: tuple[str, ...] = ("relevant", "recent", "priority")
POOL = 20
"""How many hits each list contributes to the fusion."""
WIDE_SCOPE = 2000
"""Past this many visible items a search scores every vector and checks the best for visibility, instead of
listing the visible items and scoring those (the same answer; reading 100,000 ids from the store costs more
than 100,000 dot products). Counting stops at 2,001: a wide scope costs no count of its size."""
CHECK_BUDGET = 4096
"""How many of the best vectors a wide search checks before it concludes the scope is narrower than it
looked (few of the best are visible) and lists it after all, when it holds under a tenth of the vectors."""
LEXICAL_ROUNDS = 3
"""Windows of lexical matches (40, 160, 640) checked for visibility before a wide search ranks only the
visible matches instead."""
WARM_PAGES = 4
"""Pages of vectors (`stead.memory._index.PAGE` rows each) per transaction while a cold index catches up."""

Reranker: TypeAlias = Callable[[str, list[Note]], Awaitable[list[Note]]]


def rrf(
    lists: Sequence[Sequence[int]], weights: Sequence[float] | None = None, k: int = RRF_K
) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: every item's Σ weight / (k + rank) over the lists (ranks start at 1; an
    item missing from a list gets nothing from it), best first; ties keep first-seen order."""
    ws = list(weights) if weights is not None else [1.0] * len(lists)
    scores: dict[int, float] = {}
    for items, w in zip(lists, ws, strict=True):
        for rank, item in enumerate(items, start=1):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


@dataclass
class Weights:
    """Fusion weights of the two lists and the floor a vector-only hit must reach."""

    lexical: float = 0.2
    vector: float = 1.0
    min_similarity: float = 0.2


class Retriever:
    """Searches one store's memory with one (optional) embedder."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        *,
        weights: Weights | None = None,
        reranker: Reranker | None = None,
        hint: str | None = None,
        writable: bool = True,
    ) -> None:
        self.store = store
        self.rows = MemorySql(store.dialect)
        self.embedder = embedder
        self.weights = weights or Weights()
        self.reranker = reranker
        self.writable = writable
        self._hint = hint
        self._hinted = False
        self._indexes: dict[str, VectorIndex] = {}
        self._backfilled: set[str] = set()
        self._backfill_lock = asyncio.Lock()

    # ------------------------------------------------------------------ the embedder
    @property
    def semantic(self) -> bool:
        """Whether vector search is on (an embedder is configured and has not failed)."""
        return self.embedder is not None

    def hint_once(self) -> None:
        if self._hint and not self._hinted:
            self._hinted = True
            log.warning("%s", self._hint)

    def _disable(self, why: str) -> None:
        self.embedder = None
        self._hint = NO_SEMANTIC_HINT.format(why=why)
        self._hinted = False
        self.hint_once()

    async def embed(self, texts: Sequence[str], *, kind: str) -> list[list[float]] | None:
        """Vectors for `texts`, or None when semantic search is off (or the embedder just failed: then it
        is switched off for this process, with the hint)."""
        embedder = self.embedder
        if embedder is None:
            self.hint_once()
            return None
        try:
            return await embedder.embed(list(texts), kind=kind)
        except Exception as e:
            from stead.memory._minilm import ModelUnavailable

            if isinstance(e, ModelUnavailable):
                self._disable(str(e))
            else:
                log.warning(
                    "stead memory: the embedder failed (%s: %s); lexical search only this time",
                    type(e).__name__,
                    e,
                )
            return None

    def index(self, kind: str) -> VectorIndex:
        assert self.embedder is not None
        idx = self._indexes.get(kind)
        if idx is None or idx.model != self.embedder.model:
            idx = self._indexes[kind] = VectorIndex(kind, self.embedder.model, self.embedder.dims)
        return idx

    async def backfill(self, kind: str) -> None:
        """Lazily re-embed items that have no vector of the current model (written while semantic search
        was off, or under another embedder), in batches: embedding outside any transaction, each batch
        written in one."""
        embedder = self.embedder
        if embedder is None or not self.writable or f"{kind}:{embedder.model}" in self._backfilled:
            return
        async with self._backfill_lock:
            key = f"{kind}:{embedder.model}"
            while key not in self._backfilled:
                async with self.store.transaction() as tx:
                    todo = await self.rows.missing_vectors(tx, kind, embedder.model, 256)
                if not todo:
                    self._backfilled.add(key)
                    break
                vectors = await self.embed([t for _, t in todo], kind="document")
                if vectors is None or self.embedder is not embedder:
                    return
                async with self.store.transaction() as tx:
                    for (seq, _), v in zip(todo, vectors, strict=True):
                        await self.rows.put_vector(tx, kind, seq, embedder.model, v)

    # ------------------------------------------------------------------ search
    async def search(
        self,
        kind: Literal["note", "example"],
        scope: Scope,
        query: str,
        *,
        limit: int,
        strategy: str = "relevant",
        provisional: bool = True,
        tainted: bool = False,
        lists: list[Literal["lexical", "vector"]] | None = None,
    ) -> list[tuple[int, float]]:
        """(seq, score) of the best `limit` items in `scope`, best first. `lists` restricts relevance to
        one signal (benchmarks)."""
        if limit <= 0:
            return []
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        rows = self.rows
        tokens = lexical_tokens(query) if query.strip() else []
        if strategy == "relevant" and tokens:
            use = lists or ["lexical", "vector"]
            qvec: list[float] | None = None
            if "vector" in use:
                await self.backfill(kind)
                got = await self.embed([query], kind="query")
                qvec = got[0] if got else None
            w = self.weights
            index = self.index(kind) if qvec is not None and self.embedder is not None else None
            if index is not None:
                await self._warm(index)
            async with self.store.transaction() as tx:

                async def admitted(seqs: list[int]) -> set[int]:
                    got = await rows.visible_among(
                        tx, kind, scope, seqs, provisional=provisional, tainted=tainted
                    )
                    return {s for s, sec in got if _admits(scope, sec)}

                found = None  # the visible items, when the scope is narrow enough to list them
                hits: list[tuple[int, float]] | None = []
                wide = True
                if qvec is not None and index is not None:
                    found = await rows.candidates(
                        tx, kind, scope, provisional=provisional, tainted=tainted, limit=WIDE_SCOPE
                    )
                    if found is None:
                        # too many visible to list: score every vector, check the best for visibility
                        hits = await index.top_visible(
                            tx, rows, qvec, POOL, w.min_similarity, admitted, budget=CHECK_BUDGET
                        )
                        if hits is None:
                            # the best vectors are mostly out of scope: reading one visible id costs ~10x
                            # scoring one vector, so list the scope when it holds under a tenth of them
                            found = await rows.candidates(
                                tx,
                                kind,
                                scope,
                                provisional=provisional,
                                tainted=tainted,
                                limit=max(WIDE_SCOPE, index.n // 10),
                            )
                            if found is None:
                                hits = await index.top_visible(
                                    tx, rows, qvec, POOL, w.min_similarity, admitted
                                )
                    if found is not None:
                        plain, dims = found
                        allowed = plain + [s for s, sec in dims if _admits(scope, sec)]
                        # a vector hit must reach the floor: below it, a note is merely the least unrelated
                        hits = (
                            await index.top(tx, rows, qvec, allowed, POOL, w.min_similarity)
                            if allowed
                            else []
                        )
                        wide = False
                elif "lexical" in use and rows.dialect == "sqlite":
                    count = await rows.count_visible(
                        tx, kind, scope, WIDE_SCOPE, provisional=provisional, tainted=tainted
                    )
                    wide = count > WIDE_SCOPE
                lexical: list[int] = []
                if "lexical" in use:
                    lexical = await self._lexical(
                        tx, kind, scope, tokens, admitted, wide, provisional=provisional, tainted=tainted
                    )
                vector = [s for s, _ in hits or []]
            return rrf([lexical, vector], [w.lexical, w.vector])[:limit]
        if strategy == "relevant":
            strategy = "priority"  # no words to look for: the most important items
        async with self.store.transaction() as tx:
            ordered = await rows.ordered(
                tx, kind, scope, strategy, max(limit * 4, 20), provisional=provisional, tainted=tainted
            )
        picked = [s for s, sec in ordered if _admits(scope, sec)][:limit]
        n = len(picked)
        return [(s, float(n - i) / n) for i, s in enumerate(picked)]

    async def _warm(self, index: VectorIndex) -> None:
        """A cold index (this process has published none of its rows yet) catches up before the search,
        in transactions of its own of a few pages each (published as each commits), so a restart over
        1,000,000 vectors never holds the store for the whole read. Not inside a caller's transaction:
        there the search's own catch-up reads them, to publish only if that transaction commits."""
        if index.warmed or self.store.current() is not None:
            return
        index.warmed = True
        import numpy as np

        async with self.store.transaction() as tx:
            backlog = await self.rows.count_vectors_after(tx, index.kind, index.model, index.last_seq)
        if backlog < 2 * PAGE:
            return  # the search's own catch-up reads them
        index.reserve(backlog)
        buffer = np.empty((WARM_PAGES * PAGE, index.dims), dtype=np.float32)
        while True:
            async with self.store.transaction() as tx:
                staged = await index.catch_up(tx, self.rows, pages=WARM_PAGES, out=buffer)
            if staged is None:
                return

    async def _lexical(
        self,
        tx: Tx,
        kind: str,
        scope: Scope,
        tokens: list[str],
        admitted: Callable[[list[int]], Awaitable[set[int]]],
        wide: bool,
        *,
        provisional: bool,
        tainted: bool,
    ) -> list[int]:
        """The first `POOL` lexical matches (rank, then seq) among the items visible in `scope` and
        admitted by its secondary dimensions — the same list however it is found. A wide scope on SQLite
        ranks every match without joining the items table and checks the best for visibility in growing
        windows (most of the best are visible there); a narrow one, or one whose best matches were mostly
        out of scope, ranks the visible matches only (the join)."""
        rows = self.rows
        if wide:
            limit, seen = 2 * POOL, 0
            kept: list[int] = []
            for _ in range(LEXICAL_ROUNDS):
                ranked = await rows.lexical_any(tx, kind, tokens, limit)
                if ranked is None:
                    break  # PostgreSQL: its lexical index is in the items' table, the join costs nothing
                new = ranked[seen:]
                ok = await admitted(new) if new else set()
                kept.extend(s for s in new if s in ok)
                seen = len(ranked)
                if len(kept) >= POOL or len(ranked) < limit:
                    return kept[:POOL]
                limit *= 4
        limit = 2 * POOL
        while True:
            got = await rows.lexical(tx, kind, scope, tokens, limit, provisional=provisional, tainted=tainted)
            kept = [s for s, sec in got if _admits(scope, sec)]
            if len(kept) >= POOL or len(got) < limit:
                return kept[:POOL]
            limit *= 4

    async def notes(
        self,
        scope: Scope,
        query: str,
        *,
        limit: int,
        strategy: str = "relevant",
        provisional: bool = True,
        tainted: bool = False,
        lists: list[Literal["lexical", "vector"]] | None = None,
    ) -> list[Note]:
        """The best notes for `query` in `scope`, each with its score."""
        pool = limit * 3 if self.reranker is not None and strategy == "relevant" else limit
        hits = await self.search(
            "note",
            scope,
            query,
            limit=pool,
            strategy=strategy,
            provisional=provisional,
            tainted=tainted,
            lists=lists,
        )
        if not hits:
            return []
        async with self.store.transaction() as tx:
            found = await self.rows.notes_by_seq(tx, [s for s, _ in hits])
        out = [_scored(found[s], sc) for s, sc in hits if s in found]
        if self.reranker is not None and strategy == "relevant" and out:
            try:
                reranked = await self.reranker(query, list(out))
                out = list(reranked)
            except Exception as e:
                log.warning(
                    "stead memory: the reranker failed (%s: %s); fused order kept", type(e).__name__, e
                )
        return out[:limit]

    async def examples(
        self, scope: Scope, query: str, *, limit: int, strategy: str = "relevant"
    ) -> list[Example]:
        hits = await self.search("example", scope, query, limit=limit, strategy=strategy)
        if not hits:
            return []
        async with self.store.transaction() as tx:
            found = await self.rows.examples_by_seq(tx, [s for s, _ in hits])
        return [_scored_example(found[s], sc) for s, sc in hits if s in found]


def _admits(scope: Scope, raw: Any) -> bool:
    if raw is None:
        return True
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return False
    return scope.admits(value if isinstance(value, Mapping) else None)


def _scored(note: Note, score: float) -> Note:
    from dataclasses import replace

    return replace(note, score=round(score, 6))


def _scored_example(example: Example, score: float) -> Example:
    from dataclasses import replace

    return replace(example, score=round(score, 6))
