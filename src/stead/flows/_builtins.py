"""Opt-in built-in tools for loop agents (`builtin_tools:` in a definition) and the hooks they need.

    scratchpad   scratchpad_notes, scratchpad_tasks               stead.flows._scratchpad
    pipeline     run_pipeline                                     stead.flows._pipeline
    artifacts    artifact_json, artifact_keys, artifact_lines,    stead.flows._artifacts
                 artifact_grep, artifact_rows
    payload      read_payload, update_payload                     (here)

`BuiltinHooks` keeps their promises in the kernel's transactions:
- `instructions`: an agent whose instructions template uses `payload`, `scratchpad` or `artifacts` has it
  re-rendered before every model request from durable state (the run KV and the agent's artifacts), so a
  restarted process sends the same request (R4); other agents keep their stored instructions untouched;
- `tool_output` / `tool_result_tx`: a large output of an artifacts agent becomes an artifact written in the
  transaction that commits the call's result (the conversation keeps its manifest); a pipeline's per-stage
  records become child steps of its tool step in that same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from stead.extend import RUN_PAYLOAD_KEY as PAYLOAD
from stead.extend import (
    HookContext,
    Hooks,
    InstructionsInfo,
    InvalidInput,
    Tool,
    ToolContext,
    ToolOutputInfo,
    ToolResult,
    ToolResultInfo,
    dumps,
    record_step,
    tool,
)
from stead.flows._artifacts import (
    ARTIFACT_TOOLS,
    THRESHOLD,
    ArtifactCache,
    artifact_id_for_call,
    artifact_tools,
    describe,
    list_artifacts,
    manifest,
    write_artifact,
)
from stead.flows._artifacts import _kind as artifact_kind
from stead.flows._hooks import record_violations
from stead.flows._paths import (
    Change,
    PathError,
    Pattern,
    apply_changes,
    change_for,
    filter_payload,
    get_path,
    parse_target,
)
from stead.flows._pipeline import PIPELINE_TOOL, pipeline_tool
from stead.flows._sandbox import prestart
from stead.flows._scratchpad import SCRATCHPAD_KEY, empty, scratchpad_tools, view

__all__ = ["BUILTINS_KEY", "BUILTIN_TOOLS", "BuiltinEnv", "BuiltinHooks", "Builtins"]

BUILTINS_KEY = "stead.builtins"
"""`AgentConfig.extra` key: the built-in tool sets an agent opted into."""

BUILTIN_TOOLS: dict[str, tuple[str, ...]] = {
    "scratchpad": ("scratchpad_notes", "scratchpad_tasks"),
    "pipeline": (PIPELINE_TOOL,),
    "artifacts": ARTIFACT_TOOLS,
    "payload": ("read_payload", "update_payload"),
}
PER_RUN_VARIABLES = ("payload", "scratchpad", "artifacts")


class BuiltinEnv(Protocol):
    """What the built-ins need from the layer that builds agents (the orchestrator)."""

    def payload_rules(self, agent_id: str) -> tuple[list[Pattern] | None, list[Pattern] | None]:
        """The agent's (read, write) payload patterns (None: unrestricted)."""
        ...

    def pipeline_tools(self, agent_id: str) -> dict[str, Tool]:
        """The tools the agent's pipelines may call."""
        ...

    def render_instructions(self, ctx: HookContext, variables: dict[str, Any]) -> str | None:
        """The agent's instructions rendered with the per-run `variables`; None when its template uses
        none of them (its stored instructions stand)."""
        ...

    def uses_run_state(self, ctx: HookContext) -> bool:
        """Whether the agent's instructions template uses a per-run variable."""
        ...


class Builtins:
    """The built-in tools and their hooks for one system."""

    def __init__(self, env: BuiltinEnv) -> None:
        self.env = env
        self.cache = ArtifactCache()
        self.artifacts: dict[str, tuple[str, dict[str, Any]]] = {}
        """Call id → (content, metadata) of an output becoming an artifact, until its result commits."""
        self.stage_records: dict[str, list[dict[str, Any]]] = {}
        self.hooks = BuiltinHooks(self)

    def tools(self, wanted: Iterable[str]) -> list[Tool]:
        wanted = set(wanted)
        if wanted & {"pipeline", "artifacts"}:
            prestart()  # SEC4: their computations run in worker processes
        out: list[Tool] = []
        if "scratchpad" in wanted:
            out += scratchpad_tools()
        if "pipeline" in wanted:
            out.append(pipeline_tool(self.env.pipeline_tools, self.stage_records.__setitem__))
        if "artifacts" in wanted:
            out += artifact_tools(self.cache)
        if "payload" in wanted:
            out += payload_tools(self.env.payload_rules)
        return out


def payload_tools(
    rules: Callable[[str], tuple[list[Pattern] | None, list[Pattern] | None]],
) -> list[Tool]:
    async def read_payload(ctx: ToolContext, path: str | None = None) -> str:
        """Read the run's payload (the structured data this run carries), or the value at a dotted path.

        Args:
            path: A dotted path such as "order.status" (default: the whole payload).
        """
        async with ctx.store.transaction() as tx:
            raw = await tx.get(ctx.agent_id, PAYLOAD)
        shown = filter_payload(json.loads(raw) if raw else {}, rules(ctx.agent_id)[0]) or {}
        if path is None:
            return dumps(shown)
        try:
            target = parse_target(path)
        except PathError as e:
            raise InvalidInput(str(e)) from None
        return dumps(get_path(shown, target.path))

    async def update_payload(
        ctx: ToolContext, set: dict[str, Any] | None = None, remove: list[str] | None = None
    ) -> str:
        """Change the run's payload: set values at dotted paths ("order.status"; "notes[]" appends to a
        list) and remove paths. Changes this agent may not make are refused and recorded.

        Args:
            set: Dotted path -> new value.
            remove: Dotted paths to remove.
        """
        tx = ctx.tx
        assert tx is not None, "update_payload is transactional"
        raw = await tx.get(ctx.agent_id, PAYLOAD)
        payload: dict[str, Any] = json.loads(raw) if raw else {}
        changes: list[Change] = []
        scratch = payload
        try:
            for key, value in (set or {}).items():
                change = change_for(scratch, parse_target(key), value)
                changes.append(change)
                scratch, _, _ = apply_changes(scratch, [change], None)
            for key in remove or []:
                changes.append(Change(parse_target(key).path, "delete"))
        except PathError as e:
            raise InvalidInput(str(e)) from None
        new, applied, violations = apply_changes(payload, changes, rules(ctx.agent_id)[1])
        if applied:
            await tx.write(ctx.agent_id, PAYLOAD, dumps(new))
        await record_violations(tx, ctx.run_id, violations, source="update_payload")
        done = ", ".join(f"{c.op} {'.'.join(c.path)}" for c in applied) or "nothing"
        out = f"Applied: {done}."
        if violations:
            refused = ", ".join(f"{v['op']} {v['path']}" for v in violations)
            out += f" Refused (this agent may not change these paths; recorded as a violation): {refused}."
        return out

    return [tool(durable=True)(read_payload), tool(transactional=True)(update_payload)]


class BuiltinHooks(Hooks):
    """Per-run instructions, artifacts and pipeline records (see the module docstring)."""

    def __init__(self, builtins: Builtins) -> None:
        self.b = builtins

    async def instructions(self, ctx: HookContext, info: InstructionsInfo) -> str:
        instructions = info.instructions
        env = self.b.env
        if not env.uses_run_state(ctx):
            return instructions
        async with ctx.store.transaction() as tx:
            raw_payload = await tx.get(ctx.agent_id, PAYLOAD)
            raw_pad = await tx.get(ctx.agent_id, SCRATCHPAD_KEY)
            artifacts = await list_artifacts(tx, ctx.agent_id)
        read, _ = env.payload_rules(ctx.agent_id)
        variables = {
            "payload": filter_payload(json.loads(raw_payload) if raw_payload else {}, read) or {},
            "scratchpad": view(json.loads(raw_pad) if raw_pad else empty()),
            "artifacts": [{k: a[k] for k in ("id", "name", "kind", "chars", "shape")} for a in artifacts],
        }
        rendered = env.render_instructions(ctx, variables)
        return instructions if rendered is None else rendered

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        # SEC2: the artifacts themselves are the agent's KV rows (the kernel deletes them); the parsed
        # copies in this process go once the deletion commits
        if ctx.tx is not None:
            cache, agent_id = self.b.cache, ctx.agent_id
            ctx.tx.after_commit(lambda: cache.forget(agent_id))

    async def tool_output(self, ctx: HookContext, info: ToolOutputInfo) -> ToolResult:
        call, result = info.call, info.result
        if (
            result.is_error
            or call.id is None
            or len(result.output) <= THRESHOLD
            or call.name in ARTIFACT_TOOLS
            or "artifacts" not in (ctx.extra.get(BUILTINS_KEY) or ())
        ):
            return result
        aid = artifact_id_for_call(call.id)
        kind = artifact_kind(result.output)
        meta = {
            "id": aid,
            "kind": kind,
            "chars": len(result.output),
            "shape": describe(result.output, kind),
        }
        self.b.artifacts[call.id] = (result.output, meta)
        return ToolResult(call.id, manifest(meta, call.name))

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        tx, call = ctx.tx, info.call
        if tx is None or call.id is None:
            return
        art = self.b.artifacts.pop(call.id, None)
        if art is not None:
            content, meta = art
            await write_artifact(
                tx,
                ctx.agent_id,
                meta["id"],
                content,
                name=f"{call.name} output",
                kind=meta["kind"],
                source=call.name,
            )
        records = self.b.stage_records.pop(call.id, None)
        if records and ctx.run_id is not None:
            for rec in records:
                await record_step(
                    tx,
                    ctx.run_id,
                    "tool",
                    f"{call.name} stage {rec['stage']}: {rec['verb']}"
                    + (f" {rec['tool']}" if "tool" in rec else ""),
                    status="failed" if "error" in rec else "completed",
                    target=rec.get("tool") or rec["verb"],
                    parent_step_id=call.id,
                    output=rec,
                    error=rec.get("error"),
                )
