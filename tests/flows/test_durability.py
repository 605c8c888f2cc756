"""Flow durability (issue 16): a restart resumes at the first uncommitted step — under crash-point injection
(the store dies at each of its operations in turn) and with a real SIGKILL — and completed tools never run
again; a non-durable tool step cut off by a crash gets the in-doubt result and takes the failure path; a
parallel for-each's iterations commit individually and are merged in index order, also after a crash."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.extend import ToolResultInfo
from tests.fakes import flows as F
from tests.fakes.crash_points import measured_once, parametrize_crash_at, run_until_crash
from tests.fakes.kill import run_and_kill
from tests.flows import flow_kill_worker as W

TIMEOUT = 30
AGENT_ID = "flowcrash0001"
MESSAGE_ID = "flowcrashmsg0001"
PAYLOAD = {"order": 1, "items": [1, 2, 3]}


# ---------------------------------------------------------------------------------------------- crash points
def _write_crashy(team: Path) -> None:
    F.write(team, "model.yaml", F.PLACEHOLDER_MODEL)
    F.write_flow(
        team,
        "crashy",
        """
        steps:
          - {name: find, tool: lookup, input: {order: payload.order}, output: {amount: step.output.amount}}
          - {name: classify, prompt: "Classify order {{ payload.order }}.", output_schema: {type: object}}
          - name: each
            for_each:
              items: "payload.items"
              parallel: true
              concurrency: 2
              do: {tool: work, input: {item: "item"}, output: {"done[]": "step.output.item"}}
          - {name: pay, tool: refund, input: {order: "payload.order", amount: "payload.amount"}}
        paths:
          - {from: find, to: classify}
          - {from: classify, to: each}
          - {from: each, to: pay}
        result: "steps.pay.output"
        """,
        model="scripted:model.yaml",
        tools=["lookup", "work", "refund"],
    )


def _providers() -> dict[str, stead.Provider]:
    return {"scripted/crashy": F.prompt_model(lambda r: {"label": "refund"})}


async def _open(url: str, team: Path, faults: stead.testing.Faults | None = None) -> stead.AgentSystem:
    return await stead.open(url, definitions=team, providers=_providers(), faults=faults)


async def _attempt(url: str, team: Path, faults: stead.testing.Faults) -> None:
    """One process lifetime that may die at any store operation."""

    async def act(system: stead.AgentSystem) -> None:
        try:
            agent = await system.get(AGENT_ID)
        except stead.AgentNotFound:
            agent = await system.create(definition="crashy", agent_id=AGENT_ID)
        await agent.send("refund order 1", id=MESSAGE_ID, payload=PAYLOAD)
        await agent.wait_idle(timeout=TIMEOUT)

    await run_until_crash(_open(url, team, faults), faults, act)


async def _finish(url: str, team: Path) -> tuple[stead.RunResult, Counter[str]]:
    """A healthy process: resumes what is owed and returns the run's result (sending the message if the
    crash came before it was accepted: the id makes that idempotent)."""
    async with await _open(url, team) as system:
        try:
            agent = await system.get(AGENT_ID)
        except stead.AgentNotFound:
            agent = await system.create(definition="crashy", agent_id=AGENT_ID)
        result = await agent.run("refund order 1", id=MESSAGE_ID, payload=PAYLOAD)
        await agent.wait_idle(timeout=TIMEOUT)
    return result, Counter(F.EXECUTIONS)


def _committed_calls(db: Path) -> list[str]:
    """The calls whose ledger result is durable, as `tool:argument` keys (read as a new process would)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT record FROM history WHERE agent_id=? ORDER BY seq", (AGENT_ID,)
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    calls: dict[str, str] = {}
    out: list[str] = []
    for (raw,) in rows:
        rec = json.loads(raw)
        if rec["k"] == "b" and rec["b"]["t"] == "c":
            args = rec["b"]["a"]
            name = rec["b"]["n"]
            if name in ("lookup", "refund"):
                calls[rec["b"]["i"]] = f"{name}:{args['order']}"
            elif name == "work":
                calls[rec["b"]["i"]] = f"work:{json.dumps(args['item'])}"
        elif rec["k"] == "t" and rec["b"]["i"] in calls:
            out.append(calls[rec["b"]["i"]])
    return out


async def _clean_count(base: Path) -> tuple[int, stead.RunResult]:
    team = base / "team"
    _write_crashy(team)
    url = f"sqlite:///{base / 'count.db'}?synchronous=off"
    faults = stead.testing.Faults()
    await _attempt(url, team, faults)
    assert not faults.crashed
    result, _ = await _finish(url, team)
    F.reset()
    return faults.ops, result


_clean = measured_once(_clean_count, "stead-flow-count-")
"""(the store operations of a clean run, its result), measured once per session."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per store operation of a clean run (measured at collection: every id is a real point)."""
    parametrize_crash_at(metafunc, lambda: range(_clean()[0] + 1))


def test_the_flow_exercises_the_store() -> None:
    n, result = _clean()
    assert n > 40, f"the clean run used only {n} store operations"
    assert result.ok and result.text == "refunded 30 for order 1"
    assert result.payload == {**PAYLOAD, "amount": 30, "label": "refund", "done": [1, 2, 3]}


async def test_F1_resume_at_the_first_uncommitted_step_at_every_crash_point(
    crash_at: int, tmp_path: Path
) -> None:
    _, clean = _clean()
    team = tmp_path / "team"
    _write_crashy(team)
    db = tmp_path / "crash.db"
    url = f"sqlite:///{db}?synchronous=off"
    await _attempt(url, team, stead.testing.Faults(crash_at=crash_at))
    committed = _committed_calls(db)
    before = Counter(F.EXECUTIONS)

    result, after = await _finish(url, team)

    # completed tools never run again
    for key in committed:
        assert after[key] == before[key], f"{key} ran again after its result had committed"
    # tools that must not run twice ran at most once
    assert after["lookup:1"] <= 1 and after["refund:1"] <= 1
    # every durable iteration ran to a result
    assert all(after[f"work:{i}"] >= 1 for i in (1, 2, 3)) or result.outcome is stead.Outcome.FAILED
    if result.ok:
        assert result.text == clean.text and result.payload == clean.payload
    else:
        # only a non-durable step cut off by the crash may fail the flow: it was in doubt, not re-run
        assert result.error is not None and "was interrupted" in result.error
        assert "step 'find' failed" in result.error or "step 'pay' failed" in result.error


# ---------------------------------------------------------------------------------------------- in doubt
class Committed(stead.Hooks):
    """Counts committed tool results (after their commit)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        assert ctx.tx is not None
        ctx.tx.after_commit(self._bump)

    def _bump(self) -> None:
        self.count += 1
        self.changed.set()

    async def until(self, n: int) -> None:
        while self.count < n:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), TIMEOUT)


async def test_F7_an_in_doubt_tool_step_takes_the_failure_path(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "doubt",
        """
        steps:
          - {name: risky, tool: hold, input: {name: "'risky'"}}
          - {name: done, tool: echo, input: {text: "'went on'"}}
          - {name: recover, tool: echo, input: {text: "step.error"}}
        paths:
          - {from: risky, to: done, when: "step.status == 'completed'"}
          - {from: risky, to: recover, when: "step.status == 'failed'"}
        """,
        tools=["hold", "echo"],
    )
    gate = F.GATES["risky"] = F.Gate()
    system = await stead.open(db_url, definitions=team)
    agent = await system.create(definition="doubt")
    await agent.send("go")
    await asyncio.wait_for(gate.reached.wait(), TIMEOUT)
    system.abandon()  # the process dies while the at-most-once tool runs
    await system.store.close()

    async with await stead.open(db_url, definitions=team) as system:
        agent = await system.get(agent.id)
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
        run = (await system.runs(agent_id=agent.id))[0]
    assert F.EXECUTIONS["hold:risky"] == 1  # never re-run
    assert F.EXECUTIONS["echo:went on"] == 0
    final = history[-1].text
    assert final.startswith(
        "This call was interrupted (the process stopped while it ran) and was not retried"
    )
    assert run.status == "completed"


async def test_F7_an_in_doubt_iteration_fails_a_parallel_for_each_unless_it_continues_on_error(
    db_url: str, team: Path
) -> None:
    for keep_going in (False, True):
        F.reset()
        F.write_flow(
            team,
            "charges",
            f"""
            steps:
              - name: each
                for_each:
                  items: "payload.items"
                  parallel: true
                  concurrency: 3
                  continue_on_error: {str(keep_going).lower()}
                  do: {{tool: charge, input: {{item: "item"}}, output: {{"paid[]": "step.output.charged"}}}}
            """,
            tools=["charge"],
        )
        gate = F.GATES["charge:2"] = F.Gate()
        committed = Committed()
        url = db_url.replace("stead.db", f"charges-{keep_going}.db")
        system = await stead.open(url, definitions=team, hooks=[committed])
        agent = await system.create(definition="charges")
        await agent.send("go", payload={"items": [1, 2, 3]})
        await asyncio.wait_for(gate.reached.wait(), TIMEOUT)
        await committed.until(1)  # item 1 committed; 2 holds (3 ran, its result waits for 2's: call order)
        system.abandon()
        await system.store.close()
        del F.GATES["charge:2"]

        async with await stead.open(url, definitions=team) as system:
            agent = await system.get(agent.id)
            await agent.wait_idle(timeout=TIMEOUT)
            run = (await system.runs(agent_id=agent.id))[0]
            end = [r for r in await _end_records(system, agent.id)]
        assert F.EXECUTIONS["charge:1"] == 1 and F.EXECUTIONS["charge:2"] == 1
        assert F.EXECUTIONS["charge:3"] <= 1  # ran (or not) before the crash; in doubt: never again
        if keep_going:
            assert run.status == "completed"
            assert end[-1]["p"]["paid"] == [1]  # the in-doubt iterations contribute nothing
        else:
            assert run.status == "failed" and run.error is not None and "was interrupted" in run.error


async def _end_records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    async with system.store.transaction() as tx:
        return [r for r in map(json.loads, await tx.load(agent_id)) if r["k"] == "e"]


# ---------------------------------------------------------------------------------------------- for-each
async def test_F6_parallel_for_each_is_merged_in_index_order_after_a_crash(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "fan",
        """
        steps:
          - name: each
            for_each:
              items: "payload.items"
              parallel: true
              concurrency: 4
              do: {tool: work, input: {item: "item"}, output: {"done[]": "step.output.item"}}
        result: "join(',', payload.done[*].to_string(@))"
        """,
        tools=["work"],
    )
    gates = {i: F.GATES.setdefault(f"work:{i}", F.Gate()) for i in range(4)}
    committed = Committed()
    system = await stead.open(db_url, definitions=team, hooks=[committed])
    agent = await system.create(definition="fan")
    await agent.send("go", payload={"items": [0, 1, 2, 3]})
    for i in range(4):
        await asyncio.wait_for(gates[i].reached.wait(), TIMEOUT)  # all four run at once
    gates[3].release()  # 3 finishes first, but commits only after 0, 1 and 2 (results commit in call order)
    await asyncio.wait_for(gates[3].passed.wait(), TIMEOUT)
    gates[0].release()
    await committed.until(1)
    gates[1].release()
    await committed.until(2)
    system.abandon()  # 0 and 1 committed, 2 still running, 3 finished but not committed
    await system.store.close()
    for i in range(4):
        F.GATES.pop(f"work:{i}")

    async with await stead.open(db_url, definitions=team) as system:
        agent = await system.get(agent.id)
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
        end = await _end_records(system, agent.id)
        run = (await system.runs(agent_id=agent.id))[0]
    assert F.ORDER[:3] == ["work:3", "work:0", "work:1"]  # the order they finished in, before the crash
    assert [F.EXECUTIONS[f"work:{i}"] for i in range(4)] == [1, 1, 2, 2]  # committed ones never ran again
    assert history[-1].text == "0,1,2,3"
    assert end[-1]["p"]["done"] == [0, 1, 2, 3]
    assert run.status == "completed" and run.restarts == 1


async def test_F6_parallel_iterations_see_the_payload_as_the_loop_began(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "snap",
        """
        steps:
          - name: each
            for_each:
              items: "payload.items"
              parallel: true
              concurrency: 2
              do:
                tool: count
                input: {value: "length(payload.seen || `[]`)"}
                output: {"seen[]": step.output}
        """,
        tools=["count"],
    )
    async with await stead.open(db_url, definitions=team) as system:
        agent = await system.create(definition="snap")
        result = await agent.run("go", payload={"items": [1, 2, 3, 4, 5]})
    assert result.ok, result.error
    # every iteration's input saw the payload of the loop's start ([] -> 0); merged in index order
    assert result.payload is not None and result.payload["seen"] == [1, 1, 1, 1, 1]


# ---------------------------------------------------------------------------------------------- SIGKILL
def _read(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize(("mode", "until"), [("durable", "IN_FETCH"), ("plain", "IN_PAY")])
async def test_F1_a_real_sigkill_resumes_at_the_first_uncommitted_step(
    tmp_path: Path, mode: str, until: str
) -> None:
    db = tmp_path / "flow.db"
    team = tmp_path / "team"
    W.write_team(team)
    await run_and_kill(Path(W.__file__), db, team, mode, until=until)

    W.BLOCK = False
    W.LOG = Path(str(db) + ".log")
    try:
        async with await stead.open(f"sqlite:///{db}", definitions=team) as system:
            assert W.AGENT_ID in system.restored
            agent = await system.get(W.AGENT_ID)
            result = await agent.run("refund it", id=W.MESSAGE_ID)  # the same message: its run's result
    finally:
        W.LOG = None
    log = Counter(_read(Path(str(db) + ".log")).split())
    assert log["find:9"] == 1  # completed before the kill: never again
    if mode == "durable":
        assert log["fetch:9"] == 2  # cut off, durable: ran again
        assert log["pay:9"] == 1 and log["apologize"] == 0
        assert result.ok and result.text == "paid 30 for 9"
        assert result.payload == {"order": 9, "amount": 30, "history": "order 9 shipped"}
    else:
        assert log["fetch:9"] == 1
        assert log["pay:9"] == 1  # cut off, at most once: in doubt, not re-run
        assert log["apologize"] == 1  # the failure path
        assert result.ok and result.text.startswith("sorry: This call was interrupted")
