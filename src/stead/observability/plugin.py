"""The observability layer as plugins: run records (`RecordsPlugin`) and OpenTelemetry spans
(`TracingPlugin`).

`stead.open(records=True)` (the default) adds a `RecordsPlugin`; `stead.open(tracer_provider=...)` adds a
`TracingPlugin`. Both may also be passed in `plugins=[...]` like any third-party plugin: they use only the
public seams (hooks, migrations, `system.tools`, `system.store`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from stead.extend import (
    STEP_TYPE_KEY,
    AgentScope,
    AgentSystem,
    Hooks,
    Migrations,
    Plugin,
    Run,
    Store,
    bind_step_writer,
    page_query,
)
from stead.observability.queries import get_run, list_runs, page_runs
from stead.observability.records import (
    MIGRATIONS,
    PG_MIGRATIONS,
    RECORDS_MODULE,
    RecordsWriter,
    RunRecorder,
)

__all__ = ["RecordsPlugin", "TracingPlugin"]


class RecordsPlugin(Plugin):
    """Run, step and prompt-run records written in the kernel's own transactions; reads them back for
    `system.runs()` / `system.run(id)` (it is the system's `RunReader`)."""

    name: ClassVar[str] = "records"
    migrations: ClassVar[Migrations] = {
        "sqlite": {"observability": MIGRATIONS},
        "postgresql": {"observability": PG_MIGRATIONS},
    }

    def __init__(self, recorder: RunRecorder | None = None) -> None:
        self.recorder = recorder if recorder is not None else RunRecorder()
        self._store: Store | None = None

    def hooks(self) -> list[Hooks]:
        return [self.recorder]

    async def start(self, system: AgentSystem) -> None:
        self._store = system.store
        if RECORDS_MODULE in system.store.modules:  # `stead.extend.record_step` & co. now write here
            bind_step_writer(system.store, RecordsWriter())
        if self.recorder.is_sub_agent is None:
            tools = system.tools  # the live registry: tools added later (MCP, …) are seen too

            def step_type(name: str) -> bool:
                t = tools.get(name)
                return t is not None and t.metadata.get(STEP_TYPE_KEY) == "sub_agent"

            self.recorder.is_sub_agent = step_type

    async def close(self, system: AgentSystem) -> None:
        bind_step_writer(system.store, None)

    def _require_store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the records plugin has not started")
        return self._store

    async def runs(self, agent_id: str | None = None, limit: int = 50) -> list[Run]:
        return await list_runs(self._require_store(), agent_id, limit)

    async def runs_page(
        self,
        *,
        agent_id: str | None = None,
        status: str | None = None,
        parent_run_id: str | None = None,
        roots: bool = False,
        before: tuple[float, str] | None = None,
        limit: int = 50,
        scope: AgentScope | None = None,
    ) -> list[Run]:
        where, params = page_query(
            # a deleted agent takes its runs with it
            conditions=["agent_id IN (SELECT id FROM agents)", *(["parent_run_id IS NULL"] if roots else [])],
            equal={"agent_id": agent_id, "status": status, "parent_run_id": parent_run_id},
            time_column="started_at",
            cursor=before,
            newest_first=True,
            scope=scope,
        )
        return await page_runs(self._require_store(), where, params, limit)

    async def run(self, run_id: str) -> Run:
        return await get_run(self._require_store(), run_id)


class TracingPlugin(Plugin):
    """OpenTelemetry GenAI spans (`invoke_agent`, `chat`, `execute_tool`); needs `opentelemetry-api`.

    It is also the system's trace-context source: the orchestration layer asks it for the `traceparent`
    of a delegating call so the child's spans nest under it."""

    name: ClassVar[str] = "tracing"
    migrations: ClassVar[Migrations] = {
        # the span context of each run's first incarnation, so a resumed run links to it
        dialect: {
            "tracing": [
                "CREATE TABLE stead_trace_runs "
                "(run_id TEXT PRIMARY KEY, traceparent TEXT NOT NULL, parent_traceparent TEXT)"
            ]
        }
        for dialect in ("sqlite", "postgresql")
    }

    def __init__(
        self, tracer_provider: Any = None, *, capture_content: bool = False, hooks: Any = None
    ) -> None:
        from stead.observability.tracing import TracingHooks  # opentelemetry-api is an optional dependency

        self.tracing: TracingHooks = (
            hooks if hooks is not None else TracingHooks(tracer_provider, capture_content=capture_content)
        )

    def hooks(self) -> list[Hooks]:
        return [self.tracing]

    def traceparent_for_call(self, call_id: str) -> str | None:
        return self.tracing.traceparent_for_call(call_id)
