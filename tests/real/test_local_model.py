"""stead against a real model (llama.cpp's `llama-server` with SmolLM2-135M-Instruct, `scripts/local-llm`).

What a 135M model does is not what a frontier model does: the assertions check what stead promises (real
usage from the server, the request shapes, the grammar-forced outputs, compaction keeping the window,
recovery from a dead server), never the quality of an answer. docs/providers.md "Local models" has the
measured table.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.core.events import BlockReset, Compacted
from stead.providers.base import TextDelta
from tests.real.conftest import MODEL, local_llm

FAST_RETRY = stead.RetryPolicy(max_attempts=30, base_delay=0.5, max_delay=2.0)
"""About a minute of retries: the restarted server loads its model first."""
calls: list[dict[str, Any]] = []


@stead.tool
async def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    calls.append({"a": a, "b": b})
    return a + b


@pytest.fixture
def binary() -> Path:
    """The llama-server the kill test starts: `STEAD_LLAMA_SERVER`, or the one scripts/local-llm built."""
    found = Path(os.environ.get("STEAD_LLAMA_SERVER") or local_llm().binary_path())
    if not found.is_file():
        pytest.skip(f"no llama-server binary at {found} (run scripts/local-llm binary)")
    return found


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.mark.timeout(300)
async def test_LM1_chat_reports_the_servers_real_usage(db: str, model: str) -> None:
    async with await stead.open(db) as system:
        agent = await system.create(model=model, instructions="You are a helpful assistant. Answer briefly.")
        result = await agent.run("Say hello in one short sentence.", check=True)
    assert result.text.strip()
    assert result.usage.estimated is False  # counted by the server, not estimated by stead
    assert result.usage.input_tokens > 10 and result.usage.output_tokens > 0


@pytest.mark.timeout(300)
async def test_LM2_tool_choice_required_makes_the_model_call_a_tool(
    db: str, model: str, tmp_path: Path
) -> None:
    calls.clear()
    team = tmp_path / "team"
    write(
        team,
        "adder",
        f"""
        name: adder
        model: {model}
        instructions: You add numbers with the add tool.
        tools: [tests.real.test_local_model:add]
        model_options: {{tool_choice: required, temperature: 0, seed: 1}}
        limits: {{max_iterations: 2}}
        """,
    )
    async with await stead.open(db, definitions=team) as system:
        agent = await system.create(definition="adder")
        await agent.run("What is 2 + 3?")
        history = await agent.history()
    # `required` holds for every request: the first one must call the tool (the server's grammar forces a
    # call); the run then ends at its iteration limit, as `required` allows no plain answer
    made = [b for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    assert made and made[0].name == "add"
    assert calls and all(isinstance(c["a"], int) and isinstance(c["b"], int) for c in calls)


@pytest.mark.timeout(300)
async def test_LM3_flow_prompt_step_output_schema_is_forced_by_the_server(
    db: str, model: str, tmp_path: Path
) -> None:
    team = tmp_path / "team"
    write(
        team,
        "mood",
        f"""
        name: mood
        type: flow
        model: {model}
        model_options: {{temperature: 0, seed: 1}}
        steps:
          - name: classify
            prompt: "Classify the sentiment of the user's message as positive or negative."
            output_schema:
              type: object
              properties: {{sentiment: {{type: string, enum: [positive, negative]}}}}
              required: [sentiment]
              additionalProperties: false
            output: {{sentiment: step.output.sentiment}}
        """,
    )
    async with await stead.open(db, definitions=team) as system:
        agent = await system.create(definition="mood")
        result = await agent.run("I love this, it works wonderfully!")
    assert result.ok, result.error
    assert result.payload is not None and result.payload["sentiment"] in ("positive", "negative")


@pytest.mark.timeout(900)
async def test_LM4_compaction_keeps_a_long_conversation_inside_a_2048_window(db: str, model: str) -> None:
    topics = ["apples", "rivers", "trains", "music", "winter", "bread", "bridges", "stars", "cats", "paper"]
    filler = " ".join(f"Sentence {i} of a long note that only fills the conversation." for i in range(25))
    async with await stead.open(db) as system:
        agent = await system.create(
            model=model,
            instructions="Answer in one short sentence.",
            context={"window": 2048, "reserve": 400, "keep_recent_tokens": 300},
            model_options={"max_tokens": 60, "temperature": 0},
        )
        events = agent.events()
        results = [await agent.run(f"{filler} Now say one thing about {t}.") for t in topics]
        compactions: list[Compacted] = []
        while True:
            try:
                ev = await asyncio.wait_for(events.__anext__(), 0.01)
            except (TimeoutError, StopAsyncIteration):
                break
            if isinstance(ev, Compacted):
                compactions.append(ev)
        await events.aclose()  # type: ignore[attr-defined]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert compactions, "ten messages of ~450 tokens must not fit a 2,048-token window without compacting"
    assert all(r.usage.input_tokens < 2048 for r in results)  # measured by the server


@pytest.mark.timeout(600)
async def test_LM5_a_server_killed_mid_stream_is_retried_after_its_restart(
    db: str, tmp_path: Path, binary: Path
) -> None:
    helper = local_llm()
    port = helper.free_port()
    proc, url = await asyncio.to_thread(helper.start, port=port, binary=binary, log_file=tmp_path / "s.log")
    restarted: list[Any] = []
    try:
        async with await stead.open(db, retry=FAST_RETRY) as system:
            agent = await system.create(
                model=f"openai-compatible:{MODEL}@{url}",
                model_options={"max_tokens": 200, "temperature": 0},
            )
            events = agent.events()
            run = asyncio.create_task(agent.run("Count from 1 to 100, one number per line."))
            reset = False
            async for ev in events:
                if isinstance(ev, TextDelta) and not restarted:
                    os.killpg(proc.pid, signal.SIGKILL)  # the server dies mid-stream
                    await asyncio.to_thread(proc.wait)
                    new, _ = await asyncio.to_thread(
                        helper.start, port=port, binary=binary, log_file=tmp_path / "s.log"
                    )
                    restarted.append(new)
                elif isinstance(ev, BlockReset):
                    reset = True
                elif isinstance(ev, stead.Settled):
                    break
            result = await run
    finally:
        for p in [proc, *restarted]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert restarted, "the model streamed no text"
    assert reset  # observers were told the half-streamed block is dropped (S3)
    assert result.ok, result.error
    assert "1" in result.text
