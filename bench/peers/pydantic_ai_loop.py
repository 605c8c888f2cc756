"""Tool-loop workload on Pydantic AI with a scripted ``FunctionModel``.

Pydantic AI keeps a run's messages in memory and persists nothing while the run is in progress, so
the default variant has no database at all (``db_bytes_per_conversation`` is null): it measures the
agent loop alone. The ``store-at-end`` variant adds what an application would do to keep the
conversation: after each run, one SQLite transaction storing ``result.all_messages_json()`` (WAL,
same ``synchronous`` as the peers' default) — durable only once the run has finished.

Run: ``bench/.peers/venv/bin/python bench/peers/pydantic_ai_loop.py --n 200 [--variant store-at-end]``
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from _common import (
    COUNTER,
    Clock,
    call_id,
    conv_from_text,
    conv_id,
    db_bytes,
    effective_synchronous,
    emit,
    final_text,
    install_sqlite_hooks,
    parse_args,
    user_text,
)
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

VARIANTS = ["in-memory", "store-at-end"]
CLOCK = Clock()


def scripted_response(messages: list[ModelMessage], k: int) -> ModelResponse:
    """A tool call while fewer than k tool results follow the user prompt, then the answer."""
    rounds = 0
    conv = ""
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                rounds += 1
            elif isinstance(part, UserPromptPart):
                conv = conv_from_text(str(part.content))
        if conv:
            break
    if rounds < k:
        return ModelResponse(
            parts=[
                ToolCallPart(tool_name="add", args={"a": rounds, "b": 1}, tool_call_id=call_id(conv, rounds))
            ]
        )
    return ModelResponse(parts=[TextPart(content=final_text(k))])


def make_agent(k: int) -> Agent[None, str]:
    async def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        with CLOCK.model():
            return scripted_response(messages, k)

    agent: Agent[None, str] = Agent(FunctionModel(model_fn), instructions="Add things up.")

    @agent.tool_plain
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        with CLOCK.tool():
            return a + b

    return agent


async def run_workload(path: Path | None, ids: list[str], k: int, counted: bool) -> float:
    agent = make_agent(k)
    conn = None
    if path is not None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, messages BLOB)")
    COUNTER.enabled = counted
    t0 = time.perf_counter()
    for conv in ids:
        result = await agent.run(user_text(conv))
        if result.output != final_text(k):
            raise SystemExit(f"unexpected output: {result.output!r}")
        if conn is not None:
            conn.execute(
                "INSERT OR REPLACE INTO conversations VALUES (?, ?)", (conv, result.all_messages_json())
            )
    wall = time.perf_counter() - t0
    COUNTER.enabled = False
    if conn is not None:
        conn.close()
    return wall


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", VARIANTS)
    install_sqlite_hooks(args.sync)
    store = args.variant == "store-at-end"
    with tempfile.TemporaryDirectory(prefix="bench-pydantic-ai-", dir=args.dir) as tmp:
        warm = Path(tmp) / "warmup.db" if store else None
        asyncio.run(run_workload(warm, ["warm-setup"], args.k, counted=False))
        commits: float | None = None
        if args.warmup:
            before = COUNTER.commits
            ids = [f"warm-{i}" for i in range(args.warmup)]
            asyncio.run(run_workload(warm, ids, args.k, counted=True))
            commits = (COUNTER.commits - before) / args.warmup
        CLOCK.reset()
        db = Path(tmp) / "pydantic_ai.db" if store else None
        wall = asyncio.run(run_workload(db, [conv_id(i) for i in range(args.n)], args.k, counted=False))
        size = db_bytes(db) if db is not None else None
        sync_mode = effective_synchronous(db) if db is not None else None

    emit(
        framework="pydantic-ai",
        variant="FunctionModel, agent.run" + (", all_messages_json() stored after each run" if store else ""),
        version=f"pydantic-ai-slim {version('pydantic-ai-slim')}",
        n=args.n,
        k=args.k,
        wall=wall,
        clock=CLOCK,
        commits=commits,
        db_bytes_total=size,
        synchronous=sync_mode,
        note=(
            "no persistence during a run; history stored once, after the run"
            if store
            else "no persistence: Pydantic AI persists nothing mid-run (in-memory loop only)"
        ),
    )


if __name__ == "__main__":
    main()
