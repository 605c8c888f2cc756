"""The volatile state of one agent in this process: the mirror of its durable state, the turn in flight,
the tool calls this process runs, its observers, and the flags of its loop.

Nothing here is durable and nothing here decides: the functions that commit (consumption, responses, tool
batches, settlement, abort) take an `AgentState`, change the store in a transaction, and change this state
only in that transaction's after-commit callbacks (the mirror's invariant, `stead.core.mirror`). The loop
that drives them is `stead.core.runtime.AgentRuntime`, a subclass.

Observers: `emit` delivers an event to every subscriber queue and to the hooks that override `on_event`;
callers ask `listening` first, so that an event nobody reads is never even built.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from stead.core.config import AgentConfig, Env
from stead.core.events import Event
from stead.core.hooks import HookContext, OfferedToolsInfo, RunContext
from stead.core.mirror import Mirror
from stead.core.records import Pending, Queued
from stead.messages import Block, ToolCall, ToolResult, Usage
from stead.store.base import Tx
from stead.tools.context import CallKV

__all__ = ["AgentState", "Turn", "inside_agent"]

RECALL = "recall_tool_result"
"""The built-in tool that expands an expired tool result (`stead.core.expire`)."""

inside_agent: ContextVar[str | None] = ContextVar("stead_inside_agent", default=None)
"""The id of the agent whose loop (or tool) the current task runs in."""


@dataclass(slots=True)
class Turn:
    """Volatile state of one inference turn (what abort and failure must settle)."""

    inference_id: str
    pending: Pending
    take: list[Queued]
    consumed: bool = False
    held: list[Block] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    streaming: bool = False
    partial: bool = False
    done_emitted: bool = False
    usage: Usage | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    reset: bool = False
    handoff: str | None = None
    started_at: float = 0.0
    first_token_at: float | None = None
    model_call: bool = True
    context: RunContext | None = None
    """The run context this turn's request carries."""
    context_new: bool = False
    """`context` was just computed: it is written with the turn's first durable write."""


class AgentState(Mirror):
    """What the kernel's commit functions read and (after commit) change for one agent."""

    def __init__(self, agent_id: str, config: AgentConfig, env: Env) -> None:
        super().__init__(config)
        self.id = agent_id
        self.env = env
        self.hooks = env.hooks
        self.turn: Turn | None = None
        self.qseq: dict[str, tuple[int, int]] = {}  # last queue key per prefix (stead.core.admission)
        self.restored = False
        self.aborting = False
        self.draining = False
        self.closed = False
        self.attempt = 0
        self.retry_since = 0.0  # time.monotonic() of the current retry streak's first failure
        self.last_error: str | None = None
        self.blocked: str | None = None
        # tool execution state of this process incarnation (see stead.core.batch)
        self.dispatched_here: set[str] = set()
        self.outcomes: dict[str, ToolResult] = {}
        self.running: dict[str, asyncio.Task[ToolResult]] = {}
        self.call_kvs: dict[str, CallKV] = {}
        self.executing: set[str] = set()  # calls whose function runs now
        self.committing: str | None = None  # the call whose result commit is under way (or failed: C7)
        self.awaiting_calls: set[str] = set()  # running calls that wait for input from outside
        self.waiting = False  # every unanswered call of the batch is held for a decision
        self.background: set[asyncio.Task[None]] = set()
        # `agent.compact()` callers waiting for the compaction this agent owes (stead.core.compaction)
        self.compaction_waiters: list[asyncio.Future[Any]] = []
        # the durable run context (`stead.core.records.RUN_CONTEXT`) of run `context_run`, as committed
        self.context_run: str | None = None
        self.context: RunContext | None = None
        self.run_schema: tuple[str, dict[str, Any] | None] | None = None
        """(run id, that run's own output schema), read once per run (`stead.core.inference`)."""
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._hook_events = env.hooks.wants("on_event")

    def wake(self) -> None:
        """Start the agent's loop if work is owed (the runtime implements it)."""
        raise NotImplementedError

    def call_awaits_input(self, call_id: str, waiting: bool) -> None:
        """A running call starts or stops waiting for outside input (the runtime implements it)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ hooks
    def hook_ctx(
        self,
        tx: Tx | None,
        pending: Pending | None = None,
        *,
        restored: bool = False,
        inference_id: str | None = None,
    ) -> HookContext:
        """The context a hook sees. Build it only when `self.hooks.wants(...)` says someone listens."""
        p = pending or self.pending
        turn = self.turn
        return HookContext(
            agent_id=self.id,
            agent_name=self.config.name,
            store=self.env.store,
            run_id=p.run_id if p else None,
            turn_id=p.turn_id if p else None,
            inference_id=inference_id or (p.inference_id if p else None),
            # P1: within a turn, the settings its consumption made effective (committed in the same tx)
            settings=dict(turn.settings if turn is not None else self.settings),
            tx=tx,
            restored=restored,
            extra=self.config.extra,
            user=p.user if p else None,
            tenant=p.tenant if p else None,
        )

    def offered_tools(self, pending: Pending | None) -> list[str]:
        """The tools this run offers to the model and allows to run (the `offered_tools` hook's view). An
        agent whose old tool results expire is offered the built-in `recall_tool_result` too."""
        tools = self.config.tools
        expiring = self.config.context.expire_tool_results_after_turns is not None
        if expiring and RECALL not in tools and RECALL in self.env.tools:
            tools = [*tools, RECALL]
        if not self.hooks.wants("offered_tools"):
            return tools
        return self.hooks.offered_tools(self.hook_ctx(None, pending), OfferedToolsInfo(list(tools)))

    # ------------------------------------------------------------------ observers
    @property
    def listening(self) -> bool:
        """Whether anyone receives events (subscribers or an `on_event` hook)."""
        return self._hook_events or bool(self._subscribers)

    def emit(self, event: Event) -> None:
        """Deliver to every observer; an observer that throws never stops the others (S2)."""
        for q in self._subscribers:
            q.put_nowait(event)
        if self._hook_events:
            self.hooks.on_event(self.id, event)

    def subscribe(self) -> asyncio.Queue[Event | None]:
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Event | None]) -> None:
        self._subscribers.discard(q)

    def close_streams(self) -> None:
        for q in list(self._subscribers):
            q.put_nowait(None)
