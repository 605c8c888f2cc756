"""The vector index (issue 23 item 4): the int8 scan gives the exact answer (rescoring and the error bound
make up for what quantization gets wrong), a wide search falls back to listing when the best vectors are out
of scope, visibility is SQL's alone, rows join the shared matrix only after their transaction commits, and a
cold index catches up in pages."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import stead.memory._index as index_module
import stead.memory._retrieval as retrieval
from stead.memory import HashEmbedder, MemoryPlugin
from stead.memory._index import VectorIndex, accelerator
from stead.memory._sql import encode_vector
from tests.memory.conftest import WORDS, open_memory, scoped


class FakeTx:
    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] = []

    def after_commit(self, fn: Callable[[], object]) -> None:
        self.callbacks.append(fn)

    def commit(self) -> None:
        for fn in self.callbacks:
            fn()
        self.callbacks.clear()


class FakeRows:
    """`memory_vectors` as a list of (vector seq, item seq, bytes)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, bytes]] = []

    def put(self, item: int, vec: Any) -> None:
        self.rows.append((len(self.rows) + 1, item, encode_vector([float(x) for x in vec])))

    async def vectors_after(
        self, tx: Any, kind: str, model: str, after: int, limit: int | None = None
    ) -> list[tuple[int, int, bytes]]:
        out = [r for r in self.rows if r[0] > after]
        return out if limit is None else out[:limit]


def unit(rng: np.random.Generator, n: int, dims: int) -> Any:
    x = rng.standard_normal((n, dims)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


async def loaded(x: Any, n: int) -> tuple[VectorIndex, FakeRows]:
    """An index of the first `n` vectors of `x` (items 1…n), caught up and committed, and its rows."""
    rows = FakeRows()
    for i in range(n):
        rows.put(i + 1, x[i])
    index = VectorIndex("note", "m", x.shape[1])
    tx = FakeTx()
    await index.catch_up(tx, rows)  # type: ignore[arg-type]
    tx.commit()
    return index, rows


def best(x: Any, q: Any, visible: set[int], floor: float, k: int) -> list[float]:
    """The k best visible scores ≥ floor, computed in float64 (the reference)."""
    s = x.astype(np.float64) @ q.astype(np.float64)
    return sorted((float(s[i - 1]) for i in visible if s[i - 1] >= floor), reverse=True)[:k]


@pytest.fixture
def quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    if accelerator() is None:
        pytest.skip("simsimd is not installed: the int8 scan is off")
    monkeypatch.setattr(index_module, "QUANTIZE_MIN", 0)


async def test_the_int8_scan_answers_exactly_even_where_quantization_misorders(quantized: None) -> None:
    """Random vectors, random visible sets (dense, sparse, the best ones hidden), random k and floors: the
    answer is always the k best visible exact scores — and in some of these cases the int8 scores alone
    put the top k in another order (so the rescoring and the bound are what make it exact)."""
    rng = np.random.default_rng(7)
    pyrng = random.Random(7)
    misordered = 0
    for trial in range(120):
        dims = pyrng.choice([8, 16, 48])
        n = pyrng.choice([40, 300, 900])
        x = unit(rng, n, dims)
        index, rows = await loaded(x, n)
        assert index.qn == n
        q = unit(rng, 1, dims)[0]
        exact = x @ q
        mode = trial % 3
        if mode == 0:
            visible = set(range(1, n + 1))
        elif mode == 1:
            visible = {i for i in range(1, n + 1) if pyrng.random() < 0.05} or {1}
        else:  # the 30 best hidden: the window must grow past them
            hidden = set((np.argsort(-exact)[:30] + 1).tolist())
            visible = set(range(1, n + 1)) - hidden
        k = pyrng.randint(1, 10)
        floor = pyrng.choice([-1.0, 0.0, 0.2])
        asked: list[int] = []

        async def check(ids: list[int], visible: set[int] = visible, asked: list[int] = asked) -> set[int]:
            asked.extend(ids)
            return {i for i in ids if i in visible}

        got = await index.top_visible(FakeTx(), rows, q, k, floor, check)  # type: ignore[arg-type]
        assert got is not None
        want = best(x, q, visible, floor, k)
        assert [s for _, s in got] == pytest.approx(want, abs=1e-5)
        assert all(i in visible for i, _ in got)
        assert len(asked) == len(set(asked))  # no id asked twice
        upper, _ = index._scan(q)
        by_int8 = list(np.argsort(-upper, kind="stable")[:k] + 1)
        by_exact = list(np.argsort(-exact, kind="stable")[:k] + 1)
        misordered += by_int8 != by_exact
    assert misordered > 0


async def test_a_wide_search_gives_up_past_its_budget_and_staged_rows_count_at_once() -> None:
    """`budget`: None when the best vectors are all out of scope (the caller lists the scope instead).
    Rows read inside a transaction are scored at once but published only when it commits; a rewritten
    vector (the same item, a later row) replaces the old one."""
    rng = np.random.default_rng(3)
    x = unit(rng, 600, 16)
    index, rows = await loaded(x, 500)
    q = x[0]
    worst = set((np.argsort(x[:500] @ q)[:3] + 1).tolist())

    async def only_worst(ids: list[int]) -> set[int]:
        return {i for i in ids if i in worst}

    assert await index.top_visible(FakeTx(), rows, q, 5, -1.0, only_worst, budget=16) is None  # type: ignore[arg-type]
    got = await index.top_visible(FakeTx(), rows, q, 5, -1.0, only_worst)  # type: ignore[arg-type]
    assert got is not None and {i for i, _ in got} == worst
    for i in range(500, 600):
        rows.put(i + 1, x[i])
    rows.put(1, -q)  # item 1 re-vectored: now the worst match, not the best

    async def everyone(ids: list[int]) -> set[int]:
        return set(ids)

    pending = FakeTx()
    got = await index.top_visible(pending, rows, q, 3, -1.0, everyone)  # type: ignore[arg-type]
    assert index.n == 500  # not yet published
    exact = {i + 1: float(x[i] @ q) for i in range(1, 600)}
    exact[1] = -1.0
    assert got is not None and [i for i, _ in got] == sorted(exact, key=lambda i: -exact[i])[:3]
    pending.commit()
    assert index.n == 600 and index.last_seq == 601
    assert float(index.matrix[index.row_of[1]] @ q) == pytest.approx(-1.0)
    again = await index.top_visible(FakeTx(), rows, q, 3, -1.0, everyone)  # type: ignore[arg-type]
    assert again is not None and [i for i, _ in again] == [i for i, _ in got]


def _notes(rng: random.Random) -> list[tuple[str, dict[str, object]]]:
    out: list[tuple[str, dict[str, object]]] = []
    for i in range(150):
        text = " ".join(rng.choice(WORDS) for _ in range(4)) + f" fact {i}."
        pick = i % 6
        out.append((text, scoped(1 if pick == 5 else pick, rng)))
    return out


async def test_M5_every_search_path_gives_the_listed_answer_and_isolation(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same notes in the same order whether the scope is listed, scanned in float32, scanned in int8
    (when SimSIMD is here), or scanned and then listed after all because its best vectors were out of scope
    (a tiny `CHECK_BUDGET`) — and no note of another user, tenant or primary scope, nor an archived one,
    ever shows. Lexical-only searches too (their wide path ranks matches without the join)."""
    rng = random.Random(11)
    async with open_memory(db_url) as system:
        m = system.memory
        made = [(await m.add(text, **kw), kw) for text, kw in _notes(rng)]  # type: ignore[arg-type]
        for note, kw in made[:18]:
            if not kw:
                await m.archive(note.id)
        words = ["cat", "dog", "train", "seat", "window", "coffee", "tea", "invoice", "euro", "plan", "hours"]
        queries = [" ".join(rng.choice(words) for _ in range(3)) for _ in range(20)]
        callers: list[dict[str, object]] = [{}, {"user": "other"}, {"secondary": {"region": "eu"}}]
        plugin = system.plugin("memory")
        assert isinstance(plugin, MemoryPlugin)

        async def answers(lists: Any = None) -> list[list[str]]:
            out = []
            for q in queries:
                for caller in callers:
                    found = await m.search(q, limit=8, lists=lists, **caller)  # type: ignore[arg-type]
                    out.append([n.id for n in found])
            return out

        listed, listed_lexical = await answers(), await answers(["lexical"])
        assert any(listed) and any(listed_lexical)
        monkeypatch.setattr(retrieval, "WIDE_SCOPE", 3)
        monkeypatch.setattr(index_module, "_accel", None)
        assert await answers() == listed  # float32 scan
        assert await answers(["lexical"]) == listed_lexical
        monkeypatch.setattr(retrieval, "POOL", 2)  # lexical windows of 4, 16, 64 matches, then the join
        lexical_small = await answers(["lexical"])
        monkeypatch.setattr(retrieval, "WIDE_SCOPE", 2000)
        assert await answers(["lexical"]) == lexical_small
        monkeypatch.setattr(retrieval, "POOL", 20)
        monkeypatch.setattr(retrieval, "WIDE_SCOPE", 3)
        listings: list[int | None] = []
        real = plugin.retriever.rows.candidates

        async def spy(*args: Any, **kwargs: Any) -> Any:
            listings.append(kwargs.get("limit"))
            return await real(*args, **kwargs)

        monkeypatch.setattr(plugin.retriever.rows, "candidates", spy)
        monkeypatch.setattr(retrieval, "CHECK_BUDGET", 1)
        monkeypatch.setattr(index_module, "FIRST_WINDOW", 4)
        assert await answers() == listed  # gave up on the scan, listed the scope
        assert any(limit != 3 for limit in listings)
        monkeypatch.undo()
        if accelerator() is not None:
            monkeypatch.setattr(retrieval, "WIDE_SCOPE", 3)
            monkeypatch.setattr(index_module, "QUANTIZE_MIN", 0)
            await m.add("one more note about tea and trains", user="other")  # caught up: all quantized
            int8 = await answers()
            assert plugin.retriever._indexes["note"].qn == len(made) + 1
            monkeypatch.setattr(retrieval, "WIDE_SCOPE", 10**9)
            assert await answers() == int8  # listed
        hidden = {n.id for n, kw in made if "tenant" in kw or "primary" in kw}
        hidden |= {n.id for n, kw in made[:18] if not kw}
        assert not hidden & {i for ids in listed for i in ids}


async def test_a_search_in_a_transaction_that_rolls_back_publishes_nothing(db_url: str) -> None:
    async with open_memory(db_url) as system:
        m = system.memory
        await m.add("Keeps bees on the roof.", user="u")
        assert [n.text for n in await m.search("bees roof", user="u", lists=["vector"])]
        plugin = system.plugin("memory")
        assert isinstance(plugin, MemoryPlugin)
        index = plugin.retriever._indexes["note"]
        before = (index.n, index.last_seq)
        with pytest.raises(RuntimeError):
            async with system.store.transaction():
                await m.add("Grows tomatoes on the balcony.", user="u")
                inside = await m.search("tomatoes balcony", user="u", lists=["vector"])
                assert [n.text for n in inside][:1] == ["Grows tomatoes on the balcony."]
                raise RuntimeError("roll back")
        assert (index.n, index.last_seq) == before
        assert "Grows tomatoes on the balcony." not in [
            n.text for n in await m.search("tomatoes balcony", user="u", lists=["vector"])
        ]


async def test_a_cold_index_catches_up_in_pages_of_its_own(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart: the first search reads every vector in pages, a few per transaction, outside the
    search's transaction, and answers as a warm index does."""
    async with open_memory(db_url) as system:
        for i in range(60):
            await system.memory.add(f"Fact {i} about item{i} and item{i + 1}.", user="u")
        warm = [n.id for n in await system.memory.search("item7 item8", user="u", limit=5)]
    monkeypatch.setattr(index_module, "PAGE", 4)
    monkeypatch.setattr(retrieval, "PAGE", 4)
    monkeypatch.setattr(retrieval, "WARM_PAGES", 2)
    transactions = 0
    async with open_memory(db_url, embedder=HashEmbedder()) as system:
        store = system.store
        real = store.transaction

        def counting() -> Any:
            nonlocal transactions
            transactions += 1
            return real()

        monkeypatch.setattr(store, "transaction", counting)
        cold = [n.id for n in await system.memory.search("item7 item8", user="u", limit=5)]
        plugin = system.plugin("memory")
        assert isinstance(plugin, MemoryPlugin)
        assert plugin.retriever._indexes["note"].n == 60
    assert cold == warm
    assert transactions >= 60 // 8  # pages of 4, 2 per transaction


async def test_without_simsimd_the_scan_is_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """SimSIMD missing: no int8 copy is made, whatever the size, and the answers are exact."""

    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(index_module.importlib, "import_module", missing)
    monkeypatch.setattr(index_module, "_accel", index_module._UNSET)
    monkeypatch.setattr(index_module, "QUANTIZE_MIN", 0)
    assert accelerator() is None
    rng = np.random.default_rng(5)
    x = unit(rng, 300, 16)
    index, rows = await loaded(x, 300)
    assert index.q8 is None and index.n == 300
    visible = set(range(1, 301, 3))

    async def check(ids: list[int]) -> set[int]:
        return {i for i in ids if i in visible}

    got = await index.top_visible(FakeTx(), rows, x[0], 7, 0.0, check)  # type: ignore[arg-type]
    assert got is not None
    assert [s for _, s in got] == pytest.approx(best(x, x[0], visible, 0.0, 7), abs=1e-5)
