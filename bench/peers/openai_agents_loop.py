"""Tool-loop workload on the OpenAI Agents SDK with ``SQLiteSession``.

A custom ``agents.models.interface.Model`` returns one ``function_call`` per response until K tool
results follow the user message, then a text message. Tracing is disabled. One ``SQLiteSession``
per conversation (``session_id`` = conversation id), all in one database file, closed after its
conversation; one ``Runner.run`` per conversation.

Note what ``SQLiteSession`` persists: the conversation items, appended when a turn's items are
saved. It is conversation memory, not a checkpoint of the run loop.

Run: ``bench/.peers/venv/bin/python bench/peers/openai_agents_loop.py --n 200``
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

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
from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

VARIANTS = ["default"]
CLOCK = Clock()


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def scripted_output(items: str | list[TResponseInputItem], k: int) -> list[Any]:
    """A function call while fewer than k tool outputs follow the last user message, then text."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    rounds = 0
    conv = ""
    for item in reversed(items):
        if _field(item, "type") == "function_call_output":
            rounds += 1
        elif _field(item, "role") == "user":
            content = _field(item, "content")
            conv = conv_from_text(content if isinstance(content, str) else json.dumps(content))
            break
    if rounds < k:
        cid = call_id(conv, rounds)
        return [
            ResponseFunctionToolCall(
                id=f"fc_{cid}",
                call_id=cid,
                name="add",
                arguments=json.dumps({"a": rounds, "b": 1}),
                type="function_call",
                status="completed",
            )
        ]
    return [
        ResponseOutputMessage(
            id=f"msg_{conv}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=final_text(k), annotations=[])],
        )
    ]


class ScriptedModel(Model):
    def __init__(self, k: int) -> None:
        self.k = k

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
    ) -> ModelResponse:
        with CLOCK.model():
            output = scripted_output(input, self.k)
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the benchmark does not stream")


@function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    with CLOCK.tool():
        return a + b


async def run_workload(path: Path, ids: list[str], k: int, counted: bool) -> float:
    agent = Agent(name="bench", instructions="Add things up.", model=ScriptedModel(k), tools=[add])
    COUNTER.enabled = counted
    t0 = time.perf_counter()
    for conv in ids:
        session = SQLiteSession(conv, path)
        try:
            result = await Runner.run(agent, user_text(conv), session=session, max_turns=k + 5)
        finally:
            session.close()
        if result.final_output != final_text(k):
            raise SystemExit(f"unexpected final output: {result.final_output!r}")
    wall = time.perf_counter() - t0
    COUNTER.enabled = False
    return wall


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", VARIANTS)
    install_sqlite_hooks(args.sync)
    set_tracing_disabled(True)
    with tempfile.TemporaryDirectory(prefix="bench-oai-agents-", dir=args.dir) as tmp:
        warm = Path(tmp) / "warmup.db"
        asyncio.run(run_workload(warm, ["warm-setup"], args.k, counted=False))
        commits = None
        if args.warmup:
            before = COUNTER.commits
            ids = [f"warm-{i}" for i in range(args.warmup)]
            asyncio.run(run_workload(warm, ids, args.k, counted=True))
            commits = (COUNTER.commits - before) / args.warmup
        CLOCK.reset()
        db = Path(tmp) / "agents.db"
        wall = asyncio.run(run_workload(db, [conv_id(i) for i in range(args.n)], args.k, counted=False))
        size = db_bytes(db)
        sync_mode = effective_synchronous(db)

    emit(
        framework="openai-agents",
        variant="SQLiteSession, Runner.run",
        version=f"openai-agents {version('openai-agents')}",
        n=args.n,
        k=args.k,
        wall=wall,
        clock=CLOCK,
        commits=commits,
        db_bytes_total=size,
        synchronous=sync_mode,
        note="SQLiteSession stores conversation items (memory), not a resumable checkpoint of the run",
    )


if __name__ == "__main__":
    main()
