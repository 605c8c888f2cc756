"""Kernel hooks of the orchestration layer: runtime changes (a per-run tool view) and guardrails (limits).

Runtime changes. The message that starts a run may carry `metadata["stead.changes"]`. At activation (in the
accepting transaction) they are written to the run KV (`kv.r.stead.changes`, erased by the kernel at
settlement) and, after the commit, the agent's offered tools become its own tools and sub-agents with the
applicable changes applied; at settlement the agent's stored configuration is put back. After a restart the
changes are re-read from the run KV (`activated_tx` with `restored=True`). The kernel offers `config.tools`
to the model and refuses calls to tools outside it, so the view is enforced, not only advertised.

Guardrails. For agents whose definition sets `limits`, per-run counters (inferences, tokens, cost, the start
time, calls per tool, calls refused) live in the run KV (`kv.r.stead.guard`), written inside the kernel's
transactions (`activated_tx`, `response_tx`, `tool_dispatched_tx`), so they survive a restart exactly as far
as the work they count. `before_inference` refuses the next model request once a limit is reached (the kernel
ends the run `failed` with that reason, queued messages stay queued); a call beyond `max_calls` gets an error
result from `before_tool_call`. Each violation is recorded as a failed `guardrail` step when run records
are on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stead.extend import (
    CHANGES_KEY,
    BeforeToolCallInfo,
    HookContext,
    Hooks,
    OfferedToolsInfo,
    ResponseInfo,
    SettledInfo,
    ToolDispatchedInfo,
    ToolResult,
    ToolResultInfo,
    Tx,
    decode_changes,
    dumps,
    record_step,
)
from stead.orchestration._changes import effective
from stead.orchestration._keys import X_DEFINITION, X_LIMITS, base_lists, chain_of
from stead.orchestration._orchestrator import RUN_CHANGES_KEY

if TYPE_CHECKING:
    from stead.extend import AgentConfig, AgentSystem

__all__ = ["GUARD_KEY", "OrchestrationHooks"]

GUARD_KEY = "kv.r.stead.guard"


class OrchestrationHooks(Hooks):
    """Runtime changes and guardrails. Installed by `stead.open(definitions=...)`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._system: AgentSystem | None = None
        self._views: dict[str, list[str]] = {}  # run id → the tools (and sub-agents) that run offers
        self._violations: dict[str, tuple[str, str]] = {}  # run id → (limit, reason)
        self._refused: dict[str, tuple[str, str]] = {}  # call id → (limit, reason)

    def bind(self, system: AgentSystem) -> None:
        self._system = system

    # ------------------------------------------------------------------ helpers
    def _records(self) -> bool:
        """Whether run records are on (guardrail violations are then recorded as steps)."""
        return self._system is not None and self._system.has_plugin("records")

    def _config(self, agent_id: str) -> AgentConfig | None:
        agent = self._system.loaded(agent_id) if self._system is not None else None
        return None if agent is None else agent.config

    @staticmethod
    def _limits(ctx: HookContext) -> dict[str, Any] | None:
        limits = ctx.extra.get(X_LIMITS)
        return limits if isinstance(limits, dict) and limits else None

    @staticmethod
    async def _read(tx: Tx, agent_id: str, key: str) -> Any:
        raw = await tx.get(agent_id, key)
        return None if raw is None else json.loads(raw)

    async def _guard(self, ctx: HookContext) -> dict[str, Any]:
        if ctx.tx is not None:
            state = await self._read(ctx.tx, ctx.agent_id, GUARD_KEY)
        else:
            async with ctx.store.transaction() as tx:
                state = await self._read(tx, ctx.agent_id, GUARD_KEY)
        return state if isinstance(state, dict) else {}

    # ------------------------------------------------------------------ runtime changes: the tool view
    def _apply_view(self, agent_id: str, run_id: str | None, raw_changes: list[Any]) -> None:
        """After commit: this run offers the agent its own tools and sub-agents with the changes applied."""
        base = self._config(agent_id)
        if base is None or run_id is None or self._system is None:
            return
        changes = decode_changes({CHANGES_KEY: raw_changes})
        tools, subs = base_lists(base)
        chain = chain_of(base)
        name = str(base.extra.get(X_DEFINITION) or base.name or "")
        tools, subs = effective(tools, subs, changes, len(chain) - 1, name or None)
        known = self._system.tools
        self._views[run_id] = [t for t in [*tools, *subs] if t in known]

    def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
        if ctx.run_id is None:
            return info.tools
        return self._views.get(ctx.run_id, info.tools)

    # ------------------------------------------------------------------ transactional hooks
    async def activated_tx(self, ctx: HookContext) -> None:
        tx = ctx.tx
        if tx is None:
            return
        agent_id = ctx.agent_id
        if ctx.restored:
            changes = await self._read(tx, agent_id, RUN_CHANGES_KEY)
            if isinstance(changes, list) and changes:
                run_id = ctx.run_id
                tx.after_commit(lambda: self._apply_view(agent_id, run_id, changes))
            return
        metadata = ctx.message.metadata if ctx.message is not None else None
        raw = (metadata or {}).get(CHANGES_KEY)
        if isinstance(raw, list) and raw:
            await tx.write(agent_id, RUN_CHANGES_KEY, dumps(raw))
            run_id = ctx.run_id
            tx.after_commit(lambda: self._apply_view(agent_id, run_id, raw))
        if self._limits(ctx) is not None:
            await tx.write(agent_id, GUARD_KEY, dumps({"t0": self.clock()}))

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        if ctx.tx is None or ctx.run_id is None or self._limits(ctx) is None or not info.model_call:
            return  # no model request to count (a flow engine's navigation)
        violation = self._violations.get(ctx.run_id)
        if violation is not None and info.error == violation[1]:
            return  # the refused request: no inference happened
        state = await self._guard(ctx)
        state["it"] = int(state.get("it", 0)) + 1
        if info.usage is not None:
            state["tok"] = int(state.get("tok", 0)) + info.usage.input_tokens + info.usage.output_tokens
            if info.usage.cost is not None:
                state["cost"] = float(state.get("cost", 0.0)) + info.usage.cost
        await ctx.tx.write(ctx.agent_id, GUARD_KEY, dumps(state))

    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        limits = self._limits(ctx)
        if ctx.tx is None or limits is None:
            return
        max_calls = limits.get("max_calls") or {}
        if not max_calls:
            return
        state = await self._guard(ctx)
        counts: dict[str, int] = dict(state.get("calls") or {})
        refused: dict[str, str] = dict(state.get("refused") or {})
        for call in info.calls:
            counts[call.name] = counts.get(call.name, 0) + 1
            cap = max_calls.get(call.name)
            if cap is not None and counts[call.name] > int(cap) and call.id is not None:
                refused[call.id] = call.name
        state["calls"], state["refused"] = counts, refused
        await ctx.tx.write(ctx.agent_id, GUARD_KEY, dumps(state))

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        call = info.call
        refused = self._refused.pop(call.id or "", None)
        if refused is not None and ctx.tx is not None and ctx.run_id is not None and self._records():
            await _record_violation(ctx.tx, ctx.run_id, refused[0], refused[1], detail={"call_id": call.id})

    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        if ctx.run_id is None:
            return
        error = info.error
        if ctx.tx is not None:
            run_id = ctx.run_id
            ctx.tx.after_commit(lambda: self._views.pop(run_id, None))
        violation = self._violations.pop(ctx.run_id, None)
        if violation is not None and error == violation[1] and ctx.tx is not None and self._records():
            await _record_violation(ctx.tx, ctx.run_id, violation[0], violation[1])

    # ------------------------------------------------------------------ decisions
    async def before_inference(self, ctx: HookContext) -> str | None:
        limits = self._limits(ctx)
        if limits is None or ctx.run_id is None:
            return None
        state = await self._guard(ctx)
        found = _violated(limits, state, self.clock())
        if found is None:
            return None
        self._violations[ctx.run_id] = found
        return found[1]

    async def before_tool_call(self, ctx: HookContext, info: BeforeToolCallInfo) -> ToolResult | None:
        call = info.call
        limits = self._limits(ctx)
        if limits is None or not limits.get("max_calls") or call.id is None:
            return None
        state = await self._guard(ctx)
        refused = state.get("refused") or {}
        if call.id not in refused:
            return None
        cap = int((limits.get("max_calls") or {}).get(call.name, 0))
        name = f"max_calls.{call.name}"
        reason = (
            f"guardrail {name} exceeded: {call.name!r} may be called at most {cap} time(s) per run; "
            "this call was not run"
        )
        self._refused[call.id] = (name, reason)
        return ToolResult(call.id, reason, True)


async def _record_violation(tx: Tx, run_id: str, name: str, error: str, *, detail: Any = None) -> None:
    """A violated limit as a failed `guardrail` step of the run (nothing when run records are off)."""
    output: dict[str, Any] = {"violation": error}
    if detail is not None:
        output["detail"] = detail
    await record_step(tx, run_id, "guardrail", name, status="failed", target=name, output=output, error=error)


def _violated(limits: dict[str, Any], state: dict[str, Any], now: float) -> tuple[str, str] | None:
    """The first limit the run has reached, as (limit name, reason), or None."""
    it = int(state.get("it", 0))
    tok = int(state.get("tok", 0))
    cost = float(state.get("cost", 0.0))
    t0 = state.get("t0")
    cap = limits.get("max_iterations")
    if cap is not None and it >= int(cap):
        return "max_iterations", f"guardrail max_iterations exceeded: {it} of {cap} model requests used"
    cap = limits.get("max_tokens")
    if cap is not None and tok >= int(cap):
        return "max_tokens", f"guardrail max_tokens exceeded: {tok} tokens used, the limit is {cap}"
    cap = limits.get("max_cost")
    if cap is not None and cost >= float(cap):
        return "max_cost", f"guardrail max_cost exceeded: ${cost:.4f} spent, the limit is ${float(cap):.4f}"
    cap = limits.get("max_wall_seconds")
    if cap is not None and t0 is not None and now - float(t0) >= float(cap):
        return (
            "max_wall_seconds",
            f"guardrail max_wall_seconds exceeded: the run has taken {now - float(t0):.1f}s, "
            f"the limit is {float(cap):g}s",
        )
    return None
