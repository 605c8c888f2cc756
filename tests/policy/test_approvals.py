"""Durable approvals (issue 12): requests written with the batch, waiting without a provider request,
decisions that commit with the call's result, the first decision winning, edited arguments, steering,
abort, expiry, child approvals under the root run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import stead
from stead.policy import PolicyPlugin
from stead.providers.scripted import ScriptedProvider
from tests.policy import support
from tests.policy.support import TIMEOUT, EventLog, open_system, ran, results


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


async def test_P2_a_held_call_never_runs_before_the_decision_and_runs_once_after(db_url: str) -> None:
    log = EventLog()
    async with open_system(db_url, hooks=[log]) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file", "read_file"])
        await agent.send("call delete_file read_file")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting" and agent.active
        assert ran == {"read_file": 1}  # the other call of the batch ran and committed
        (a,) = await system.approvals()
        assert (a.tool, a.status, a.arguments, a.mode) == (
            "delete_file",
            "pending",
            {"path": "a.txt"},
            "auto",
        )
        assert a.destructive and a.root_run_id == a.run_id and a.agent_id == agent.id
        assert [x.id for x in await agent.approvals()] == [a.id]
        decision = await system.approve(a.id, note="fine")
        assert decision.decided and decision.status == "approved" and decision.approval.note == "fine"
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle" and ran == {"read_file": 1, "delete_file": 1}
        history = await agent.history()
        assert results(history)["delete_file"] == ("deleted a.txt", False)
        assert history[-1].text.startswith("results: ")
        assert await system.approvals() == []
        requested, decided = log.events
        assert isinstance(requested, stead.ApprovalRequested) and requested.approval_id == a.id
        assert requested.call.name == "delete_file" and requested.reason == a.reason
        assert isinstance(decided, stead.ApprovalDecided)
        assert (decided.approval_id, decided.decision, decided.note) == (a.id, "approved", "fine")


def open_recording(db_url: str, requests: list[stead.ProviderRequest]) -> stead.system.Opening:
    """A system with approvals whose scripted model records every request it is asked."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        requests.append(request)
        return support.respond(request)

    return stead.open(
        db_url, approvals=True, providers={"scripted": ScriptedProvider(respond)}, tools=support.TOOLS
    )


async def test_the_agent_makes_no_provider_request_while_a_call_waits(db_url: str) -> None:
    requests: list[stead.ProviderRequest] = []
    async with open_recording(db_url, requests) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        await agent.send("are you there?")  # a sent message waits behind the held call
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting" and len(requests) == 1
        (a,) = await system.approvals()
        await system.approve(a.id)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle" and len(requests) == 3  # the continuation, then the queued message


async def test_P3_reject_commits_one_error_result_with_the_decision(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        decision = await system.reject(a.id, note="keep that file")
        assert decision.decided and decision.status == "rejected"
        # the result committed with the decision, before the agent's next step
        history = await agent.history()
        assert results(history) == {"delete_file": ("rejected by reviewer: keep that file", True)}
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
        assert [b for m in history for b in m.content if isinstance(b, stead.ToolResult)] == [
            stead.ToolResult(a.call_id, "rejected by reviewer: keep that file", True)
        ]
        assert ran["delete_file"] == 0 and agent.state == "idle"
        assert history[-1].text == "results: rejected by reviewer: keep that file"


async def test_P4_concurrent_decisions_first_wins(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        first, second, third = await asyncio.gather(
            system.approve(a.id, note="yes"), system.reject(a.id, note="no"), system.approve(a.id)
        )
        assert first.decided and first.status == "approved"
        for later in (second, third):
            assert not later.decided and later.status == "approved" and later.approval.note == "yes"
        await agent.wait_idle(timeout=TIMEOUT)
        assert ran["delete_file"] == 1
        again = await system.reject(a.id, note="too late")
        assert not again.decided and again.status == "approved"
        assert (await system.approval(a.id)).status == "approved"


async def test_P7_edited_arguments_are_validated_and_used(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        with pytest.raises(stead.InvalidInput, match="path"):
            await system.approve(a.id, arguments={"path": [7]})
        with pytest.raises(stead.InvalidInput, match="path"):
            await system.approve(a.id, arguments={})
        assert (await system.approval(a.id)).status == "pending"  # nothing was written
        assert agent.state == "waiting" and ran["delete_file"] == 0
        decision = await system.approve(a.id, arguments={"path": "b.txt"})
        assert decision.decided and decision.approval.edited_arguments == {"path": "b.txt"}
        await agent.wait_idle(timeout=TIMEOUT)
        output, is_error = results(await agent.history())["delete_file"]
        assert not is_error and output.endswith("\ndeleted b.txt")
        assert '{"path": "b.txt"}' in output  # the model is told the reviewer changed its arguments


async def test_P8_a_steered_message_rejects_pending_approvals(db_url: str) -> None:
    log = EventLog()
    async with open_system(db_url, hooks=[log]) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        await agent.steer("never mind, do something else")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle" and ran["delete_file"] == 0
        stored = await system.approval(a.id)
        assert stored.status == "rejected" and stored.decided_by == "stead"
        history = await agent.history()
        output, is_error = results(history)["delete_file"]
        assert is_error and "new message" in output
        # rejected in the steered message's consumption: the result, then that message, then the answer
        assert [m.role for m in history][-3:] == ["tool", "user", "assistant"]
        assert history[-1].text == "answer to never mind, do something else"
        assert [e.type for e in log.events] == ["approval_requested", "approval_decided"]
        late = await system.approve(a.id)
        assert not late.decided and late.status == "rejected"


async def test_P8_a_decision_committed_just_before_the_steered_rejection_wins(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T2 under a race (chaos seed 7114): the agent saw every call held and a steered message queued, but
    an approval committed before its rejecting transaction began. The approved call must run and answer
    its call before the steered message; it must not stay held while the model is asked without it."""
    import stead.core.runtime as runtime

    original = runtime.reject_for_steer
    approved: list[str] = []

    async def approve_first(st: object, pending: object, take: object) -> bool:
        if not approved:
            (a,) = await system.approvals()
            approved.append(a.id)
            assert (await system.approve(a.id)).decided
        return await original(st, pending, take)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime, "reject_for_steer", approve_first)
    requests: list[stead.ProviderRequest] = []
    async with open_recording(db_url, requests) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        await agent.steer("never mind, do something else")
        await agent.wait_idle(timeout=TIMEOUT)
        assert approved and agent.state == "idle" and ran["delete_file"] == 1
        assert (await system.approval(approved[0])).status == "approved"
        assert results(await agent.history())["delete_file"] == ("deleted a.txt", False)
        for request in requests[1:]:  # every later request answers the call right after it
            roles = [m.role for m in request.messages]
            assert roles[roles.index("assistant") + 1] == "tool", roles


async def test_abort_cancels_pending_approvals(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        await agent.abort()
        assert agent.state == "idle" and not agent.active
        assert (await system.approval(a.id)).status == "cancelled"
        output, is_error = results(await agent.history())["delete_file"]
        assert is_error and "never ran" in output
        assert not (await system.approve(a.id)).decided
        assert ran["delete_file"] == 0


async def test_P9_an_approval_nobody_decides_in_time_expires(db_url: str) -> None:
    now = [1000.0]
    policy = PolicyPlugin(expire_after=60, check_every=3600, clock=lambda: now[0])
    async with open_system(db_url, plugins=[policy]) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("call delete_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        assert a.expires_at == 1060.0
        assert await policy.expire() == []  # not due yet
        now[0] = 1060.0
        assert await policy.expire() == [a.id]
        await agent.wait_idle(timeout=TIMEOUT)
        stored = await system.approval(a.id)
        assert stored.status == "expired" and stored.decided_at == 1060.0
        output, is_error = results(await agent.history())["delete_file"]
        assert is_error and output.startswith("approval expired")
        assert ran["delete_file"] == 0 and agent.state == "idle"
        assert await policy.expire() == []


async def test_agent_run_returns_awaiting_input_then_the_result(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        first = await agent.run("call delete_file", id="deletemsg")
        assert first.outcome is stead.Outcome.AWAITING_INPUT and not first.ok
        (a,) = await system.approvals()
        assert first.run_id == a.run_id
        await system.approve(a.id)
        second = await agent.run("call delete_file", id="deletemsg")  # same id: the same run, finished
        assert second.outcome is stead.Outcome.COMPLETED and second.run_id == a.run_id
        assert second.text == "results: deleted a.txt"


async def test_P10_child_approval_listed_under_the_root_run(tmp_path: Path, db_url: str) -> None:
    """The orchestrator delegates to a worker whose destructive call needs approval: the worker's
    approval carries the orchestrator's run as its root, the orchestrator counts as waiting, and the
    approval lets the whole tree finish."""
    from tests.orchestration.support import models, write_team

    def orchestrator(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].role == "tool":
            return [stead.Text("worker said: " + request.messages[-1].content[0].output)]  # type: ignore[union-attr]
        return [stead.ToolCall("worker", {"request": "call delete_file"})]

    team = write_team(
        tmp_path / "team",
        {
            "orchestrator": {"sub_agents": ["worker"]},
            "worker": {"tools": ["tests.policy.support:delete_file"]},
        },
    )
    async with stead.open(
        db_url, definitions=team, providers=models(orchestrator=orchestrator, worker=support.respond)
    ) as system:
        assert system.has_plugin("policy")  # definitions enforce the policy by default
        root = await system.create(definition="orchestrator")
        await root.send("clean up")
        await root.wait_idle(timeout=TIMEOUT)
        assert root.state == "waiting"  # nothing left to do but wait for the worker's approval
        (a,) = await system.approvals()
        assert a.agent_id != root.id and a.tool == "delete_file"
        root_run = (await system.runs(agent_id=root.id))[0].id
        assert a.root_run_id == root_run and a.run_id != root_run
        assert [x.id for x in await system.approvals(root_run_id=root_run)] == [a.id]
        await system.approve(a.id)
        await root.wait_idle(timeout=TIMEOUT)
        assert root.state == "idle" and ran["delete_file"] == 1
        assert (await root.history())[-1].text == "worker said: results: deleted a.txt"


async def test_records_show_the_waiting_step(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file", "read_file"])
        await agent.send("call delete_file read_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        run = await system.run(a.run_id)
        assert run.status == "awaiting_input"
        steps = {s.target: s.status for s in run.steps if s.type == "tool"}
        assert steps == {"delete_file": "awaiting_input", "read_file": "completed"}
        await system.approve(a.id)
        await agent.wait_idle(timeout=TIMEOUT)
        run = await system.run(a.run_id)
        assert run.status == "completed"
        assert {s.target: s.status for s in run.steps if s.type == "tool"} == {
            "delete_file": "completed",
            "read_file": "completed",
        }


async def test_a_call_with_invalid_arguments_gets_its_error_without_asking_anyone(db_url: str) -> None:
    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].role == "tool":
            return [stead.Text("ok")]
        return [stead.ToolCall("delete_file", {"path": ["not", "a", "string"]})]

    async with stead.open(
        db_url, approvals=True, providers={"scripted": ScriptedProvider(respond)}, tools=support.TOOLS
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["delete_file"])
        await agent.send("delete")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle" and await system.approvals(status=None) == []
        output, is_error = results(await agent.history())["delete_file"]
        assert is_error and "do not match the schema" in output
