"""Hooks: the seams through which higher layers (and users) extend the kernel.

Transactional hooks (`*_tx`) run inside the transaction whose change they describe; raising rolls that
transaction back (a failing `activated_tx` refuses the message, A4). Observing hooks run after commit and
can never fail a run: their exceptions are logged and swallowed. Subclass `Hooks` and override what you need;
several hook objects compose in order.

A hook nobody overrides costs nothing: `HookSet` indexes, once, which hook objects override which method,
dispatches only to those, and the kernel asks `hooks.wants(name)` before it builds a `HookContext` (or an
event) for a seam nobody listens to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stead.core.events import Event
from stead.core.gate import Gate
from stead.core.outcome import Outcome
from stead.messages import Message, ToolCall, ToolResult, Usage
from stead.store.base import Store, Tx
from stead.tools._tool import Tool

__all__ = ["CompactionInfo", "HookContext", "Hooks", "ResponseInfo", "RunContext"]

log = logging.getLogger("stead.hooks")


@dataclass
class HookContext:
    """What a hook sees: the agent, the current lifecycle ids, effective settings, and (for `*_tx` hooks)
    the open transaction."""

    agent_id: str
    agent_name: str | None
    store: Store
    run_id: str | None = None
    turn_id: str | None = None
    inference_id: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    tx: Tx | None = None
    restored: bool = False
    message: Message | None = None
    """In `activated_tx` on acceptance: the message whose acceptance activated the agent."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The agent's configuration extras (what higher layers stored at creation; read-only)."""
    outcome: Outcome | None = None
    """In `settled_tx` and `settled`: how the run ended."""
    user: str | None = None
    """The user of the run's first message (`agent.send(..., user=...)`), for the whole run."""
    tenant: str | None = None
    """The tenant of the run's first message, for the whole run."""

    @property
    def permission_mode(self) -> str:
        return str(self.settings.get("permission_mode", "auto"))


@dataclass(frozen=True)
class RunContext:
    """Context a plugin adds to every request of one run (the `run_context` hook's answer).

    The kernel sends `text` as one system message right after the instructions, ahead of the history, in
    every inference of the run. It asks the hooks once per run, before the run's first inference and
    outside any transaction (a hook may search, embed, call out), and makes the answer durable in run KV
    with the turn's first durable write — so the live process and a restarted one send exactly the same
    context (R4), and later inferences of the run never ask again. `data` is durable with it (ids of what
    was injected, for records); the prompt step's hooks see both in `ResponseInfo.context`."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        return {"x": self.text, "d": self.data}

    @staticmethod
    def decode(raw: dict[str, Any]) -> RunContext:
        data = raw.get("d")
        return RunContext(str(raw.get("x", "")), dict(data) if isinstance(data, dict) else {})


@dataclass(frozen=True)
class ResponseInfo:
    """One finished inference, as told to `response_tx`."""

    inference_id: str
    provider: str
    model: str
    reason: str
    usage: Usage | None
    started_at: float
    first_token_at: float | None
    ended_at: float
    error: str | None = None
    purpose: str = "turn"
    """`turn` (the agent's own inference) or `compaction` (a summary request of a compaction, K1)."""

    model_call: bool = True
    """False when the provider answered without calling a model (`Done(model_call=False)`: a flow engine
    choosing its next step); run records and guardrails skip such responses."""

    context: RunContext | None = None
    """The run context the request carried (the `run_context` hooks' answer), if any."""


@dataclass(frozen=True)
class CompactionInfo:
    """One compaction (K1), as `before_compaction` / `compaction_tx` hooks and `agent.compact()` see it.

    `evicted` are the messages that leave the provider context (replaced by the summary); `kept` what the
    new history holds after the summary (shortened copies included). Tokens are estimates of the provider
    context before and after (`stead.core.tokens`). `passes` lists what was done, cheapest first: `stub`
    (old tool results cut to their first characters), `clamp` (records larger than a quarter of the window
    cut), `summary` (a model-written summary of the previous summary plus the evicted records, by the
    requests `summary_inference_ids`). `error` is set when the compaction failed (the history unchanged)."""

    id: str
    reason: str
    """`auto` (the next request would exceed window − reserve), `requested` (`agent.compact()`) or
    `overflow` (the provider said the context is too long)."""
    tokens_before: int
    tokens_after: int
    records_before: int
    records_after: int
    passes: tuple[str, ...] = ()
    evicted: tuple[Message, ...] = ()
    kept: tuple[Message, ...] = ()
    previous_summary: str | None = None
    summary: str | None = None
    summary_inference_ids: tuple[str, ...] = ()
    started_at: float = 0.0
    ended_at: float = 0.0
    error: str | None = None


class Hooks:
    """Override any of these. Every method is optional.

    `migrations` lets a layer that keeps its own tables declare them: module name → ordered SQL scripts,
    applied by `stead.open` before anything runs (see `stead.store.sqlite`)."""

    migrations: ClassVar[dict[str, list[str]]] = {}

    # -- transactional -----------------------------------------------------------------------------
    async def activated_tx(self, ctx: HookContext) -> None:
        """Work became owed (the pending record was created), or — with `ctx.restored` — the first stage
        after a restart of an active period."""

    async def message_consumed_tx(self, ctx: HookContext, message: Message) -> None:
        """A queued message entered history (once per message, in order)."""

    async def permission_mode_changed_tx(self, ctx: HookContext, old: str, new: str) -> None:
        """A consumed message changed the permission mode."""

    async def block_tx(self, ctx: HookContext, block: Any) -> None:
        """A completed assistant block is being appended."""

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        """An inference finished (any reason); runs in the transaction recording its end."""

    async def tool_dispatched_tx(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        """A batch of calls was made durable (before any of them runs)."""

    async def tool_result_tx(self, ctx: HookContext, call: ToolCall, result: ToolResult) -> None:
        """A call's one result is being committed."""

    async def gate_call_tx(self, ctx: HookContext, call: ToolCall, tool: Tool | None) -> Gate | None:
        """A decision inside the transaction that dispatches the batch (T1), once per call, before its entry
        is written: `Gate.ask(reason, ref)` holds the call for a decision, `Gate.deny(text)` refuses it,
        None lets it run. `tool` is None for a call the run does not offer (it gets its T6 error result
        anyway). `ctx.settings` are those the consuming turn made effective (the permission mode, C3). The
        first non-None answer wins; a hook may write its own rows through `ctx.tx` (approval requests)."""
        return None

    async def awaiting_input_tx(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        """In the dispatch transaction, after `tool_dispatched_tx`: these calls of the batch are held for a
        decision, so the run will wait (its status becomes `awaiting_input`)."""

    async def call_decided_tx(
        self, ctx: HookContext, call: ToolCall, decision: str, note: str | None
    ) -> None:
        """A held call was decided, inside the deciding transaction: `approved` (it will run), or
        `rejected` / `expired` / `cancelled` (its error result commits in this transaction). Called for
        decisions the kernel makes too: a steered message rejects held calls, an abort cancels them."""

    async def settled_tx(self, ctx: HookContext, error: str | None) -> None:
        """The active period ends: the pending record is being deleted. `ctx.outcome` says how the run
        ended; `error` is its failure (or "aborted") when it did not complete."""

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        """`system.delete` is removing the agent (its row, keys and history) in `ctx.tx`: a layer that keeps
        rows about the agent deletes them here, so they go exactly when the agent does."""

    async def before_compaction(self, ctx: HookContext, compaction: CompactionInfo) -> None:
        """Transactional: a compaction is about to replace the history (K1). Runs inside the replacement
        transaction (`ctx.tx`), before the history is archived and rewritten, with every record that leaves
        the provider context in `compaction.evicted` — act on them here (e.g. extract facts into your own
        tables); raising rolls the whole replacement back (the compaction fails, nothing changes)."""

    async def compaction_tx(self, ctx: HookContext, compaction: CompactionInfo) -> None:
        """Transactional: a compaction ended — carried out (in its replacement transaction, after the
        history was replaced) or failed (`compaction.error`, in the transaction recording the failure)."""

    # -- decisions ---------------------------------------------------------------------------------
    async def instructions(self, ctx: HookContext, instructions: str) -> str:
        """The system instructions of the next model request (default: the agent's configured ones). Layers
        render per-run state into them (a payload, a scratchpad); derive them from durable state only, so a
        restarted process sends the same request (R4). Hooks chain: each gets the previous one's text."""
        return instructions

    async def tool_output(self, ctx: HookContext, call: ToolCall, result: ToolResult) -> ToolResult:
        """A call's result, after the tool ran and before it commits: return it, or a replacement for the
        conversation (e.g. a reference to where a large output was stored). Hooks chain. The `tool_result_tx`
        hooks then see the replacement; keep what they need to store (the full output) meanwhile."""
        return result

    def offered_tools(self, ctx: HookContext, tools: list[str]) -> list[str]:
        """The tool names offered to the model — and allowed to run — for this run (default: the agent's
        configured tools). Called before each inference and each batch; must be cheap and not block."""
        return tools

    async def model_changed(self, ctx: HookContext, old: dict[str, Any], new: dict[str, Any]) -> str | None:
        """An incompatible settings change is about to reset the conversation (K2). Return a handoff text
        to open the new conversation with (a system message), or None. The first non-None answer wins."""
        return None

    async def before_inference(self, ctx: HookContext) -> str | None:
        """Return a reason to end the run as failed instead of calling the model (guardrails), or None.
        The reason is recorded like a failed turn and the run settles; queued messages stay queued."""
        return None

    async def before_tool_call(self, ctx: HookContext, call: ToolCall) -> ToolResult | None:
        """Return a result to answer the call without running it (policy, approvals), or None to run it."""
        return None

    async def run_context(self, ctx: HookContext) -> RunContext | None:
        """Context for every request of this run: one system message after the instructions (memory
        notes, retrieved passages). Asked before the run's first inference, outside any transaction;
        `ctx.message` is the first message that inference consumes, `ctx.user`/`ctx.tenant` the run's.
        The answer is made durable and reused for the rest of the run (see `RunContext`). Return None when
        this hook has nothing for this agent at all (it is then asked again at the next inference, so that
        answer must not depend on anything that changes during a run); return `RunContext("")` for "nothing
        this run"."""
        return None

    # -- observing ---------------------------------------------------------------------------------
    async def settled(self, ctx: HookContext, error: str | None) -> None:
        """After the settlement committed and the loop stopped (`ctx.outcome` as in `settled_tx`)."""

    def on_event(self, agent_id: str, event: Event) -> None:
        """Every event, live. Must not block."""


HOOK_METHODS = (
    "activated_tx",
    "message_consumed_tx",
    "permission_mode_changed_tx",
    "block_tx",
    "response_tx",
    "tool_dispatched_tx",
    "tool_result_tx",
    "gate_call_tx",
    "awaiting_input_tx",
    "call_decided_tx",
    "settled_tx",
    "agent_deleted_tx",
    "before_compaction",
    "compaction_tx",
    "instructions",
    "tool_output",
    "offered_tools",
    "model_changed",
    "before_inference",
    "before_tool_call",
    "run_context",
    "settled",
    "on_event",
)


def overrides(hook: Hooks, name: str) -> bool:
    """Whether `hook` does something for `name`: its class (or the object itself) replaces the default."""
    return name in vars(hook) or getattr(type(hook), name) is not getattr(Hooks, name)


class HookSet:
    """Composes several `Hooks`: transactional hooks chain (first failure propagates), observing hooks fan
    out with per-hook failure isolation. Each method calls only the hook objects that override it (indexed
    at construction: the hook list is fixed from then on)."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = list(hooks)
        self._by: dict[str, tuple[Hooks, ...]] = {
            name: tuple(h for h in self.hooks if overrides(h, name)) for name in HOOK_METHODS
        }
        self._activated_tx = self._by["activated_tx"]
        self._message_consumed_tx = self._by["message_consumed_tx"]
        self._permission_mode_changed_tx = self._by["permission_mode_changed_tx"]
        self._block_tx = self._by["block_tx"]
        self._response_tx = self._by["response_tx"]
        self._tool_dispatched_tx = self._by["tool_dispatched_tx"]
        self._tool_result_tx = self._by["tool_result_tx"]
        self._gate_call_tx = self._by["gate_call_tx"]
        self._awaiting_input_tx = self._by["awaiting_input_tx"]
        self._call_decided_tx = self._by["call_decided_tx"]
        self._settled_tx = self._by["settled_tx"]
        self._agent_deleted_tx = self._by["agent_deleted_tx"]
        self._before_compaction = self._by["before_compaction"]
        self._compaction_tx = self._by["compaction_tx"]
        self._instructions = self._by["instructions"]
        self._tool_output = self._by["tool_output"]
        self._offered_tools = self._by["offered_tools"]
        self._model_changed = self._by["model_changed"]
        self._before_inference = self._by["before_inference"]
        self._before_tool_call = self._by["before_tool_call"]
        self._run_context = self._by["run_context"]
        self._settled = self._by["settled"]
        self._on_event = self._by["on_event"]

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def wants(self, name: str) -> bool:
        """Whether any hook object overrides `name` (ask before building a context for it)."""
        return bool(self._by[name])

    async def activated_tx(self, ctx: HookContext) -> None:
        for h in self._activated_tx:
            await h.activated_tx(ctx)

    async def message_consumed_tx(self, ctx: HookContext, message: Message) -> None:
        for h in self._message_consumed_tx:
            await h.message_consumed_tx(ctx, message)

    async def permission_mode_changed_tx(self, ctx: HookContext, old: str, new: str) -> None:
        for h in self._permission_mode_changed_tx:
            await h.permission_mode_changed_tx(ctx, old, new)

    async def block_tx(self, ctx: HookContext, block: Any) -> None:
        for h in self._block_tx:
            await h.block_tx(ctx, block)

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        for h in self._response_tx:
            await h.response_tx(ctx, info)

    async def tool_dispatched_tx(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        for h in self._tool_dispatched_tx:
            await h.tool_dispatched_tx(ctx, calls)

    async def tool_result_tx(self, ctx: HookContext, call: ToolCall, result: ToolResult) -> None:
        for h in self._tool_result_tx:
            await h.tool_result_tx(ctx, call, result)

    async def gate_call_tx(self, ctx: HookContext, call: ToolCall, tool: Tool | None) -> Gate | None:
        for h in self._gate_call_tx:
            gate = await h.gate_call_tx(ctx, call, tool)
            if gate is not None:
                return gate
        return None

    async def awaiting_input_tx(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        for h in self._awaiting_input_tx:
            await h.awaiting_input_tx(ctx, calls)

    async def call_decided_tx(
        self, ctx: HookContext, call: ToolCall, decision: str, note: str | None
    ) -> None:
        for h in self._call_decided_tx:
            await h.call_decided_tx(ctx, call, decision, note)

    async def settled_tx(self, ctx: HookContext, error: str | None) -> None:
        for h in self._settled_tx:
            await h.settled_tx(ctx, error)

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        for h in self._agent_deleted_tx:
            await h.agent_deleted_tx(ctx)

    async def before_compaction(self, ctx: HookContext, compaction: CompactionInfo) -> None:
        for h in self._before_compaction:
            await h.before_compaction(ctx, compaction)

    async def compaction_tx(self, ctx: HookContext, compaction: CompactionInfo) -> None:
        for h in self._compaction_tx:
            await h.compaction_tx(ctx, compaction)

    async def instructions(self, ctx: HookContext, instructions: str) -> str:
        for h in self._instructions:
            instructions = await h.instructions(ctx, instructions)
        return instructions

    async def tool_output(self, ctx: HookContext, call: ToolCall, result: ToolResult) -> ToolResult:
        for h in self._tool_output:
            result = await h.tool_output(ctx, call, result)
        return result

    def offered_tools(self, ctx: HookContext, tools: list[str]) -> list[str]:
        for h in self._offered_tools:
            tools = h.offered_tools(ctx, tools)
        return tools

    async def model_changed(self, ctx: HookContext, old: dict[str, Any], new: dict[str, Any]) -> str | None:
        for h in self._model_changed:
            handoff = await h.model_changed(ctx, old, new)
            if handoff is not None:
                return handoff
        return None

    async def before_inference(self, ctx: HookContext) -> str | None:
        for h in self._before_inference:
            reason = await h.before_inference(ctx)
            if reason is not None:
                return reason
        return None

    async def before_tool_call(self, ctx: HookContext, call: ToolCall) -> ToolResult | None:
        for h in self._before_tool_call:
            decision = await h.before_tool_call(ctx, call)
            if decision is not None:
                return decision
        return None

    async def run_context(self, ctx: HookContext) -> RunContext | None:
        """Every hook's context, in hook order: texts joined by a blank line, data merged (later keys
        win). None when no hook answered."""
        answers = [a for a in [await h.run_context(ctx) for h in self._run_context] if a is not None]
        if not answers:
            return None
        if len(answers) == 1:
            return answers[0]
        data: dict[str, Any] = {}
        for a in answers:
            data.update(a.data)
        return RunContext("\n\n".join(a.text for a in answers if a.text), data)

    async def settled(self, ctx: HookContext, error: str | None) -> None:
        for h in self._settled:
            try:
                await h.settled(ctx, error)
            except Exception:
                log.exception("observing hook settled() failed (ignored)")

    def on_event(self, agent_id: str, event: Event) -> None:
        for h in self._on_event:
            try:
                h.on_event(agent_id, event)
            except Exception:
                log.exception("observing hook on_event() failed (ignored)")
