"""A typed outcome (issue 8 item 4): how a run ended travels as `stead.Outcome` — on the `Settled` event, on
the settle hooks (`ctx.outcome`), in the history's end-of-run record, and into the run records and spans —
instead of a sentinel error string that each layer decodes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import stead
from stead.core.outcome import Outcome
from stead.extend import SettledInfo
from stead.providers.scripted import ScriptedProvider, ScriptedResponse

TIMEOUT = 5.0


class SeeSettle(stead.Hooks):
    def __init__(self) -> None:
        self.tx: list[tuple[Outcome | None, str | None]] = []
        self.after: list[tuple[Outcome | None, str | None]] = []
        self.done = asyncio.Event()

    async def settled_tx(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        assert ctx.tx is not None
        self.tx.append((ctx.outcome, info.error))

    async def settled(self, ctx: stead.HookContext, info: SettledInfo) -> None:
        self.after.append((ctx.outcome, info.error))
        self.done.set()


def responder(request: stead.ProviderRequest) -> Any:
    text = request.messages[-1].text
    if text == "fail":
        return ScriptedResponse(blocks=[], error="boom", retryable=False)
    if text == "hang":
        return asyncio.Event().wait()
    return [stead.Text("fine")]


def test_outcome_is_a_str_enum() -> None:
    assert isinstance(Outcome.COMPLETED, str)
    assert [o.value for o in Outcome] == ["completed", "failed", "cancelled", "awaiting_input"]
    assert Outcome("cancelled") is Outcome.CANCELLED
    assert stead.Outcome is Outcome


async def test_outcome_on_settled_events_hooks_records_and_the_end_record(db_url: str) -> None:
    hooks = SeeSettle()
    async with await stead.open(db_url, providers={"p": ScriptedProvider(responder)}, hooks=hooks) as system:
        agent = await system.create(provider="p")
        events = agent._rt.subscribe()  # read below, without a consumer task
        for text in ("ok", "fail"):
            hooks.done.clear()
            await agent.send(text)
            await agent.wait_idle(TIMEOUT)
            await asyncio.wait_for(hooks.done.wait(), TIMEOUT)
        hooks.done.clear()
        await agent.send("hang")
        await agent.abort()
        await asyncio.wait_for(hooks.done.wait(), TIMEOUT)
        settled: list[stead.Settled] = []
        while not events.empty():
            ev = events.get_nowait()
            if isinstance(ev, stead.Settled):
                settled.append(ev)

        expected = [(Outcome.COMPLETED, None), (Outcome.FAILED, "boom"), (Outcome.CANCELLED, "aborted")]
        assert [(e.outcome, e.error) for e in settled] == expected
        assert hooks.tx == expected
        assert hooks.after == expected
        runs = await system.runs(agent.id)
        assert sorted(r.status for r in runs) == sorted(o.value for o, _ in expected)
        async with system.store.transaction() as tx:
            ends = [json.loads(r) for r in await tx.load(agent.id)]
        ends = [r for r in ends if r["k"] == "e"]
        assert [(r["o"], r.get("x")) for r in ends] == [(o.value, e) for o, e in expected]
        assert [r["run"] for r in ends] == [e.run_id for e in settled]
