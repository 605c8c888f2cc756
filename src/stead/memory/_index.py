"""Exact cosine scoring over the stored vectors, with an in-memory copy that only ever catches up.

The store is the authority: vectors are rows of `memory_vectors`, committed with their items. This process
keeps, per (item kind, embedding model), a float32 matrix of the rows it has read, and before each search
reads the rows written since (their `seq` only grows), inside the search's own transaction. Rows read there
are used for that search at once but join the shared matrix only in the transaction's after-commit callback
— so a search inside a caller's transaction that rolls back leaves nothing behind. Which items may be scored
(scope, status, expiry) is always decided by SQL; a stale row for a deleted item is never a candidate.

Scores are `matrix @ query` (vectors are L2-normalized: the dot product is the cosine), exact — no
approximate index, no extension: sqlite-vec cannot be loaded by every interpreter (the CI's cannot).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stead.extend import Tx
from stead.memory._sql import MemorySql

__all__ = ["VectorIndex"]


class VectorIndex:
    """The vectors of one item kind and one model (needs numpy)."""

    def __init__(self, kind: str, model: str, dims: int) -> None:
        import numpy as np

        self.kind = kind
        self.model = model
        self.dims = dims
        self.last_seq = 0
        self.row_of: Any = np.full(0, -1, dtype=np.int64)  # item seq -> row of `matrix` (-1: none)
        self.seq_of: Any = np.zeros(0, dtype=np.int64)  # row of `matrix` -> item seq
        self.matrix: Any = np.zeros((0, dims), dtype=np.float32)
        self.n = 0

    def _add(self, batch: list[tuple[int, int, bytes]]) -> None:
        import numpy as np

        fresh = [b for b in batch if b[0] > self.last_seq]
        if not fresh:
            return  # another search published these already
        need = self.n + len(fresh)
        if need > self.matrix.shape[0]:
            grown = np.zeros((max(need, 2 * self.matrix.shape[0], 256), self.dims), dtype=np.float32)
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
            grown_seqs = np.zeros(grown.shape[0], dtype=np.int64)
            grown_seqs[: self.n] = self.seq_of[: self.n]
            self.seq_of = grown_seqs
        top = max(item for _, item, _ in fresh)
        if top >= self.row_of.shape[0]:
            grown_rows = np.full(max(top + 1, 2 * self.row_of.shape[0], 256), -1, dtype=np.int64)
            grown_rows[: self.row_of.shape[0]] = self.row_of
            self.row_of = grown_rows
        for _, item_seq, blob in fresh:
            vec = np.frombuffer(blob, dtype="<f4")
            if vec.shape[0] != self.dims:
                continue
            row = int(self.row_of[item_seq])
            if row < 0:
                row = self.n
                self.n += 1
                self.row_of[item_seq] = row
                self.seq_of[row] = item_seq
            self.matrix[row] = vec
        self.last_seq = fresh[-1][0]

    async def top(
        self,
        tx: Tx,
        rows: MemorySql,
        query: Sequence[float],
        candidates: Sequence[int],
        k: int,
        floor: float,
    ) -> list[tuple[int, float]]:
        """The `k` candidates most similar to `query` (cosine ≥ `floor`), best first."""
        import numpy as np

        new = await rows.vectors_after(tx, self.kind, self.model, self.last_seq)
        if new:
            tx.after_commit(lambda: self._add(new))
        q = np.asarray(query, dtype=np.float32)
        cand = np.fromiter(candidates, dtype=np.int64, count=len(candidates))
        staged = {item: blob for _, item, blob in new}
        seqs: list[Any] = []
        sims: list[Any] = []
        if cand.size and self.n:
            inside = cand[cand < self.row_of.shape[0]]
            r = self.row_of[inside]
            have = r >= 0
            known, known_rows = inside[have], r[have]
            if staged:
                keep = ~np.isin(known, np.fromiter(staged, dtype=np.int64, count=len(staged)))
                known, known_rows = known[keep], known_rows[keep]
            if known.size:
                # many candidates: one pass over the whole matrix beats copying their rows out of it
                if known.size * 4 > self.n:
                    scores = (self.matrix[: self.n] @ q)[known_rows]
                else:
                    scores = self.matrix[known_rows] @ q
                seqs.append(known)
                sims.append(scores)
        if staged:
            wanted = set(candidates)
            extra = [(item, blob) for item, blob in staged.items() if item in wanted]
            vecs = [np.frombuffer(b, dtype="<f4") for _, b in extra]
            ok = [(item, v) for (item, _), v in zip(extra, vecs, strict=True) if v.shape[0] == self.dims]
            if ok:
                seqs.append(np.array([i for i, _ in ok], dtype=np.int64))
                sims.append(np.array([float(v @ q) for _, v in ok], dtype=np.float32))
        if not seqs:
            return []
        all_seqs, all_sims = np.concatenate(seqs), np.concatenate(sims)
        passing = all_sims >= floor
        all_seqs, all_sims = all_seqs[passing], all_sims[passing]
        if all_sims.size > k:
            kth = np.partition(all_sims, all_sims.size - k)[all_sims.size - k]
            best = all_sims >= kth  # the k best and every tie of the k-th
            all_seqs, all_sims = all_seqs[best], all_sims[best]
        order = np.lexsort((all_seqs, -all_sims))[:k]  # best first; ties by item seq
        return [(int(all_seqs[i]), float(all_sims[i])) for i in order]

    async def top_visible(
        self,
        tx: Tx,
        rows: MemorySql,
        query: Sequence[float],
        k: int,
        floor: float,
        visible: Callable[[list[int]], Awaitable[set[int]]],
    ) -> list[tuple[int, float]]:
        """The same answer as `top` over every visible item, for a scope too wide to list its items: every
        vector is scored (one matrix product), then the best are checked in rank order, `visible` (SQL:
        scope, status, expiry — the only judge) asked about a growing window until `k` pass, the window
        falls below `floor`, or every vector was checked. Exact: the visible items among the best M scores
        are the best visible items. Costs O(vectors) arithmetic, not O(items) rows read from the store."""
        import numpy as np

        new = await rows.vectors_after(tx, self.kind, self.model, self.last_seq)
        if new:
            tx.after_commit(lambda: self._add(new))
        q = np.asarray(query, dtype=np.float32)
        seqs = self.seq_of[: self.n]
        scores = self.matrix[: self.n] @ q if self.n else np.zeros(0, dtype=np.float32)
        staged: dict[int, bytes] = {item: blob for _, item, blob in new}
        if staged:
            fresh = [(i, np.frombuffer(b, dtype="<f4")) for i, b in staged.items()]
            fresh = [(i, v) for i, v in fresh if v.shape[0] == self.dims]
            stale = np.isin(seqs, np.fromiter(staged, dtype=np.int64, count=len(staged)))
            seqs, scores = seqs[~stale], scores[~stale]  # a rewritten vector: its new value counts
            if fresh:
                seqs = np.concatenate([seqs, np.array([i for i, _ in fresh], dtype=np.int64)])
                scores = np.concatenate(
                    [scores, np.array([float(v @ q) for _, v in fresh], dtype=np.float32)]
                )
        passing = scores >= floor
        seqs, scores = seqs[passing], scores[passing]
        total = int(seqs.size)
        found: list[tuple[int, float]] = []
        seen = np.zeros(total, dtype=bool)
        checked = 0
        window = min(total, max(8 * k, 256))
        while checked < total and len(found) < k:
            if window < total:  # the `window` best and every tie of the last (a tie never splits)
                part = np.nonzero(scores >= np.partition(scores, total - window)[total - window])[0]
            else:
                part = np.arange(total)
            batch = part[~seen[part]]
            seen[batch] = True
            ok = await visible([int(x) for x in seqs[batch]])
            found.extend((int(seqs[i]), float(scores[i])) for i in batch if int(seqs[i]) in ok)
            checked = window
            window = min(total, window * 4)
        found.sort(key=lambda hit: (-hit[1], hit[0]))  # best first; ties by item seq
        return found[:k]
