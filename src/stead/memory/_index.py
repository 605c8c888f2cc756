"""Cosine scoring over the stored vectors, with an in-memory copy that only ever catches up.

The store is the authority: vectors are rows of `memory_vectors`, committed with their items. This process
keeps, per (item kind, embedding model), a float32 matrix of the rows it has read, and before each search
reads the rows written since (their `seq` only grows), inside the search's own transaction. Rows read there
are used for that search at once but join the shared matrix only in the transaction's after-commit callback
— so a search inside a caller's transaction that rolls back leaves nothing behind. Which items may be scored
(scope, status, expiry) is always decided by SQL; a stale row for a deleted item is never a candidate.

Scores are `matrix @ query` (vectors are L2-normalized: the dot product is the cosine). Answers are exact.
A search over a scope too wide to list (`top_visible`) scores every vector; from `QUANTIZE_MIN` vectors on,
and when SimSIMD is installed (`pip install simsimd`, in `stead[memory]`), it first scans an int8 copy of
the matrix (a quarter of the bytes, SIMD integer dot products: ~13 ms for 1,000,000 × 384 where float32
BLAS takes ~50 ms), then rescores the best candidates from the float32 matrix. The int8 score of every row
is within a bound `delta` of its exact score (proved per query from the rounding errors, below), so a
window of candidates is widened until the k-th best visible exact score beats every unchecked row's
`int8 score + delta`: the result is the one the exact scan gives, on any data, whatever is visible. No
extension, no graph index: sqlite-vec cannot be loaded by every interpreter (the CI's cannot), and an HNSW
graph (usearch) over 100,000 random vectors took 42–54 s to build on two cores and found 13–37 % of the
exact top 20 at expansion 128–512 (77 % at 2,048, 13 ms a query), where this scan takes ~1.5 ms and is
exact (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stead.extend import Tx
from stead.memory._sql import MemorySql

__all__ = ["PAGE", "QUANTIZE_MIN", "VectorIndex", "accelerator"]

log = logging.getLogger("stead.memory")

PAGE = 16384
"""Vector rows read per statement while catching up: a cold start (every row) reads them in pages, each
turned into one float32 block at once, so the rows' bytes are never all held."""
QUANTIZE_MIN = 50_000
"""From this many vectors a wide search scans the int8 copy first (with SimSIMD); below, float32 alone."""
FIRST_WINDOW = 256
"""How many of the best candidates a wide search checks first (then 4x as many, and so on)."""
_CHUNK = 8192
_SLACK = 1e-4
"""Float32 rounding in the exact score (≤ 384 · 2⁻²⁴ ≈ 2.3e-5 for unit vectors; scaled by the norms
otherwise) and in the int8 score's scaling, on top of the quantization bound."""

_UNSET: Any = object()
_accel: Any = _UNSET


def accelerator() -> Any | None:
    """The SimSIMD module when it is installed and works here, else None (exact float32 scans only)."""
    global _accel
    if _accel is _UNSET:
        try:
            import numpy as np

            mod = importlib.import_module("simsimd")
            probe = np.ones((1, 8), dtype=np.int8)
            if int(np.asarray(mod.cdist(probe, probe, metric="dot"))[0, 0]) != 8:
                raise RuntimeError("simsimd int8 dot gave a wrong answer")
            _accel = mod
        except Exception as e:  # not installed, or no kernel for this machine
            if not isinstance(e, ImportError):
                log.warning("stead memory: simsimd is unusable here (%s); exact float32 scans only", e)
            _accel = None
    return _accel


class _Staged:
    """Vector rows read inside a search's transaction, not yet published: their vector seqs, item seqs and
    float32 vectors (one row per item: the last one read wins)."""

    __slots__ = ("items", "last", "owned", "vecs", "vseqs")

    def __init__(self, last: int, vseqs: Any, items: Any, vecs: Any, owned: bool) -> None:
        self.last = last
        self.owned = owned  # `vecs` is this batch's own array (not a reused buffer)
        self.vseqs = vseqs
        self.items = items
        self.vecs = vecs


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
        self.warmed = False  # the retriever's cold catch-up ran (outside any caller's transaction)
        # the int8 copy (with SimSIMD, from QUANTIZE_MIN rows): row r ≈ q8[r] * qinv[r]
        self.q8: Any = None
        self.qinv: Any = None
        self.qn = 0  # rows [0, qn) are quantized
        self.qerr = 0.0  # max over rows of ‖x − x̂‖
        self.qnorm = 0.0  # max over rows of ‖x̂‖

    # ------------------------------------------------------------------ catching up
    async def catch_up(
        self, tx: Tx, rows: MemorySql, *, pages: int | None = None, out: Any = None
    ) -> _Staged | None:
        """Read the rows written since the last published one (at most `pages` pages), to be used by this
        transaction at once and published after it commits. `out` (`pages` × PAGE rows): a buffer to read
        the vectors into, reused by a caller that reads page after page (no fresh memory each time)."""
        import numpy as np

        last = self.last_seq
        vseq_parts: list[Any] = []
        item_parts: list[Any] = []
        vec_parts: list[Any] = []
        width = 4 * self.dims
        read = got = 0
        while pages is None or read < pages:
            page = await rows.vectors_after(tx, self.kind, self.model, last, PAGE)
            read += 1
            if not page:
                break
            last = page[-1][0]
            good = [r for r in page if len(r[2]) == width]
            if good:
                vseq_parts.append(np.fromiter((r[0] for r in good), dtype=np.int64, count=len(good)))
                item_parts.append(np.fromiter((r[1] for r in good), dtype=np.int64, count=len(good)))
                block = np.frombuffer(b"".join(r[2] for r in good), dtype="<f4").reshape(len(good), self.dims)
                if out is not None:
                    out[got : got + len(good)] = block
                else:
                    vec_parts.append(block)
                got += len(good)
            if len(page) < PAGE:
                break
        if last == self.last_seq:
            return None
        owned = out is None
        if got:
            vseqs = np.concatenate(vseq_parts)
            items = np.concatenate(item_parts)
            vecs = out[:got] if out is not None else np.concatenate(vec_parts).astype(np.float32, copy=False)
            if items.size > 1 and not bool((items[1:] > items[:-1]).all()):
                # an item's vector read twice (rewritten): the later row wins
                _, first_rev = np.unique(items[::-1], return_index=True)
                if first_rev.size < items.size:
                    keep = np.sort(items.size - 1 - first_rev)
                    vseqs, items, vecs = vseqs[keep], items[keep], vecs[keep]
                    owned = True
        else:
            vseqs = np.zeros(0, dtype=np.int64)
            items = np.zeros(0, dtype=np.int64)
            vecs = np.zeros((0, self.dims), dtype=np.float32)
        staged = _Staged(last, vseqs, items, vecs, owned)
        tx.after_commit(lambda: self._add(staged))
        return staged

    def reserve(self, more: int) -> None:
        """Room for `more` rows past the published ones, allocated once (a cold start that knows how many
        rows it will read: on this machine's VM, first touching memory costs ~2 s per GB, so growing by
        doubling, which touches twice the memory, is what a restart would mostly spend)."""
        import numpy as np

        cap = self.n + more
        if cap > self.matrix.shape[0]:
            grown = np.zeros((cap, self.dims), dtype=np.float32)
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
            grown_seqs = np.zeros(cap, dtype=np.int64)
            grown_seqs[: self.n] = self.seq_of[: self.n]
            self.seq_of = grown_seqs

    def _add(self, st: _Staged) -> None:
        import numpy as np

        if st.last <= self.last_seq:
            return  # another search published these already
        fresh = st.vseqs > self.last_seq
        items, vecs = (st.items, st.vecs) if fresh.all() else (st.items[fresh], st.vecs[fresh])
        self.last_seq = st.last
        if not items.size:
            return
        top = int(items.max())
        if top >= self.row_of.shape[0]:
            grown_rows = np.full(max(top + 1, 2 * self.row_of.shape[0], 256), -1, dtype=np.int64)
            grown_rows[: self.row_of.shape[0]] = self.row_of
            self.row_of = grown_rows
        where = self.row_of[items]
        new = where < 0
        added = int(new.sum())
        need = self.n + added
        if (
            self.n == 0
            and added == items.size
            and need > self.matrix.shape[0]
            and st.owned
            and vecs.flags.writeable
            and vecs.flags.c_contiguous
        ):
            self.matrix = vecs  # a cold start: adopt the block read (no second copy of every vector)
            self.seq_of = items.copy()
        elif need > self.matrix.shape[0]:
            cap = max(need, 2 * self.matrix.shape[0], 256)
            grown = np.zeros((cap, self.dims), dtype=np.float32)  # calloc: unused rows take no memory
            grown[: self.n] = self.matrix[: self.n]
            self.matrix = grown
            grown_seqs = np.zeros(cap, dtype=np.int64)
            grown_seqs[: self.n] = self.seq_of[: self.n]
            self.seq_of = grown_seqs
        where[new] = np.arange(self.n, need, dtype=np.int64)
        self.row_of[items[new]] = where[new]
        self.seq_of[where[new]] = items[new]
        if self.matrix is vecs:
            pass
        elif added == items.size:  # appended rows only (the usual case): a copy of one block
            self.matrix[need - added : need] = vecs
        else:
            self.matrix[where] = vecs
        self.n = need
        if self.q8 is not None:
            rewritten = where[~new]
            rewritten = rewritten[rewritten < self.qn]
            if rewritten.size:
                self._quantize(rewritten)
        self._extend_quantized()

    # ------------------------------------------------------------------ the int8 copy
    def _extend_quantized(self) -> None:
        """Quantize the rows added since (once there are QUANTIZE_MIN rows and SimSIMD is here)."""
        import numpy as np

        if self.n < QUANTIZE_MIN or self.qn >= self.n or accelerator() is None:
            return
        cap = self.matrix.shape[0]
        if self.q8 is None or self.q8.shape[0] < cap:
            q8 = np.zeros((cap, self.dims), dtype=np.int8)
            qinv = np.zeros(cap, dtype=np.float32)
            if self.q8 is not None:
                q8[: self.qn] = self.q8[: self.qn]
                qinv[: self.qn] = self.qinv[: self.qn]
            self.q8, self.qinv = q8, qinv
        self._quantize(np.arange(self.qn, self.n, dtype=np.int64))
        self.qn = self.n

    def _quantize(self, rows: Any) -> None:
        """Row x becomes x8 = round(x · s) with s = 127 / max|x| (its own scale, every entry within ±127),
        standing for x̂ = x8 / s; remembers the largest ‖x − x̂‖ and ‖x̂‖ for the bound."""
        import numpy as np

        for a in range(0, rows.size, _CHUNK):
            idx = rows[a : a + _CHUNK]
            contiguous = idx.size > 0 and int(idx[-1]) - int(idx[0]) == idx.size - 1
            x = self.matrix[int(idx[0]) : int(idx[-1]) + 1] if contiguous else self.matrix[idx]
            peak = np.abs(x).max(axis=1)
            peak[peak == 0] = 1.0
            scale = np.float32(127.0) / peak
            x8 = np.rint(x * scale[:, None])
            inv = (np.float32(1.0) / scale).astype(np.float32)
            approx = x8 * inv[:, None]
            err = np.sqrt(((x - approx) ** 2).sum(axis=1))
            norm = np.sqrt((approx**2).sum(axis=1))
            finite = np.isfinite(err) & np.isfinite(norm)  # a NaN row never reaches a floor anyway
            if finite.any():
                self.qerr = max(self.qerr, float(err[finite].max()))
                self.qnorm = max(self.qnorm, float(norm[finite].max()))
            self.q8[idx] = np.nan_to_num(x8).astype(np.int8)
            self.qinv[idx] = inv

    def _scan(self, q: Any) -> tuple[Any, Any]:
        """An upper bound of every published row's exact score, and whether it is the exact score itself
        (float32 scan) — per row, for rows quantized or not."""
        import numpy as np

        n = self.n
        accel = accelerator() if self.q8 is not None and self.qn else None
        if accel is None:
            scores = self.matrix[:n] @ q if n else np.zeros(0, dtype=np.float32)
            return scores, np.ones(n, dtype=bool)
        qn = self.qn
        peak = float(np.abs(q).max()) or 1.0
        sq = 127.0 / peak
        q8 = np.rint(q * np.float32(sq))
        q_hat = q8 / np.float32(sq)
        eq = float(np.sqrt(((q - q_hat) ** 2).sum()))
        dots = np.asarray(
            accel.cdist(q8.astype(np.int8)[None, :], self.q8[:qn], metric="dot", out_dtype="float32")
        )[0]
        # |q·x − q̂·x̂| ≤ |q·(x − x̂)| + |(q − q̂)·x̂| ≤ ‖q‖·‖x − x̂‖ + ‖q − q̂‖·‖x̂‖ (Cauchy–Schwarz)
        q_norm = float(np.sqrt((q * q).sum()))
        delta = q_norm * self.qerr + eq * self.qnorm + _SLACK * max(1.0, q_norm * self.qnorm)
        upper = dots * (self.qinv[:qn] * np.float32(1.0 / sq)) + np.float32(delta)
        exact = np.zeros(n, dtype=bool)
        if qn < n:  # rows not quantized (yet): exact
            upper = np.concatenate([upper, self.matrix[qn:n] @ q])
            exact[qn:] = True
        return upper, exact

    # ------------------------------------------------------------------ search
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

        staged = await self.catch_up(tx, rows)
        q = np.asarray(query, dtype=np.float32)
        cand = np.fromiter(candidates, dtype=np.int64, count=len(candidates))
        seqs: list[Any] = []
        sims: list[Any] = []
        if cand.size and self.n:
            inside = cand[cand < self.row_of.shape[0]]
            r = self.row_of[inside]
            have = r >= 0
            known, known_rows = inside[have], r[have]
            if staged is not None and staged.items.size:
                keep = ~np.isin(known, staged.items)
                known, known_rows = known[keep], known_rows[keep]
            if known.size:
                # many candidates: one pass over the whole matrix beats copying their rows out of it
                if known.size * 4 > self.n:
                    scores = (self.matrix[: self.n] @ q)[known_rows]
                else:
                    scores = self.matrix[known_rows] @ q
                seqs.append(known)
                sims.append(scores)
        if staged is not None and staged.items.size and cand.size:
            wanted = np.isin(staged.items, cand)
            if wanted.any():
                seqs.append(staged.items[wanted])
                sims.append(staged.vecs[wanted] @ q)
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
        *,
        budget: int | None = None,
    ) -> list[tuple[int, float]] | None:
        """The same answer as `top` over every visible item, for a scope too wide to list its items: every
        vector is scored (int8 or float32, `_scan`), then the best are checked in order of their upper
        bound — rescored exactly, and `visible` (SQL: scope, status, expiry — the only judge) asked about
        those that reach `floor` — in a growing window, until the k-th best visible exact score beats every
        unchecked bound, or every vector that could reach `floor` was checked. Exact: no unchecked vector
        can beat the answer. None when more than `budget` vectors were checked without an answer (the
        best vectors are mostly out of scope: listing the scope is cheaper)."""
        import numpy as np

        staged = await self.catch_up(tx, rows)
        q = np.asarray(query, dtype=np.float32)
        upper, exact_known = self._scan(q)
        cand = np.nonzero(upper >= floor)[0]  # rows of `matrix` that may reach the floor
        items = self.seq_of[cand]
        bound = upper[cand]
        exact = np.where(exact_known[cand], bound, np.float32(np.nan)).astype(np.float32)
        src = cand
        if staged is not None and staged.items.size:
            stale = np.isin(items, staged.items)  # a rewritten vector: its new value counts
            items, bound, exact, src = items[~stale], bound[~stale], exact[~stale], src[~stale]
            fresh = staged.vecs @ q
            ok = fresh >= floor
            items = np.concatenate([items, staged.items[ok]])
            bound = np.concatenate([bound, fresh[ok]])
            exact = np.concatenate([exact, fresh[ok]])
            src = np.concatenate([src, np.full(int(ok.sum()), -1, dtype=np.int64)])
        total = int(items.size)
        found: list[tuple[int, float]] = []
        checked = np.zeros(total, dtype=bool)
        n_checked = 0
        window = min(total, max(FIRST_WINDOW, 2 * k))
        while n_checked < total:
            if window < total:  # the `window` best bounds and every tie of the last (a tie never splits)
                part = np.nonzero(bound >= np.partition(bound, total - window)[total - window])[0]
            else:
                part = np.arange(total)
            batch = part[~checked[part]]
            checked[batch] = True
            n_checked += int(batch.size)
            unknown = batch[np.isnan(exact[batch])]
            if unknown.size:
                exact[unknown] = self.matrix[src[unknown]] @ q
            reach = batch[exact[batch] >= floor]
            if reach.size:
                reach = reach[np.argsort(-exact[reach], kind="stable")]
                ok_ids = await visible([int(x) for x in items[reach]])
                found.extend((int(items[i]), float(exact[i])) for i in reach if int(items[i]) in ok_ids)
            if n_checked >= total:
                break
            if len(found) >= k:
                found.sort(key=lambda hit: (-hit[1], hit[0]))
                if found[k - 1][1] > float(bound[~checked].max()):
                    break
            if budget is not None and n_checked >= budget:
                return None
            window = min(total, window * 4)
        found.sort(key=lambda hit: (-hit[1], hit[0]))  # best first; ties by item seq
        return found[:k]

    # ------------------------------------------------------------------ introspection (benchmarks)
    def memory_bytes(self) -> int:
        """Bytes held by the published rows (float32 matrix, int8 copy, row maps), capacity excluded."""
        total = self.n * (4 * self.dims + 8) + int(self.row_of.nbytes)
        if self.q8 is not None:
            total += self.qn * (self.dims + 4)
        return total
