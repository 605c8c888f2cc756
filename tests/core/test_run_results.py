"""`agent.run(...)`: send, wait for the run that consumed *that* message, return its result (issue 9 item 6).

The result is computed from the durable record the kernel owns — consumed-input records carry their run
id, settlement appends an end-of-run record — so `run` is exactly as durable as `send`: the same id again,
in this process or after a crash in a new one, returns the same run's result instead of running again.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

import stead
from stead._ids import new_id
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.conftest import tool_loop
from tests.core import kill_worker as W
from tests.fakes import DEFAULT_USAGE
from tests.fakes.kill import run_and_kill

TIMEOUT = 10.0


@stead.tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Gate:
    """A responder that answers "answer to <text>" but holds the first request until released."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, request: stead.ProviderRequest) -> list[stead.Block]:
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            await self.release.wait()
        last_user = next(m for m in reversed(request.messages) if m.role == "user")
        return [stead.Text(f"answer to {last_user.text}")]


async def open_loop(url: str, k: int = 2) -> tuple[stead.AgentSystem, ScriptedProvider]:
    provider = ScriptedProvider(tool_loop("add", k))
    system = await stead.open(url, providers={"p": provider}, tools=[add])
    return system, provider


async def test_run_returns_result_of_the_run_that_consumed_the_message(db_url: str) -> None:
    loop = tool_loop("add", 2)
    # each response reports 10 input tokens: the run's usage is the sum over its three responses
    provider = ScriptedProvider(lambda r: ScriptedResponse(blocks=loop(r), usage=DEFAULT_USAGE))
    system = await stead.open(db_url, providers={"p": provider}, tools=[add])
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        result = await asyncio.wait_for(agent.run("add things"), TIMEOUT)
        assert isinstance(result, stead.RunResult)
        assert result.outcome is stead.Outcome.COMPLETED and result.outcome == "completed"
        assert result.ok and result.error is None
        assert result.text == "done after 2 calls"
        history = await agent.history()
        assert result.messages == history  # the only run: every message of the conversation
        assert [m.role for m in result.messages] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        assert result.message_id == history[0].id
        # usage: summed over the run's three responses
        usages = [m.usage for m in history if m.usage is not None]
        assert len(usages) == 3
        assert result.usage.input_tokens == sum(u.input_tokens for u in usages) == 30
        assert result.usage.output_tokens == sum(u.output_tokens for u in usages)
        # the run id is the run's (the run record has it)
        run = await system.run(result.run_id)
        assert run.status == "completed"
        assert len(provider.requests) == 3


async def test_run_result_covers_only_its_own_run(db_url: str) -> None:
    system, _ = await open_loop(db_url, k=1)
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        first = await asyncio.wait_for(agent.run("first"), TIMEOUT)
        second = await asyncio.wait_for(agent.run("second"), TIMEOUT)
        assert first.run_id != second.run_id
        assert [m.text for m in second.messages if m.role == "user"] == ["second"]
        assert len(first.messages) + len(second.messages) == len(await agent.history())
        assert second.messages == (await agent.history())[len(first.messages) :]


async def test_run_same_id_in_the_same_process_returns_the_same_result_without_running(db_url: str) -> None:
    system, provider = await open_loop(db_url, k=1)
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        mid = new_id()
        first = await asyncio.wait_for(agent.run("once", id=mid), TIMEOUT)
        requests = len(provider.requests)
        again = await asyncio.wait_for(agent.run("once", id=mid), TIMEOUT)
        assert again == first
        assert len(provider.requests) == requests  # nothing ran again
        assert [m.role for m in await agent.history()].count("user") == 1


async def test_run_same_id_after_restart_returns_same_result(tmp_path: Path) -> None:
    """A real process calls `agent.run` and is killed (SIGKILL) while the run's durable tool runs. A new
    process calling `run` with the same id waits for the restored run and gets its result; a third one gets
    the same result again, without any model request."""
    db = tmp_path / "run.db"
    await run_and_kill(Path(W.__file__), db, "run", until="TOOL durable_op")
    conn = sqlite3.connect(db)
    (raw,) = conn.execute(
        "SELECT value FROM kv WHERE agent_id = ? AND key = 'pending'", (W.AGENT_ID,)
    ).fetchone()
    conn.close()
    run_id = json.loads(raw)["run"]  # the run the killed process started

    W.BLOCK_IN_TOOLS = False
    W.EFFECTS = Path(str(db) + ".effects")
    async with await W.open_system(db, ScriptedProvider(W.respond)) as system:
        assert system.restored == [W.AGENT_ID]
        agent = await system.get(W.AGENT_ID)
        result = await asyncio.wait_for(agent.run(W.RUN_TEXT, id=W.RUN_ID), TIMEOUT)
        assert result.run_id == run_id
        assert result.outcome is stead.Outcome.COMPLETED
        assert result.text == "durable_op finished"
        history = await agent.history()
        assert [m.id for m in history if m.role == "user"] == [W.RUN_ID]  # sent once, run once

    provider = ScriptedProvider(W.respond)
    async with await W.open_system(db, provider) as system:
        assert system.restored == []
        agent = await system.get(W.AGENT_ID)
        again = await asyncio.wait_for(agent.run(W.RUN_TEXT, id=W.RUN_ID), TIMEOUT)
        assert again == result
        assert provider.requests == []


async def test_run_check_raises_on_failed(db_url: str) -> None:
    def broken(request: stead.ProviderRequest) -> ScriptedResponse:
        return ScriptedResponse(blocks=[], error="the model is down", retryable=False)

    async with await stead.open(db_url, providers={"p": ScriptedProvider(broken)}) as system:
        agent = await system.create(provider="p")
        result = await asyncio.wait_for(agent.run("hello"), TIMEOUT)
        assert result.outcome is stead.Outcome.FAILED
        assert not result.ok
        assert result.error is not None and "the model is down" in result.error
        with pytest.raises(stead.RunFailed) as info:
            await asyncio.wait_for(agent.run("again", check=True), TIMEOUT)
        assert isinstance(info.value, stead.SteadError)
        assert info.value.result.outcome is stead.Outcome.FAILED
        assert info.value.run_id == info.value.result.run_id != result.run_id
        assert "the model is down" in str(info.value)


async def test_run_check_does_not_raise_on_completed_or_cancelled(db_url: str) -> None:
    gate = Gate()
    async with await stead.open(db_url, providers={"p": ScriptedProvider(gate)}) as system:
        agent = await system.create(provider="p")
        task = asyncio.create_task(agent.run("held", check=True))
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await agent.abort()
        result = await asyncio.wait_for(task, TIMEOUT)
        assert result.outcome is stead.Outcome.CANCELLED
        assert result.error == "aborted"
        ok = await asyncio.wait_for(agent.run("next", check=True), TIMEOUT)
        assert ok.outcome is stead.Outcome.COMPLETED and ok.text == "answer to next"


async def test_run_waits_while_queued_behind_another_run(db_url: str) -> None:
    """A message sent while another run works is queued; `run` waits. The working run consumes it when its
    answer is done (a send accepted during a run extends that run, X2), so the result is that run's."""
    gate = Gate()
    async with await stead.open(db_url, providers={"p": ScriptedProvider(gate)}) as system:
        agent = await system.create(provider="p")
        await agent.send("first")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        task = asyncio.create_task(agent.run("second"))
        try:
            for _ in range(20):  # let the run task send and start waiting (the gated run cannot move)
                await asyncio.sleep(0)
            assert not task.done()
            async with system.store.transaction() as tx:
                queued = [json.loads(v)["c"][0]["x"] for _, v in await tx.read_prefix(agent.id, "q.")]
            assert queued == ["first", "second"]  # the first one's consumption is staged until it answers
        finally:
            gate.release.set()
        result = await asyncio.wait_for(task, TIMEOUT)
        assert result.text == "answer to second"
        assert [m.text for m in result.messages if m.role == "user"] == ["first", "second"]
        history = await agent.history()
        assert result.messages == history


async def test_run_raises_closed_when_this_process_cannot_run_the_agent(db_url: str) -> None:
    """The message's run is owed but this process lacks the agent's provider (the agent is blocked): `run`
    says so instead of waiting forever."""
    hang = ScriptedProvider(lambda r: asyncio.Event().wait())  # type: ignore[arg-type, return-value]
    system = await stead.open(db_url, providers={"p": hang})
    agent = await system.create(provider="p")
    acc = await agent.send("stuck")
    system.abandon()  # the process dies while the request is open
    await system.store.close()

    async with await stead.open(db_url, providers={"other": hang}) as system:
        agent = await system.get(agent.id)
        await agent.wait_idle(TIMEOUT)
        assert agent.state == "blocked"
        with pytest.raises(stead.Closed, match="not registered"):
            await asyncio.wait_for(agent.run("stuck", id=acc.id), TIMEOUT)


async def test_end_of_run_records_are_not_in_the_conversation(db_url: str) -> None:
    """R4: the end-of-run record changes nothing a reader sees: the history and the provider context of
    the next run are the conversation alone."""
    system, provider = await open_loop(db_url, k=1)
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        await asyncio.wait_for(agent.run("one"), TIMEOUT)
        before = await agent.history()
        assert [m.role for m in before] == ["user", "assistant", "tool", "assistant"]
        await asyncio.wait_for(agent.run("two"), TIMEOUT)
        first_request_of_second_run = provider.requests[2]
        assert first_request_of_second_run.messages[: len(before)] == before
        assert [m.text for m in first_request_of_second_run.messages[len(before) :]] == ["two"]
        async with system.store.transaction() as tx:
            kinds = [json.loads(r)["k"] for r in await tx.load(agent.id)]
        assert kinds.count("e") == 2  # one end record per run, in the store only


async def test_agent_config_is_a_read_only_copy(db_url: str) -> None:
    system, _ = await open_loop(db_url)
    async with system:
        agent = await system.create(provider="p", tools=["add"], instructions="be brief", extra={"k": [1]})
        config = agent.config
        assert config.provider == "p" and config.tools == ["add"] and config.instructions == "be brief"
        config.tools.append("other")
        config.extra["k"].append(2)
        config.instructions = "changed"
        assert agent.config.tools == ["add"]
        assert agent.config.extra == {"k": [1]}
        assert agent.config.instructions == "be brief"


class _CountingTx:
    """Wraps a transaction: counts the history records its reads return."""

    def __init__(self, tx: object) -> None:
        self.tx = tx
        self.records_read = 0
        self.whole_loads = 0

    async def load(self, agent_id: str) -> list[str]:
        self.whole_loads += 1
        out: list[str] = await self.tx.load(agent_id)  # type: ignore[attr-defined]
        self.records_read += len(out)
        return out

    async def load_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = await self.tx.load_before(agent_id, before, limit)  # type: ignore[attr-defined]
        self.records_read += len(out)
        return out

    async def load_archive(self, agent_id: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = await self.tx.load_archive(agent_id)  # type: ignore[attr-defined]
        self.records_read += len(out)
        return out


async def test_run_result_is_read_in_O_run_not_O_history(db_url: str) -> None:
    """Issue 23 item 5: a settled run's result is read from the end of the history, as far back as the
    run — not the whole transcript — and equals the whole-history scan, for the last run and an old one."""
    from stead.core.results import read_run_state, run_state

    async with stead.open(
        db_url, providers={"scripted": ScriptedProvider(tool_loop("add", 2))}, tools=[add]
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["add"])
        first = await agent.run("call add 1 2", id="first")
        for i in range(40):
            await agent.run(f"hello {i}", id=f"m{i}")
        last = await agent.run("call add 3 4", id="last")
        async with system.store.transaction() as tx:
            everything = [json.loads(r) for r in await tx.load(agent.id)]
            spy = _CountingTx(tx)
            state = await read_run_state(spy, agent.id, "last")  # type: ignore[arg-type]
            assert state is not None and state.result is not None
            assert spy.whole_loads == 0 and spy.records_read <= 32  # the run's own records and a page
            assert state.result == run_state(everything, "last").result  # type: ignore[union-attr]
            old = await read_run_state(tx, agent.id, "first")
            assert old is not None and old.result == run_state(everything, "first").result  # type: ignore[union-attr]
        assert first.ok and last.ok
        assert len(everything) > 120
