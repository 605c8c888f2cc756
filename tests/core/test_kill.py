"""Real-process crash tests: a child process runs an agent and is killed with SIGKILL at a chosen point
(synchronized on marker lines it prints), then this process reopens the file and finishes the work.

The child is tests/core/kill_worker.py; it logs every tool execution to `<db>.effects` with fsync, so side
effects that happened before the kill are counted exactly.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import stead
from stead.core.batch import IN_DOUBT_TEXT
from stead.providers.scripted import ScriptedProvider
from tests.core import kill_worker as W
from tests.fakes.crash_points import finish_restored
from tests.fakes.kill import run_and_kill
from tests.tools.test_tools import assert_one_result_per_call

WORKER = Path(W.__file__)
TIMEOUT = 30


async def finish(db: Path) -> tuple[list[stead.Message], ScriptedProvider]:
    """Reopen the file in this process (a new owner) and let it finish; check the agent settles."""
    W.BLOCK_IN_TOOLS = False
    W.EFFECTS = Path(str(db) + ".effects")
    provider = ScriptedProvider(W.respond)
    system = await W.open_system(db, provider)
    async with system:
        history, keys = await finish_restored(system, W.AGENT_ID, TIMEOUT)
    left = [k for k in keys if k.startswith(("pending", "q.", "tool."))]
    assert left == []
    assert_one_result_per_call(history)
    return history, provider


def user_ids(history: list[stead.Message]) -> list[str]:
    return [m.id or "" for m in history if m.role == "user"]


async def test_kill_while_accepting_a_batch(tmp_path: Path) -> None:
    db = tmp_path / "accept.db"
    markers = await run_and_kill(WORKER, db, "accept", until="BATCH 4")
    started = int(markers[-1].split()[1])
    history, _ = await finish(db)
    ids = user_ids(history)
    assert len(ids) == len(set(ids))  # every accepted message exactly once
    by_batch = Counter(i.split("msg")[0] for i in ids)
    assert all(n == W.BATCH for n in by_batch.values()), by_batch  # a batch is accepted whole or not at all
    complete = {f"batch{k}" for k in range(started)}  # deliver() returned for these before the kill
    assert complete <= set(by_batch)
    assert set(by_batch) <= complete | {f"batch{started}"}
    # every accepted message was answered, in order
    texts = [m.text for m in history]
    for i, text in enumerate(texts):
        if history[i].role == "user":
            assert texts[i + 1] == f"answer to {text}"


async def test_kill_mid_stream(tmp_path: Path) -> None:
    db = tmp_path / "stream.db"
    await run_and_kill(WORKER, db, "stream", until="DELTA")
    history, provider = await finish(db)
    assert user_ids(history) == ["streammsg"]
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[1].text == W.LONG_TEXT  # the half-streamed answer left nothing; one full answer
    assert len(provider.requests) == 1


@pytest.mark.parametrize("mode", ["plain", "durable"])
async def test_kill_inside_a_tool(tmp_path: Path, mode: str) -> None:
    db = tmp_path / f"{mode}.db"
    markers = await run_and_kill(WORKER, db, mode, until="TOOL")
    _, name, call_id = markers[-1].split()
    history, _ = await finish(db)
    calls = [b for m in history for b in m.content if isinstance(b, stead.ToolCall)]
    assert [c.id for c in calls] == [call_id]  # the call kept its id across the kill
    (result,) = [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]
    effects = W.read_effects(Path(str(db) + ".effects"))
    assert all(e[1] == name and e[2] == call_id for e in effects)
    pids = [e[0] for e in effects]
    if mode == "plain":
        assert len(effects) == 1  # at most once, ever: the new owner did not run it again
        assert result.is_error and result.output == IN_DOUBT_TEXT
    else:
        assert len(effects) == 2 and pids[0] != pids[1]  # ran again in the new process, same call id
        assert not result.is_error and result.output == "durable_op done"
    assert history[-1].text == f"{name} finished"
    assert json.dumps(user_ids(history)) == json.dumps(["toolmsg"])
