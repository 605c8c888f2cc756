"""C4 (docs/promises.md): the store, not memory, decides what the next provider request holds — also when
a tool result was committed by another writer while this process ran the call (on PostgreSQL: a worker
whose loop outlived its lease, or the worker that took the agent over)."""

from __future__ import annotations

import asyncio
import json

import stead
from stead._ids import new_id
from stead.core import records as R
from stead.core.records import Pending, build_messages
from stead.messages import dumps
from stead.providers.scripted import ScriptedProvider

ELSEWHERE = "answered elsewhere"


def respond(request: stead.ProviderRequest) -> list[stead.Block]:
    """One call for the user's message, then an answer quoting the last tool result the request carries."""
    if not any(b for m in request.messages if m.role == "assistant" for b in m.content):
        return [stead.ToolCall("work", {})]
    results = [b for m in request.messages for b in m.content if isinstance(b, stead.ToolResult)]
    return [stead.Text(f"result: {results[-1].output if results else '(none)'}")]


async def test_C4_a_result_commit_that_finds_its_call_answered_reloads_the_history(db_url: str) -> None:
    """While the call runs, another transaction answers it (deletes its entry, appends a result, moves
    the pending record on): this process's own result commit finds it answered and writes nothing, and the
    next provider request carries exactly the committed result, read from the store."""
    provider = ScriptedProvider(respond)

    @stead.tool(durable=True)
    async def work(ctx: stead.ToolContext) -> str:
        """Work that someone else answers meanwhile."""
        async with ctx.store.transaction() as tx:
            pending = Pending.decode(await tx.get(ctx.agent_id, R.PENDING))
            assert pending is not None
            ((key, _),) = await tx.read_prefix(ctx.agent_id, R.TOOL)
            assert await tx.delete(ctx.agent_id, key)
            result = R.result_record(stead.ToolResult(ctx.call_id, ELSEWHERE))
            await tx.append(ctx.agent_id, [dumps(result)])
            inf = new_id()
            await tx.write(
                ctx.agent_id,
                R.PENDING,
                pending.but(stage="inference", turn_id=inf, inference_id=inf).encode(),
            )
        return "answered here"

    async with stead.open(db_url, providers={"scripted": provider}, tools=[work], records=False) as system:
        agent = await system.create(provider="scripted", tools=["work"], agent_id="c4-reload")
        result = await asyncio.wait_for(agent.run("go", id="c4-m1"), 20)
        assert result.text == f"result: {ELSEWHERE}"
        assert len(provider.requests) == 2
        sent = [
            b for m in provider.requests[1].messages for b in m.content if isinstance(b, stead.ToolResult)
        ]
        assert [r.output for r in sent] == [ELSEWHERE]
        async with system.store.transaction() as tx:
            stored = [json.loads(r) for r in await tx.load("c4-reload")]
        assert [r["b"]["o"] for r in stored if r.get("k") == "t"] == [ELSEWHERE]
        rt = system._runtimes["c4-reload"]
        assert rt.records == stored and rt.messages() == build_messages(stored)
