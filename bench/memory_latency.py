"""Memory latency: search over 10,000 and 100,000 notes (p50/p95), injection cost per run, write cost per
`remember` call.

    python bench/memory_latency.py [--sizes 10000,100000] [--queries 200] [--search-only]
        [--layouts all,users] [--exact-scan]

`--exact-scan` turns the int8 scan off (float32 only, as without SimSIMD). Per size and layout it also
reports the first search's time (a cold index: every vector read from the store, and quantized — what a
restart costs; the store's file is in the OS cache, having just been written) and the process's resident
memory before the store opened and after the searches.

Notes are synthetic sentences of 8 words from a 2,000-word vocabulary, with random unit vectors (384
dimensions, float32) — search cost does not depend on which model made them; the local model's query
embedding is measured separately. Two layouts: every note visible to the query (one user: the worst case,
every note a candidate) and 1,000 users (the query sees one user's notes plus none of the others').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import stead
import stead.memory._index as index_module
import stead.memory._retrieval as retrieval
from stead.memory import AgentMemory, MemoryConfig, MemoryPlugin, MiniLMEmbedder, Scope
from stead.memory._model import text_hash
from stead.testing import ScriptedProvider

DIMS = 384


class RandomEmbedder:
    """Seeded random unit vectors (search cost is the same whatever model made the vectors)."""

    model = "random-384"
    dims = DIMS

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def one(self) -> list[float]:
        v = [self.rng.gauss(0, 1) for _ in range(DIMS)]
        n = sum(x * x for x in v) ** 0.5
        return [x / n for x in v]

    async def embed(self, texts: Sequence[str], *, kind: str = "document") -> list[list[float]]:
        if kind == "query":  # the same query, the same vector: both search paths are asked the same
            return [RandomEmbedder(sum(map(ord, t)) * 7919 + len(t)).one() for t in texts]
        return [self.one() for _ in texts]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def fill(system: stead.AgentSystem, n: int, users: int, rng: random.Random, vocab: list[str]) -> None:
    plugin = system.plugin("memory")
    assert isinstance(plugin, MemoryPlugin)
    core = plugin.core
    emb = RandomEmbedder(1)
    for start in range(0, n, 5000):
        async with system.store.transaction() as tx:
            for i in range(start, min(n, start + 5000)):
                text = " ".join(rng.choice(vocab) for _ in range(8)).capitalize() + "."
                seq, _ = await core.rows.insert_note(
                    tx,
                    text=text,
                    type="context",
                    status="active",
                    author="human",
                    provenance="direct_user",
                    trust="trusted",
                    scope=Scope(user=f"u{i % users}"),
                    body_hash=text_hash(text),
                )
                await core.rows.put_vector(tx, "note", seq, emb.model, emb.one())


async def search_latency(n: int, users: int, queries: int) -> dict[str, float]:
    rng = random.Random(n + users)
    vocab = [f"w{i}" for i in range(2000)]
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/lat.db?synchronous=normal"
        out: dict[str, float] = {}
        async with stead.open(url, memory=MemoryConfig(embedder=RandomEmbedder())) as system:
            await fill(system, n, users, rng, vocab)
        rss0 = rss_mib()
        async with stead.open(url, memory=MemoryConfig(embedder=RandomEmbedder())) as system:
            memory = system.memory
            t0 = time.perf_counter()
            await memory.search("w1 w2 w3", user="u0")  # loads the vector index (once per process)
            out["cold_first_search_s"] = round(time.perf_counter() - t0, 2)
            qs = [" ".join(rng.choice(vocab) for _ in range(6)) for _ in range(queries)]
            listed: list[list[str]] = []
            # before issue 23: list every visible note, score those; after: score every vector, check the
            # best (a scope wider than WIDE_SCOPE). Same queries, same store, same process; same answers.
            for label, wide in (("listing", 10**12), ("", retrieval.WIDE_SCOPE)):
                saved, retrieval.WIDE_SCOPE = retrieval.WIDE_SCOPE, wide
                try:
                    times: list[float] = []
                    answers = []
                    for q in qs:
                        t0 = time.perf_counter()
                        answers.append([n.id for n in await memory.search(q, user="u0", limit=5)])
                        times.append((time.perf_counter() - t0) * 1000)
                finally:
                    retrieval.WIDE_SCOPE = saved
                prefix = f"{label}_" if label else ""
                out[f"{prefix}p50_ms"] = round(pct(times, 0.5), 2)
                out[f"{prefix}p95_ms"] = round(pct(times, 0.95), 2)
                if label:
                    listed = answers
                else:
                    out["same_answers"] = float(answers == listed)
            plugin = system.plugin("memory")
            assert isinstance(plugin, MemoryPlugin)
            idx = plugin.retriever._indexes.get("note")
            if idx is not None and hasattr(idx, "memory_bytes"):
                out["index_mib"] = round(idx.memory_bytes() / 2**20, 1)
                out["int8_rows"] = float(idx.qn)
            out["rss_before_mib"] = rss0
            out["rss_after_mib"] = rss_mib()
    return out


async def minilm_query_ms(samples: int = 30) -> dict[str, float]:
    model = MiniLMEmbedder()
    await model.embed(["warm up"])
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        await model.embed([f"which seat do they like on the train number {i}?"], kind="query")
        times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(pct(times, 0.5), 2), "p95_ms": round(pct(times, 0.95), 2)}


def _respond(calls: list[dict[str, Any]]) -> Any:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        done = sum(len(m.content) for m in request.messages[last_user:] if m.role == "tool")
        if done < len(calls):
            return [stead.ToolCall(**calls[done])]
        return [stead.Text("ok")]

    return respond


@stead.tool(transactional=True)
async def noop(note: str, ctx: stead.ToolContext) -> str:
    "A transactional tool that does nothing (the baseline of a tool call)."
    return "ok"


async def run_costs(embedder: Any, n_notes: int, runs: int) -> dict[str, float]:
    """Median run time of: a plain agent, the same with memory injection (5 notes), a run with one
    transactional no-op call, a run with one `remember` call — in one store holding `n_notes` notes."""
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(2000)]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/runs.db?synchronous=normal"
        for label, calls, memory in (
            ("plain run", [], None),
            ("run with injection", [], AgentMemory(notes=5)),
            ("run with a no-op tool call", [{"name": "noop", "arguments": {"note": "x"}}], None),
            (
                "run with one remember call",
                [{"name": "remember", "arguments": {"type": "context", "note": "PLACEHOLDER"}}],
                AgentMemory(notes=0, write=True),
            ),
        ):
            async with stead.open(
                url,
                providers={"s": ScriptedProvider(_respond(calls))},
                tools=[noop],
                memory=MemoryConfig(embedder=embedder),
            ) as system:
                if not await system.memory.notes(limit=1):
                    if isinstance(embedder, RandomEmbedder):
                        await fill(system, n_notes, 1000, rng, vocab)
                    else:  # real vectors: the labeled set's 200 notes, for one user
                        from bench.memory_labeled import NOTES

                        for text in NOTES[:n_notes]:
                            await system.memory.add(text, user="u0")
                    await system.memory.search("warm up", user="u0")
                agent = await system.create(
                    provider="s", model="m", tools=["noop"], extra=memory.as_extra() if memory else {}
                )
                times = []
                for i in range(runs):
                    if calls and calls[0]["name"] == "remember":
                        calls[0]["arguments"]["note"] = f"Fact number {i} about w{i} and w{i + 1}."
                    t0 = time.perf_counter()
                    await agent.run(f"tell me about w{i} w{i * 7 % 2000}", user="u0")
                    times.append((time.perf_counter() - t0) * 1000)
                out[label] = round(statistics.median(times), 2)
    out["injection cost per run"] = round(out["run with injection"] - out["plain run"], 2)
    out["write cost per remember"] = round(
        out["run with one remember call"] - out["run with a no-op tool call"], 2
    )
    return out


async def main(
    sizes: list[int], queries: int, runs: int, search_only: bool = False, layouts: Sequence[int] = (1, 1000)
) -> dict[str, Any]:
    result: dict[str, Any] = {"search": {}}
    for n in sizes:
        for users in layouts:
            key = f"{n} notes, {'1 user (all candidates)' if users == 1 else '1000 users'}"
            result["search"][key] = await search_latency(n, users, queries)
            print(key, result["search"][key], flush=True)
    if search_only:
        return result
    result["minilm query embedding"] = await minilm_query_ms()
    print("minilm query embedding", result["minilm query embedding"], flush=True)
    result["runs, random vectors, 10000 notes"] = await run_costs(RandomEmbedder(), 10_000, runs)
    print(result["runs, random vectors, 10000 notes"], flush=True)
    result["runs, local MiniLM, 200 notes"] = await run_costs(MiniLMEmbedder(), 200, runs)
    print(result["runs, local MiniLM, 200 notes"], flush=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000", help="note counts (e.g. 10000,100000,1000000)")
    parser.add_argument("--search-only", action="store_true", help="skip the per-run costs")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--layouts", default="all,users", help="all (1 user), users (1000 users), or both")
    parser.add_argument("--exact-scan", action="store_true", help="no int8 scan (float32 only)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    layouts = [{"all": 1, "users": 1000}[name] for name in args.layouts.split(",")]
    if args.exact_scan:
        index_module._accel = None  # as if SimSIMD were not installed
    result = asyncio.run(main(sizes, args.queries, args.runs, args.search_only, layouts))
    print(json.dumps(result, indent=2))
