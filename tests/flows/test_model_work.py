"""SEC4 in-process: model-chosen computations run in a worker process that is killed at the deadline (the
next computation gets a fresh one), regular expressions are RE2, and pipeline values are sized as they grow
(a value that shares itself is refused before anything serializes it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from stead.flows._pipeline import PipelineError, run_pipeline
from stead.flows._sandbox import ComputeFailed, ComputeTimeout, compute

DOUBLE = " | ".join(["[@, @][]"] * 40)


async def test_SEC4_a_computation_past_its_deadline_is_killed_and_the_next_one_runs() -> None:
    # the first computation of a process starts the fork server (an interpreter importing stead): not timed
    await compute("stage", "s", "count", True, {}, [], deadline=time.monotonic() + 60)
    started = time.monotonic()
    with pytest.raises((ComputeTimeout, ComputeFailed)):
        await compute("stage", "stage 1 (path)", "path", DOUBLE, {}, [1, 2, 3], deadline=time.monotonic() + 1)
    assert time.monotonic() - started < 3
    value, chars = await compute("stage", "s", "count", True, {}, [1, 2, 3], deadline=time.monotonic() + 10)
    assert (value, chars) == (3, 1)


async def test_SEC4_cancelling_the_caller_stops_the_computation() -> None:
    task = asyncio.create_task(
        compute("stage", "s", "path", DOUBLE, {}, [1, 2, 3], deadline=time.monotonic() + 60)
    )
    await asyncio.sleep(0.3)  # let it start working (no event marks that from the other process)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = time.monotonic()  # the workers are free again: a new computation answers at once
    value, _ = await compute("stage", "s", "count", True, {}, [1], deadline=time.monotonic() + 10)
    value2, _ = await compute("stage", "s", "count", True, {}, [1, 2], deadline=time.monotonic() + 10)
    assert (value, value2) == (1, 2) and time.monotonic() - started < 5


async def test_SEC4_a_pipeline_value_that_shares_itself_is_refused_by_its_size(ctx: Any) -> None:
    stages = [{"value": "x" * 100}] + [{"path": "{l: @, r: @}"}] * 18 + [{"count": True}]
    with pytest.raises(PipelineError, match=r"stage 15 \(path\): the value grew past 1,000,000 characters"):
        await run_pipeline(stages, ctx, {}, deadline=20)


async def test_SEC4_pipeline_grep_is_re2_linear_and_refuses_backreferences(ctx: Any) -> None:
    lines = ["a" * 40 + "b"] * 200 + ["aaa"]
    value, _, _ = await run_pipeline(
        [{"value": lines}, {"grep": "(a+)+$"}, {"count": True}], ctx, {}, deadline=5
    )
    assert value == 1
    with pytest.raises(PipelineError, match=r"stage 2 \(grep\): invalid regular expression \(RE2 syntax"):
        await run_pipeline([{"value": lines}, {"grep": r"(a)\1"}], ctx, {}, deadline=5)


def test_SEC4_a_tool_output_nested_too_deeply_to_parse_becomes_a_text_artifact() -> None:
    from stead.flows._artifacts import _kind, describe

    deep = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError, not ValueError
    assert _kind(deep) == "text" and describe(deep, "text") == "text of 1 lines"
