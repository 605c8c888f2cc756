"""The listings other plugins read through (issue 22): `ApprovalSource.approvals_page` and
`RunReader.runs_page` — paged by cursor, filtered by an `AgentScope` the caller writes (the HTTP service's
tenant), agents that were deleted taking their rows with them. On both stores."""

from __future__ import annotations

import stead
from stead.extend import AgentScope, ApprovalSource, RunReader
from tests.policy import support
from tests.policy.support import TIMEOUT


def _source(system: stead.AgentSystem) -> ApprovalSource:
    return next(p for p in system.plugins if isinstance(p, ApprovalSource))


def _reader(system: stead.AgentSystem) -> RunReader:
    return next(p for p in system.plugins if isinstance(p, RunReader))


def _only(*agent_ids: str) -> AgentScope:
    marks = ", ".join("?" for _ in agent_ids)
    return AgentScope(f"SELECT id FROM agents WHERE id IN ({marks})", agent_ids)


async def test_approval_and_run_pages_keep_to_the_scope_and_walk_by_cursor(db_url: str) -> None:
    async with support.open_system(db_url) as system:
        agents = [
            await system.create(provider="scripted", model="m", tools=["delete_file"]) for _ in range(4)
        ]
        for agent in agents:
            await agent.send("call delete_file")
            await agent.wait_idle(timeout=TIMEOUT)
            assert agent.state == "waiting"
        a, b, c, d = (agent.id for agent in agents)
        source, reader = _source(system), _reader(system)

        everything = await source.approvals_page(limit=10)
        assert [x.agent_id for x in everything] == [a, b, c, d]  # oldest first
        assert await source.approvals_page(status="decided") == []
        scoped = await source.approvals_page(status="pending", scope=_only(a, c, d), limit=10)
        assert [x.agent_id for x in scoped] == [a, c, d]

        # a page of one at a time, by the cursor of the last one seen, walks the same list once
        walked: list[str] = []
        cursor: tuple[float, str] | None = None
        while page := await source.approvals_page(scope=_only(a, c, d), after=cursor, limit=1):
            walked.append(page[0].agent_id)
            cursor = (page[0].created_at, page[0].id)
        assert walked == [a, c, d]

        await system.approve(scoped[0].id)
        await agents[0].wait_idle(timeout=TIMEOUT)
        assert [x.agent_id for x in await source.approvals_page(status="decided")] == [a]
        assert [x.agent_id for x in await source.approvals_page(status="pending", scope=_only(a, c))] == [c]

        runs = await reader.runs_page(scope=_only(b, d), limit=10)
        assert [r.agent_id for r in runs] == [d, b]  # newest first
        assert all(r.status == "awaiting_input" for r in runs)  # waiting on their approvals
        (first,) = await reader.runs_page(scope=_only(b, d), limit=1)
        (second,) = await reader.runs_page(scope=_only(b, d), before=(first.started_at, first.id), limit=1)
        assert (first.agent_id, second.agent_id) == (d, b)
        assert await reader.runs_page(scope=_only(b, d), before=(second.started_at, second.id)) == []
        assert [r.agent_id for r in await reader.runs_page(status="completed")] == [a]
        assert len(await reader.runs_page(roots=True, limit=10)) == 4

        await system.delete(d)  # a deleted agent takes its approvals and runs with it
        assert [x.agent_id for x in await source.approvals_page(limit=10)] == [a, b, c]
        assert [r.agent_id for r in await reader.runs_page(scope=_only(b, d))] == [b]
