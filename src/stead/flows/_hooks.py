"""The flow layer's kernel hooks: they make the engine's decisions and the payload's changes durable in the
kernel's own transactions.

- `tool_dispatched_tx`: the transaction that makes a flow's next calls durable (T1) also writes what the
  engine decided to get there (its `FlowTx` from `FlowRuntime.stash`) — the step entered, its outstanding
  calls, the payload after the previous step's output mapping, any refused payload changes (a `validation`
  step).
- `response_tx`: likewise for the response that ends a flow (its final state, the payload it ends with,
  which settlement then copies into the end-of-run record).
- `tool_result_tx`: the transaction that commits a flow call's ledger result (T3) also stores its full output
  (`kv.r.stead.flow.r.<call id>`), so the step's result is durable exactly when the ledger's is; and, for any
  agent, a sub-agent's payload changes (computed by the delegation, already limited to what the sub-agent
  may write) are merged into the run's payload in that same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stead.extend import (
    HookContext,
    Hooks,
    ResponseInfo,
    ToolDispatchedInfo,
    ToolResultInfo,
    Tx,
    dumps,
    record_step,
    rename_step,
)
from stead.flows._paths import apply_changes
from stead.flows._provider import FLOW_KEY, FlowRuntime
from stead.flows._state import PAYLOAD, RAW

__all__ = ["FlowHooks", "record_violations"]


async def record_violations(
    tx: Tx, run_id: str | None, violations: Sequence[dict[str, Any]], *, source: str
) -> None:
    """Refused payload changes as one failed `validation` step of the run (nothing without run records)."""
    if not violations or run_id is None:
        return
    shown = "; ".join(f"{v['op']} {v['path']}" for v in violations[:5])
    more = f" (and {len(violations) - 5} more)" if len(violations) > 5 else ""
    await record_step(
        tx,
        run_id,
        "validation",
        f"payload ({source})",
        status="failed",
        target="payload",
        output={"violations": list(violations)},
        error=f"payload change refused, not applied: {shown}{more}",
    )


class FlowHooks(Hooks):
    """Installed with the orchestration plugin (`stead.open(definitions=...)`)."""

    def __init__(self, runtime: FlowRuntime) -> None:
        self.runtime = runtime

    async def _flush(self, ctx: HookContext, kind: str) -> None:
        found = self.runtime.take(ctx.agent_id, ctx.inference_id, kind)
        if found is None or ctx.tx is None:
            return
        await found.ft.flush(ctx.tx)
        await record_violations(ctx.tx, ctx.run_id, found.ft.violations, source="flow output")
        if ctx.run_id is not None:
            for step_id, label in found.labels.items():  # run records name the steps after the flow's
                await rename_step(ctx.tx, ctx.run_id, step_id, label)

    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        await self._flush(ctx, "work")

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        if info.reason in ("stop", "error"):
            await self._flush(ctx, "end")

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        tx, call, result = ctx.tx, info.call, info.result
        if tx is None or call.id is None:
            return
        merge = self.runtime.merges.pop(call.id, None)
        if merge is not None and not result.is_error:
            changes, violations, child = merge
            raw = await tx.get(ctx.agent_id, PAYLOAD)
            payload = json.loads(raw) if raw is not None else None
            new, applied, refused = apply_changes(payload, changes, None)
            if applied:
                await tx.write(ctx.agent_id, PAYLOAD, dumps(new))
            await record_violations(tx, ctx.run_id, [*violations, *refused], source=f"sub-agent {child}")
        if FLOW_KEY in ctx.extra:
            await tx.write(
                ctx.agent_id, RAW + call.id, dumps({"ok": not result.is_error, "out": result.output})
            )
