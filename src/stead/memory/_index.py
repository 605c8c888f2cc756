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

from collections.abc import Sequence
from typing import Any

from stead.memory._rows import Rows
from stead.store.base import Tx

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
            self.matrix[row] = vec
        self.last_seq = fresh[-1][0]

    async def top(
        self,
        tx: Tx,
        rows: Rows,
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
            part = np.argpartition(-all_sims, k)[:k]
            all_seqs, all_sims = all_seqs[part], all_sims[part]
        order = np.argsort(-all_sims, kind="stable")
        return [(int(all_seqs[i]), float(all_sims[i])) for i in order]
