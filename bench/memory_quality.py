"""Memory retrieval quality on the labeled set (bench/memory_labeled.py): recall@k for lexical, vector and
fused search with the local embedder (all-MiniLM-L6-v2), and what the fusion weights and stopwords do.

    python bench/memory_quality.py            # recall@1/3/5 for each list, the weight sweep, JSON at the end

Every query paraphrases exactly one of the 200 notes; recall@k is the share of queries whose note is among
the first k results. 200 notes are a narrow scope (listed, scored in float32); the last rows search the
same notes the way a scope too wide to list is searched (every vector scanned — in int8 first when SimSIMD
is installed — the best checked for visibility, lexical matches ranked without the join) and say whether
every ranking is the listed one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.memory_labeled import NOTES, QUERIES

import stead
import stead.memory._index as index_module
import stead.memory._retrieval as retrieval
from stead.memory import MemoryConfig, MemoryPlugin, MiniLMEmbedder
from stead.memory import _sql as rows_module

USER = "u-bench"
# (lexical weight, vector weight, the cosine a vector-only hit must reach)
SWEEP = [
    (1.0, 1.0, 0.3),
    (0.5, 1.0, 0.3),
    (0.3, 1.0, 0.3),
    (0.2, 1.0, 0.3),
    (0.1, 1.0, 0.3),
    (0.2, 1.0, 0.2),
    (0.2, 1.0, 0.0),
]


def recall(ranked: list[list[str]], wanted: list[str], k: int) -> float:
    return sum(1 for r, w in zip(ranked, wanted, strict=True) if w in r[:k]) / len(wanted)


async def run(embedder: Any = None) -> dict[str, Any]:
    embedder = embedder or MiniLMEmbedder()
    index_module.QUANTIZE_MIN = 0  # the int8 copy from the first vector (used by the wide-scope rows only)
    out: dict[str, Any] = {"notes": len(NOTES), "queries": len(QUERIES), "embedder": embedder.model}
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/quality.db?synchronous=normal"
        async with stead.open(url, memory=MemoryConfig(embedder=embedder)) as system:
            memory = system.memory
            t0 = time.perf_counter()
            ids = [(await memory.add(text, user=USER)).id for text in NOTES]
            out["add_seconds"] = round(time.perf_counter() - t0, 2)
            wanted = [ids[i] for _, i in QUERIES]
            plugin = system.plugin("memory")
            assert isinstance(plugin, MemoryPlugin)
            weights = plugin.retriever.weights

            async def ranked(lists: Any, limit: int = 5) -> list[list[str]]:
                return [
                    [n.id for n in await memory.search(q, user=USER, limit=limit, lists=lists)]
                    for q, _ in QUERIES
                ]

            def row(name: str, r: list[list[str]]) -> dict[str, float]:
                res = {f"recall@{k}": round(recall(r, wanted, k), 3) for k in (1, 3, 5)}
                print(f"{name:<44} " + "  ".join(f"{k} {v:.3f}" for k, v in res.items()))
                return res

            table: dict[str, Any] = {}
            saved_min = weights.min_similarity
            weights.min_similarity = -1.0  # the lists as they are (no floor) for the per-list numbers
            table["lexical"] = row("lexical (stopwords dropped)", await ranked(["lexical"]))
            table["vector"] = row("vector (exact cosine)", await ranked(["vector"]))
            weights.min_similarity = saved_min
            sweep: dict[str, Any] = {}
            for lw, vw, floor in SWEEP:
                weights.lexical, weights.vector, weights.min_similarity = lw, vw, floor
                name = f"lexical {lw} / vector {vw}, floor {floor}"
                sweep[name] = row(f"fused, {name}", await ranked(None))
            weights.min_similarity = saved_min
            # the unfiltered OR-query of every token (what the issue warns about), at equal weights
            weights.lexical, weights.vector = 1.0, 1.0
            original = rows_module.STOPWORDS
            rows_module.STOPWORDS = frozenset()
            try:
                table["lexical, every token"] = row(
                    "lexical, every token (no stopwords dropped)", await ranked(["lexical"])
                )
                sweep["every token, 1.0 / 1.0"] = row(
                    "fused, every token, weights 1.0 / 1.0", await ranked(None)
                )
            finally:
                rows_module.STOPWORDS = original
            cfg = MemoryConfig()
            weights.lexical, weights.vector = cfg.lexical_weight, cfg.vector_weight
            table["fused (default)"] = row(
                f"fused, defaults ({cfg.lexical_weight} / {cfg.vector_weight}, floor {cfg.min_similarity})",
                await ranked(None),
            )
            listed = {"vector": None, "fused": await ranked(None)}
            weights.min_similarity = -1.0
            listed["vector"] = await ranked(["vector"])
            saved_wide, retrieval.WIDE_SCOPE = retrieval.WIDE_SCOPE, 1
            try:
                wide_vector = await ranked(["vector"])
                table["vector, wide-scope path"] = row("vector, wide-scope path", wide_vector)
                weights.min_similarity = saved_min
                wide_fused = await ranked(None)
                table["fused (default), wide-scope path"] = row(
                    "fused, defaults, wide-scope path", wide_fused
                )
            finally:
                retrieval.WIDE_SCOPE = saved_wide
                weights.min_similarity = saved_min
            out["wide_same_rankings"] = wide_vector == listed["vector"] and wide_fused == listed["fused"]
            print("wide-scope rankings identical to the listed ones:", out["wide_same_rankings"])
            out["recall"] = table
            out["fusion_sweep"] = sweep
    return out


def main() -> None:
    result = asyncio.run(run())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
