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
        self.rows: dict[int, int] = {}  # item seq -> row of `matrix`
        self.matrix: Any = np.zeros((0, dims), dtype=np.float32)
        self.n = 0

    def _add(self, batch: list[tuple[int, int, bytes]]) -> None:
        import numpy as np

        if not batch:
            return
        if batch[-1][0] <= self.last_seq:
            return  # another search published these already
        fresh = [b for b in batch if b[0] > self.last_seq]
        need = self.n + len(fresh)
        if need > self.matrix.shape[0]:
            grown = np.zeros((max(need, 2 * self.matrix.shape[0], 256), self.dims), dtype=np.float32)
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
        for _, item_seq, blob in fresh:
            vec = np.frombuffer(blob, dtype="<f4")
            if vec.shape[0] != self.dims:
                continue
            row = self.rows.get(item_seq)
            if row is None:
                row = self.n
                self.n += 1
                self.rows[item_seq] = row
            self.matrix[row] = vec
        self.last_seq = fresh[-1][0]

    async def scores(
        self, tx: Tx, rows: Rows, query: Sequence[float], candidates: Sequence[int]
    ) -> dict[int, float]:
        """Cosine of `query` with each candidate item that has a vector of this model."""
        import numpy as np

        new = await rows.vectors_after(tx, self.kind, self.model, self.last_seq)
        if new:
            tx.after_commit(lambda: self._add(new))
        q = np.asarray(query, dtype=np.float32)
        out: dict[int, float] = {}
        staged = {item: blob for _, item, blob in new}
        known = [(s, self.rows[s]) for s in candidates if s in self.rows and s not in staged]
        if known:
            idx = np.fromiter((r for _, r in known), dtype=np.int64, count=len(known))
            # many candidates: one pass over the whole matrix beats copying their rows out of it
            sims = (self.matrix[: self.n] @ q)[idx] if len(known) * 4 > self.n else self.matrix[idx] @ q
            out = dict(zip((s for s, _ in known), sims.tolist(), strict=True))
        wanted = set(candidates)
        for item, blob in staged.items():
            if item in wanted:
                vec = np.frombuffer(blob, dtype="<f4")
                if vec.shape[0] == self.dims:
                    out[item] = float(vec @ q)
        return out
