"""SEC4 against a real server on loopback: model-chosen regular expressions, JMESPath paths and pipelines
that would take exponential time or space end with an error result within their deadline, and `/healthz`
answers within 100 ms all the while (docs/security.md, docs/flows.md)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import stead
import stead.server
from stead.flows import _artifacts
from stead.server import create_app
from stead.server._run import start, stop
from tests.fakes import flows as F
from tests.server.support import TOKENS, A, bearer

EVIL = "(a+)+$"
"""Backtracks exponentially in a backtracking engine on 'aaaa…b'."""
LINE = "a" * 40 + "b"
DOUBLE = " | ".join(["[@, @][]"] * 40)
"""A JMESPath path that doubles a list 40 times (2^40 times its items)."""
SHARE = " | ".join(["{l: @, r: @}"] * 40)
"""Each step shares the value twice: small in memory, 2^40 times its text."""


@stead.tool(durable=True)
async def evil_lines() -> str:
    """Lines that make a backtracking regex engine take forever."""
    return "\n".join([LINE] * 500)


@stead.tool(durable=True)
async def items() -> list[int]:
    """A JSON list, big enough to become an artifact."""
    return list(range(5000))


def _results(request: stead.ProviderRequest) -> list[stead.ToolResult]:
    return [
        b for m in request.messages if m.role == "tool" for b in m.content if isinstance(b, stead.ToolResult)
    ]


@dataclass
class Live:
    system: stead.AgentSystem
    base: str
    http: httpx.AsyncClient
    idle_healthz: float = 0.0
    """The slowest of 20 `/healthz` answers before the run (reported when a test fails: a loaded machine)."""


Calls = list[tuple[str, dict[str, Any]]]


@pytest.fixture
async def serve(db_url: str, tmp_path: Path) -> AsyncIterator[Callable[[Calls], Any]]:
    """`serve(calls)`: a service whose `reader` agent makes `calls` (an "ID" argument is the artifact of the
    first call's output), behind a real uvicorn on 127.0.0.1."""
    opened: list[Any] = []

    async def make(calls: Calls) -> Live:
        seen: list[str] = []

        def respond(request: stead.ProviderRequest) -> list[stead.Block]:
            done = _results(request)
            if len(done) == 1 and "artifact " in done[0].output:
                seen.append(done[0].output.split("artifact ")[1].split(":")[0])
            if len(done) < len(calls):
                name, args = calls[len(done)]
                args = {k: (seen[0] if v == "ID" else v) for k, v in args.items()}
                return [stead.ToolCall(name, args)]
            return [stead.Text(json.dumps([r.output for r in done]))]

        team = tmp_path / "team"
        F.write(team, "model.yaml", F.PLACEHOLDER_MODEL)
        F.write(
            team,
            "reader.yaml",
            "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts, pipeline]\n"
            "tools: [tests.server.test_model_work:evil_lines, tests.server.test_model_work:items]\n",
        )
        system = await stead.server.open(
            db_url, definitions=team, providers={"scripted/reader": stead.testing.ScriptedProvider(respond)}
        )
        server, task = await start(create_app(system, tokens=TOKENS), port=0)
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.bound_port}", timeout=30)
        opened.append((system, server, task, http))
        return Live(system, f"http://127.0.0.1:{server.bound_port}", http)

    try:
        yield make
    finally:
        for system, server, task, http in opened:
            await http.aclose()
            await stop(server, task)
            await system.close()


async def _run_polling(live: Live) -> tuple[list[str], float, list[float]]:
    """Run the agent over HTTP while polling /healthz: (the tool results, the run's seconds, every
    /healthz answer's seconds)."""
    r = await live.http.post("/v1/agents", json={"definition": "reader"}, headers=bearer(A))
    assert r.status_code == 201, r.text
    agent_id = r.json()["id"]
    answers: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=30) as probe:
            while not done.is_set():
                started = time.monotonic()
                answer = await probe.get("/v1/healthz")
                assert answer.status_code == 200
                answers.append(time.monotonic() - started)
                await asyncio.sleep(0.01)  # the probe's pace, not a synchronization

    async with httpx.AsyncClient(base_url=live.base, timeout=30) as probe:  # for the failure message only
        idle = 0.0
        for _ in range(20):
            started = time.monotonic()
            await probe.get("/v1/healthz")
            idle = max(idle, time.monotonic() - started)
    live.idle_healthz = idle
    poller = asyncio.create_task(poll())
    started = time.monotonic()
    try:
        sent = await live.http.post(
            f"/v1/agents/{agent_id}/messages", json={"content": "go"}, headers=bearer(A)
        )
        assert sent.status_code == 202, sent.text
        agent = await live.system.get(agent_id)
        await agent.wait_idle(60)
        took = time.monotonic() - started
    finally:
        done.set()
        await poller
    history = await agent.history()
    outputs = [b.output for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    return outputs, took, answers


def _assert_healthz_answered(answers: list[float], live: Live) -> None:
    """`/healthz` answered within 100 ms all the while: at least 95 of 100 answers within 100 ms, and
    none stalled for a second. A computation on the event loop stalls it until its deadline or longer (2 s
    here; 6.5 s measured before SEC4), so this fails whenever the loop waits for one; what it tolerates is a
    rare answer delayed by the machine (on a CPU-starved 2-core runner one answer took 0.5 s with no frame
    of this process running: the scheduler, not the service)."""
    assert answers, "no /healthz answer during the run"
    ordered = sorted(answers)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    where = (
        f"{len(answers)} answers, p95 {p95:.3f}s, slowest {ordered[-1]:.3f}s (idle: {live.idle_healthz:.3f}s)"
    )
    assert p95 < 0.1, where
    assert ordered[-1] < 1.0, where


async def test_SEC4_a_redos_pattern_in_artifact_grep_and_a_pipeline_grep_answers_at_once(
    serve: Callable[[Calls], Any],
) -> None:
    live = await serve(
        [
            ("evil_lines", {}),
            ("artifact_grep", {"id": "ID", "pattern": EVIL}),
            ("run_pipeline", {"stages": [{"tool": "evil_lines"}, {"grep": EVIL}, {"count": True}]}),
        ]
    )
    outputs, took, answers = await _run_polling(live)
    assert outputs[1].startswith("0 matching lines")  # RE2: linear time, and the right answer
    assert outputs[2].startswith("0")
    assert took < 10, took
    _assert_healthz_answered(answers, live)


async def test_SEC4_a_jmespath_blow_up_ends_with_an_error_within_its_deadline_and_healthz_answers(
    serve: Callable[[Calls], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_artifacts, "DEADLINE", 2.0)
    live = await serve(
        [
            ("items", {}),
            ("artifact_json", {"id": "ID", "path": DOUBLE}),
            ("run_pipeline", {"stages": [{"value": [1, 2, 3]}, {"path": DOUBLE}], "deadline_seconds": 2}),
            ("run_pipeline", {"stages": [{"value": "x" * 100}, {"path": SHARE}, {"count": True}]}),
        ]
    )
    outputs, took, answers = await _run_polling(live)
    blown, piped, shared = outputs[1:]
    assert "did not finish within 2 seconds" in blown or "more memory" in blown, blown
    assert "deadline" in piped or "more memory" in piped, piped
    assert "grew past 1,000,000 characters" in shared, shared
    assert took < 2 + 2 + 10, took  # two deadlines and the rest
    _assert_healthz_answered(answers, live)
