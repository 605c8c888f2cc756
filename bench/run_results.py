"""`agent.run` against a long history (issue 23, item 5): the result in O(run), not O(history).

    python bench/run_results.py [--histories 100,1000,10000] [--runs 40] [--url sqlite|postgresql://...]

For each history length N, builds one agent whose history holds N settled runs (a user message, an assistant
answer and the run's end record each — written straight into the store, as a long-lived agent would have
them), then measures in the same process, median and p95 over `--runs` calls:

- `agent.run`: one more message through the real loop (scripted echo model) and its result;
- `result read` (after): `stead.core.results.read_run_state` for that last message, the read `agent.run`
  does to build its result (read from the end, as far back as the run);
- `whole-history read` (before): the same result computed as before this change — every record of the
  history loaded and scanned (`tx.load` + `run_state`), kept here as the comparison floor of the old code.

Prints one JSON line per N and a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import stead
from stead.core.results import RunState, read_run_state, run_state
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from stead.store.base import Tx

_SEP = (",", ":")


def echo(request: stead.ProviderRequest) -> ScriptedResponse:
    # usage given: the scripted model's default estimate of the whole request would be the cost measured
    return ScriptedResponse(
        blocks=[stead.Text(f"echo: {request.messages[-1].text}")], usage=stead.Usage(100, 10)
    )


async def whole_history_state(tx: Tx, agent_id: str, message_id: str) -> RunState | None:
    """The result read before issue 23: load every record, scan from the start."""
    records = [json.loads(r) for r in await tx.load(agent_id)]
    return run_state(records, message_id)


async def build(system: stead.AgentSystem, n: int) -> stead.Agent:
    agent = await system.create(provider="scripted", model="m")
    batch = 1000
    for start in range(0, n, batch):
        records: list[str] = []
        for i in range(start, min(n, start + batch)):
            run = f"run{i:07d}"
            records += [
                json.dumps(
                    {
                        "k": "u",
                        "id": f"m{i}",
                        "r": "user",
                        "c": [{"t": "x", "x": f"question {i}"}],
                        "run": run,
                    },
                    separators=_SEP,
                ),
                json.dumps(
                    {
                        "k": "b",
                        "i": f"r{i}",
                        "b": {"t": "x", "x": f"answer {i} " + "x" * 120},
                        "u": [60, 20, 0, None, 1],
                    },
                    separators=_SEP,
                ),
                json.dumps({"k": "e", "run": run, "o": "completed"}, separators=_SEP),
            ]
        async with system.store.transaction() as tx:
            await tx.append(agent.id, records)
    return agent  # the caller reopens the system, so the agent's transcript is read from the store


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return {"p50": round(statistics.median(xs) * 1000, 3), "p95": round(p95 * 1000, 3)}


async def measure(url: str, n: int, runs: int) -> dict[str, Any]:
    providers = {"scripted": ScriptedProvider(echo)}
    async with stead.open(url, providers=providers) as system:
        agent_id = (await build(system, n)).id
    async with stead.open(url, providers=providers) as system:
        agent = await system.get(agent_id)
        run_t: list[float] = []
        last = ""
        for i in range(runs):
            last = f"bench{i}"
            t0 = time.perf_counter()
            result = await agent.run(f"hello {i}", id=last)
            run_t.append(time.perf_counter() - t0)
            assert result.text == f"echo: hello {i}", result.text
        new_t: list[float] = []
        old_t: list[float] = []
        for _ in range(runs):
            async with system.store.transaction() as tx:
                t0 = time.perf_counter()
                new = await read_run_state(tx, agent_id, last)
                new_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                old = await whole_history_state(tx, agent_id, last)
                old_t.append(time.perf_counter() - t0)
            assert new is not None and old is not None and new.result == old.result  # the same answer
    return {
        "bench": "run_results",
        "history_runs": n,
        "history_records": 3 * n,
        "agent_run_ms": _ms(run_t),
        "result_read_ms": _ms(new_t),
        "whole_history_read_ms": _ms(old_t),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", default="100,1000,10000", help="history lengths, in runs")
    ap.add_argument("--runs", type=int, default=40, help="measured calls per length")
    ap.add_argument("--url", default="sqlite", help="sqlite (a temp file) or a postgresql:// URL")
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.histories.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            url = f"sqlite:///{Path(d) / 'runs.db'}?synchronous=normal" if args.url == "sqlite" else args.url
            row = asyncio.run(measure(url, n, args.runs))
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(
        "\n| history (runs) | `agent.run` p50 / p95 | result read (after) p50 / p95 "
        "| whole-history read (before) p50 / p95 |"
    )
    print("|---|---|---|---|")
    for r in rows:
        a, new, old = r["agent_run_ms"], r["result_read_ms"], r["whole_history_read_ms"]
        print(
            f"| {r['history_runs']:,} | {a['p50']} / {a['p95']} ms | {new['p50']} / {new['p95']} ms "
            f"| {old['p50']} / {old['p95']} ms |"
        )


if __name__ == "__main__":
    main()
