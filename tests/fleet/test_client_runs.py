"""W7 (docs/promises.md): `agent.run()` returns the result of its own run however many run at once — on
PostgreSQL from a client (`run_agents=False`) that polls the store while a worker consumes and answers the
messages; on SQLite in the process that runs the agents. The deterministic case (a consumption committed
exactly between the client's two reads) is `tests/fleet/test_fleet.py::test_W7_…`."""

from __future__ import annotations

import asyncio
import contextlib

import stead
from stead.messages import text_of
from stead.providers.scripted import ScriptedProvider

AGENTS = 3
CALLS = 60


def answer(request: stead.ProviderRequest) -> list[stead.Block]:
    last = next(m for m in reversed(request.messages) if m.role == "user")
    return [stead.Text(f"answer to {text_of(last.content)}")]


async def test_W7_many_concurrent_runs_from_a_client_each_return_their_own_result(
    db_url: str, store_kind: str
) -> None:
    providers: dict[str, stead.Provider] = {"scripted": ScriptedProvider(answer)}
    async with contextlib.AsyncExitStack() as stack:
        worker = await stack.enter_async_context(stead.open(db_url, providers=providers, records=False))
        client = worker
        if store_kind == "postgresql":
            client = await stack.enter_async_context(
                stead.open(db_url, providers=providers, records=False, run_agents=False)
            )
        agents = [await client.create(provider="scripted", agent_id=f"w7-many-{i}") for i in range(AGENTS)]
        results = await asyncio.wait_for(
            asyncio.gather(*(agents[n % AGENTS].run(f"question {n}", id=f"w7-q{n}") for n in range(CALLS))),
            120,
        )
        for n, result in enumerate(results):
            # the run that consumed the message (a run may consume several queued messages in turn)
            assert result.outcome is stead.Outcome.COMPLETED, result.error
            assert result.message_id == f"w7-q{n}"
            texts = [(m.role, text_of(m.content)) for m in result.messages]
            asked = texts.index(("user", f"question {n}"))
            assert texts[asked + 1] == ("assistant", f"answer to question {n}")
