"""The kernel seam behind approvals, used without the policy plugin: a `gate_call_tx` hook holds or refuses
calls at dispatch (`stead.extend.Gate`), and `Agent.release_call` / `Agent.refuse_call` decide them — the
same seam a third-party approvals layer would build on."""

from __future__ import annotations

import stead
from stead.extend import CallDecidedInfo, Gate, GateCallInfo, HookContext
from stead.providers.scripted import ScriptedProvider
from tests.policy.support import TIMEOUT, TOOLS, ran, respond, results


class HoldWrites(stead.Hooks):
    """Holds `write_file`, refuses `fetch`, lets everything else run; remembers what it held."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.decided: list[tuple[str, str]] = []

    async def gate_call_tx(self, ctx: HookContext, info: GateCallInfo) -> Gate | None:
        if info.call.name == "write_file":
            self.held.append(info.call.id or "")
            return Gate.ask("writes need a look", ref=f"req-{len(self.held)}")
        if info.call.name == "fetch":
            return Gate.deny("refused: no network here")
        return None

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        self.decided.append((info.call.name, info.decision))


def _open(url: str, hooks: HoldWrites) -> stead.system.Opening:
    return stead.open(url, providers={"scripted": ScriptedProvider(respond)}, tools=TOOLS, hooks=[hooks])


async def test_a_held_call_is_released_with_edited_arguments_and_survives_a_restart(db_url: str) -> None:
    ran.clear()
    hooks = HoldWrites()
    async with _open(db_url, hooks) as system:
        agent = await system.create(
            provider="scripted", model="m", tools=["write_file", "fetch", "read_file"]
        )
        await agent.send("call write_file fetch read_file")
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting" and ran == {"read_file": 1}
        assert results(await agent.history())["fetch"] == ("refused: no network here", True)
    (held,) = hooks.held
    again = HoldWrites()
    async with _open(db_url, again) as system:  # a restart: still held, not in doubt
        agent = await system.get(agent.id)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "waiting"
        assert not await agent.refuse_call("no-such-call", "x")
        assert await agent.release_call(held, arguments={"path": "b.txt"}, result_note="(edited)")
        assert not await agent.release_call(held)  # decided: no longer held
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle" and ran["write_file"] == 1
        assert results(await agent.history())["write_file"] == ("(edited)\nwrote b.txt", False)
    assert again.decided == [("write_file", "approved")]


async def test_a_refused_held_call_gets_one_error_result_and_the_agent_continues(db_url: str) -> None:
    ran.clear()
    hooks = HoldWrites()
    async with _open(db_url, hooks) as system:
        agent = await system.create(provider="scripted", model="m", tools=["write_file"])
        await agent.send("call write_file")
        await agent.wait_idle(timeout=TIMEOUT)
        (held,) = hooks.held
        assert await agent.refuse_call(held, "not now", decision="rejected", note="later")
        assert not await agent.refuse_call(held, "twice")
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
        assert [b for m in history for b in m.content if isinstance(b, stead.ToolResult)] == [
            stead.ToolResult(held, "not now", True)
        ]
        assert history[-1].text == "results: not now" and ran["write_file"] == 0
    assert hooks.decided == [("write_file", "rejected")]
