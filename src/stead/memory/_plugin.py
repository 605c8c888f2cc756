"""The memory layer as a plugin (`stead.open(url, memory=True)`; name `memory`).

It contributes:
- its tables (`stead.memory._migrations`, SQLite and PostgreSQL);
- the `remember` tool, offered (by the `offered_tools` hook) only to agents whose settings allow writes;
- a `run_context` hook: before a run's first inference — outside any transaction — the run's notes,
  examples and pre-execution passages, chosen for the user and agent of the run's first message, rendered
  as one quoted system message after the instructions; the kernel makes it durable, so a restarted process
  sends the same context (R4);
- a `response_tx` hook recording the injected note and example ids on each prompt step of the run;
- a `tool_result_tx` hook marking the run tainted at the first result of an `external` tool;
- a validator for the `stead.scope` metadata a message may carry (primary and secondary scope dimensions);
- `system.memory` (`stead.memory.Memory`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from stead.extend import (
    AgentSystem,
    HookContext,
    Hooks,
    IncomingMessage,
    InvalidInput,
    Migrations,
    OfferedToolsInfo,
    Plugin,
    ResponseInfo,
    Tool,
    ToolResultInfo,
    dumps,
    update_step,
)
from stead.memory._api import Memory
from stead.memory._config import AgentMemory, MemoryConfig, Retrieved
from stead.memory._core import MemoryCore
from stead.memory._migrations import MIGRATIONS
from stead.memory._model import Example, Note, Scope
from stead.memory._render import render_memory, render_retrieved
from stead.memory._retrieval import Retriever, rrf
from stead.memory._write import KV_TAINT, Writer, effects_of, remember_tool

__all__ = ["SCOPE_KEY", "MemoryPlugin"]

log = logging.getLogger("stead.memory")

SCOPE_KEY = "stead.scope"
"""Message metadata key: `{"primary": "account:42", "secondary": {"region": "eu"}}` — the primary and
secondary scope dimensions a run's first message gives its memory."""

CONTEXT_KEY = "memory"


class MemoryPlugin(Plugin, Hooks):
    """Notes and examples, scoped retrieval, injection before runs, guarded agent writes."""

    name: ClassVar[str] = "memory"
    migrations: ClassVar[Migrations] = MIGRATIONS  # type: ignore[assignment]  # per dialect (a Plugin's)

    def __init__(self, config: MemoryConfig | None = None) -> None:
        self.config = config or MemoryConfig()
        self.core = MemoryCore(self.config)
        self.writer = Writer(self.core)
        self._remember = remember_tool(self.writer)
        self._memory = Memory(self.core)

    # ------------------------------------------------------------------ wiring
    def tools(self) -> list[Tool]:
        return [self._remember]

    async def start(self, system: AgentSystem) -> None:
        self.core.bind(system)
        if not system.readonly:
            await self._memory.expire()

    @property
    def memory(self) -> Memory:
        """`system.memory`."""
        return self._memory

    @property
    def retriever(self) -> Retriever:
        return self.core.retriever

    def settings_for(self, extra: Mapping[str, Any]) -> AgentMemory | None:
        return self.core.settings_for(extra)

    # ------------------------------------------------------------------ validation
    def validate_message(self, message: IncomingMessage) -> None:
        raw = (message.metadata or {}).get(SCOPE_KEY)
        if raw is None:
            return
        scope_of(raw)  # raises InvalidInput when malformed

    # ------------------------------------------------------------------ hooks
    def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
        tools = info.tools
        if "remember" in tools:
            return tools
        settings = self.settings_for(ctx.extra)
        if settings is not None and settings.write:
            return [*tools, "remember"]
        return tools

    async def run_context(self, ctx: HookContext) -> Any:
        from stead.extend import RunContext

        settings = self.settings_for(ctx.extra)
        if settings is None or (settings.notes == 0 and settings.examples == 0 and not settings.sources):
            return None
        message = ctx.message
        query = message.text if message is not None else ""
        primary, secondary = None, None
        if message is not None and message.metadata and SCOPE_KEY in message.metadata:
            primary, secondary = scope_of(message.metadata[SCOPE_KEY])
        scope = Scope(
            tenant=ctx.tenant,
            agent=ctx.agent_id,
            user=ctx.user,
            primary=primary,
            secondary=secondary,
            mode=self.config.scope_mode,
        )
        retriever = self.retriever
        notes: list[Note] = []
        examples: list[Example] = []
        try:
            if settings.notes:
                notes = await retriever.notes(scope, query, limit=settings.notes, strategy=settings.strategy)
            if settings.examples:
                examples = await retriever.examples(
                    scope, query, limit=settings.examples, strategy=settings.strategy
                )
        except Exception:
            log.exception(
                "stead memory: notes for agent %s could not be retrieved (run goes on)", ctx.agent_id
            )
        passages = await self._rag(settings, query, ctx) if settings.sources and query.strip() else []
        text = "\n\n".join(b for b in (render_memory(notes, examples), render_retrieved(passages)) if b)
        data = {
            CONTEXT_KEY: {
                "notes": [n.id for n in notes],
                "examples": [e.id for e in examples],
                "retrieved": len(passages),
                "user": ctx.user,
                "tenant": ctx.tenant,
            }
        }
        return RunContext(text, data)

    async def _rag(self, settings: AgentMemory, query: str, ctx: HookContext) -> list[tuple[str, Retrieved]]:
        """Pre-execution RAG: every named source searched with the user's message, fused (RRF) and
        deduplicated; a failing source is skipped."""
        found: list[list[tuple[str, Retrieved]]] = []
        limit = self.config.rag_limit
        for name in settings.sources:
            source = self.config.sources.get(name)
            if source is None:
                log.warning("stead memory: agent %s names an unknown retrieval source %r", ctx.agent_id, name)
                continue
            try:
                hits = await source.search(
                    query, limit=limit, agent=ctx.agent_id, user=ctx.user, tenant=ctx.tenant
                )
            except Exception as e:
                log.warning(
                    "stead memory: retrieval source %r failed (%s: %s); skipped", name, type(e).__name__, e
                )
                continue
            found.append([(name, h) for h in hits])
        flat: list[tuple[str, Retrieved]] = []
        keys: dict[str, int] = {}
        lists: list[list[int]] = []
        for source_hits in found:
            ranked: list[int] = []
            for name, hit in source_hits:
                key = " ".join(hit.text.split()).lower()
                if key not in keys:
                    keys[key] = len(flat)
                    flat.append((name, hit))
                ranked.append(keys[key])
            lists.append(ranked)
        return [flat[i] for i, _ in rrf(lists)[:limit]]

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        if ctx.tx is not None:
            await self.core.rows.delete_agent(ctx.tx, ctx.agent_id)

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        context = info.context
        tx = ctx.tx
        if context is None or tx is None or ctx.run_id is None or CONTEXT_KEY not in context.data:
            return
        # the prompt step records what memory injected (through the run-record seam; none with records off)
        await update_step(tx, ctx.run_id, info.inference_id, input={"memory": context.data[CONTEXT_KEY]})

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        tx, call = ctx.tx, info.call
        if tx is None or call.name == self._remember.name:
            return
        if self.settings_for(ctx.extra) is None:
            return
        if effects_of(self.core.system.tools.get(call.name)) == "external":
            await tx.write_if_absent(ctx.agent_id, KV_TAINT, dumps({"tool": call.name, "call": call.id}))


def scope_of(raw: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(primary, secondary) from a message's `stead.scope` metadata; `InvalidInput` when malformed."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"metadata[{SCOPE_KEY!r}] must be an object with 'primary' and/or 'secondary'")
    unknown = set(raw) - {"primary", "secondary"}
    if unknown:
        raise InvalidInput(f"metadata[{SCOPE_KEY!r}] has unknown keys {sorted(unknown)}")
    primary = raw.get("primary")
    if primary is not None and not isinstance(primary, str):
        raise InvalidInput(f"metadata[{SCOPE_KEY!r}]['primary'] must be a string")
    secondary = raw.get("secondary")
    if secondary is not None:
        if not isinstance(secondary, Mapping) or not all(
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
            for v in secondary.values()
        ):
            raise InvalidInput(
                f"metadata[{SCOPE_KEY!r}]['secondary'] must map dimensions to a string or a list of strings"
            )
        secondary = json.loads(json.dumps(secondary))
    return primary, secondary
