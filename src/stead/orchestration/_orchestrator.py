"""The orchestration layer of one `AgentSystem`: agents built from definitions, sub-agent delegation,
runtime changes and guardrails.

`stead.open(url, definitions=...)` creates one `Orchestrator`. It registers every definition's tools, the
scripted models the definitions name, and one *delegation tool* per definition (named after it), and
installs `OrchestrationHooks` (runtime changes + guardrails) on the kernel.

Delegation (docs/orchestration.md): the delegation tool is `durable=True` and idempotent. The child agent id
and the child message id are allocated once through the call-bound KV, so a delegation re-executed after a
crash re-attaches to the same child (the send with the same message id returns `created=False`) instead of
starting a second one. The tool waits for the child to settle and returns the child's final answer; a
failed child run becomes an error result. Delegations of one parent run concurrently under a cap (a
semaphore per parent agent, default 5); the kernel commits their results in call order. Aborting the parent
aborts its children. Depth is bounded and a delegation cycle is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stead.definitions import AgentDefinition, Registry, render_instructions
from stead.extend import (
    CHANGES_KEY,
    STEP_TYPE_KEY,
    AgentNotFound,
    Closed,
    ConfigurationError,
    InvalidInput,
    Outcome,
    Provider,
    RunResult,
    RuntimeChange,
    Tool,
    ToolContext,
    TraceContextSource,
    decode_changes,
    new_id,
    tool,
)
from stead.extend import PAYLOAD_METADATA_KEY as PAYLOAD_METADATA
from stead.extend import RUN_PAYLOAD_KEY as PAYLOAD
from stead.flows import (
    BUILTIN_TOOLS,
    BUILTINS_KEY,
    FLOW_KEY,
    INPUT_METADATA,
    PROMPT_TOOL,
    Builtins,
    FlowEngine,
    FlowProvider,
    FlowRuntime,
    Pattern,
    compile_flow,
    empty_scratchpad,
    filter_payload,
    flow_key,
    has_prompt,
    payload_rules_of,
    prompt_tool,
    scratchpad_view,
)
from stead.flows import payload_change_allowed as allowed
from stead.flows import payload_diff as diff
from stead.orchestration._changes import effective, propagate
from stead.orchestration._flow_support import DefinitionsEnv
from stead.orchestration._keys import (
    PARENT_KEY,
    X_CHAIN,
    X_DATA,
    X_DEFINITION,
    X_LIMITS,
    X_MCP,
    X_MEMORY,
    X_PERMISSIONS,
    X_SUB_AGENTS,
    X_TOOLS,
    chain_of,
)

if TYPE_CHECKING:
    from stead.extend import Agent, AgentSystem

__all__ = [
    "DEFAULT_MAX_CONCURRENT_DELEGATIONS",
    "DEFAULT_MAX_DELEGATION_DEPTH",
    "DelegationError",
    "Orchestrator",
]

log = logging.getLogger("stead.orchestration")

DEFAULT_MAX_CONCURRENT_DELEGATIONS = 5
DEFAULT_MAX_DELEGATION_DEPTH = 4


class DelegationError(Exception):
    """A delegation could not produce an answer (the model gets it as an error result)."""


def _scripted_key(definition: AgentDefinition, index: int) -> str:
    return f"scripted/{definition.name}" + (f"#{index}" if index else "")


class Orchestrator:
    """Definitions, delegation tools and their policy for one `AgentSystem`."""

    def __init__(
        self,
        registry: Registry | None,
        *,
        max_concurrent_delegations: int = DEFAULT_MAX_CONCURRENT_DELEGATIONS,
        max_delegation_depth: int = DEFAULT_MAX_DELEGATION_DEPTH,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_concurrent_delegations < 1:
            raise ConfigurationError("max_concurrent_delegations must be at least 1")
        if max_delegation_depth < 0:
            raise ConfigurationError("max_delegation_depth must be 0 or more")
        self.registry = registry if registry is not None else Registry(None, {})
        self.max_concurrent = max_concurrent_delegations
        self.max_depth = max_delegation_depth
        self.clock: Callable[[], float] = clock or time.time
        self.delegation_tools: dict[str, Tool] = {name: self._delegation_tool(name) for name in self.registry}
        self.flows = FlowRuntime(X_DATA)
        """The flow layer: pending engine decisions and sub-agent payload merges (docs/flows.md)."""
        self.builtins = Builtins(
            DefinitionsEnv(self.registry, lambda: self.system, self.delegation_tools, self._template_context)
        )
        """The opt-in built-in tools of loop agents and their hooks."""
        self.engines: dict[str, FlowEngine] = {}
        for definition in self.registry.values():
            if not definition._compiled:
                compile_flow(definition)  # built in Python (Registry.of): checked here, without file lines
            if definition.type == "flow":
                self.engines[definition.name] = FlowEngine(definition)
        self._system: AgentSystem | None = None
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self.model_override: str | None = None
        """When set, every agent built from a definition uses this model string instead of the
        definition's candidates (`stead run --model`); instructions, tools and limits are unchanged."""

    # ------------------------------------------------------------------ wiring (stead.open)
    def bind(self, system: AgentSystem) -> None:
        self._system = system
        self.flows.bind(system)

    @property
    def system(self) -> AgentSystem:
        if self._system is None:
            raise ConfigurationError("the orchestrator is not bound to an agent system")
        return self._system

    def tools(self) -> list[Tool]:
        """Every definition's tools and one delegation tool per definition (to register with the system)."""
        out: dict[str, Tool] = {}
        for definition in self.registry.values():
            for t in definition.resolved_tools:
                known = out.get(t.name)
                if known is not None and known.fn is not t.fn:
                    raise ConfigurationError(
                        f"two different tools are named {t.name!r} (one of them in {definition.name!r})"
                    )
                out[t.name] = t
        for name, t in self.delegation_tools.items():
            if name in out:
                raise ConfigurationError(f"definition {name!r} has the same name as a tool")
            out[name] = t
        extra_tools = self.builtins.tools({b for d in self.registry.values() for b in d.builtin_tools})
        if any(has_prompt(d) for d in self.registry.values()):
            extra_tools.append(prompt_tool())
        for t in extra_tools:
            if t.name in out:
                raise ConfigurationError(f"a tool is named {t.name!r}, like one of stead's built-in tools")
            out[t.name] = t
        return list(out.values())

    def providers(self) -> dict[str, Provider]:
        """The scripted models the definitions name, under per-definition provider names."""
        out: dict[str, Provider] = {}
        for definition in self.registry.values():
            for i, candidate in enumerate(definition.candidates):
                provider = definition._providers.get(candidate)
                if provider is not None:
                    out[_scripted_key(definition, i)] = provider
        for name, engine in self.engines.items():
            out[flow_key(name)] = FlowProvider(engine, self.flows)
        return out

    def is_sub_agent(self, tool_name: str) -> bool:
        """Whether a tool is a delegation to a sub-agent (its steps are typed `sub_agent`)."""
        return tool_name in self.delegation_tools

    # ------------------------------------------------------------------ building agents
    def definition(self, name: str) -> AgentDefinition:
        try:
            return self.registry[name]
        except KeyError:
            known = ", ".join(sorted(self.registry)) or "none (open the system with definitions=...)"
            raise ConfigurationError(f"unknown definition {name!r}; definitions: {known}") from None

    def _resolve_model(self, definition: AgentDefinition) -> tuple[str, str]:
        """(provider, model) for a new agent of `definition`: its first usable candidate, through the
        system's model router (one grammar with `create(model=)`); a scripted model file is served by the
        definition's own scripted provider when it is registered (`providers()`)."""
        system = self.system
        if self.model_override is not None:  # `--model`: every agent this command creates uses it
            chosen = system.router.resolve(self.model_override)
            return chosen.provider, chosen.model
        try:
            chosen = system.router.resolve(definition.candidates, base_dir=definition.base_dir)
        except ConfigurationError as e:
            raise ConfigurationError(f"definition {definition.name!r}: {e}") from None
        if chosen.kind == "scripted":
            key = _scripted_key(definition, chosen.index)
            if key in system.providers:
                return key, chosen.model
        return chosen.provider, chosen.model

    def config_for(
        self,
        name: str,
        *,
        data: dict[str, Any] | None = None,
        chain: Sequence[str] | None = None,
        changes: Sequence[RuntimeChange] = (),
    ) -> dict[str, Any]:
        """Keyword arguments for `system.create` that build an agent of definition `name`: its model, its
        rendered instructions, its tools and sub-agents (with `changes` applied at its depth), its limits."""
        definition = self.definition(name)
        if definition.type == "realtime":
            raise ConfigurationError(
                f"definition {name!r} is a realtime agent: open a session with "
                f"system.realtime(definition={name!r}) (docs/realtime.md)"
            )
        if definition.type not in ("loop", "flow"):
            raise ConfigurationError(
                f"definition {name!r} has type {definition.type!r}, which is not implemented yet "
                "(only 'loop' and 'flow' agents can be created)"
            )
        if definition.type == "flow":
            return self._flow_config(definition, data=data, chain=chain, changes=changes)
        chain = list(chain) if chain is not None else [name]
        depth = len(chain) - 1
        own_tools = [t.name for t in definition.resolved_tools]
        own_tools += [b for t in definition.builtin_tools for b in BUILTIN_TOOLS[t] if b not in own_tools]
        tools, subs = effective(own_tools, definition.sub_agents, changes, depth, name)
        provider, model = self._resolve_model(definition)
        context = self._template_context(definition, tools, subs, data)
        # per-run variables are re-rendered before each model request (BuiltinHooks.instructions)
        context.update(payload={}, scratchpad=scratchpad_view(empty_scratchpad()), artifacts=[])
        instructions = render_instructions(definition, context)
        extra: dict[str, Any] = {
            "definition": str(definition.source) if definition.source is not None else name,
            X_DEFINITION: name,
            X_CHAIN: chain,
            X_TOOLS: tools,
            X_SUB_AGENTS: subs,
        }
        if data:
            extra[X_DATA] = dict(data)
        if not definition.limits.empty:
            extra[X_LIMITS] = definition.limits.model_dump(exclude_defaults=True)
        if definition.memory is not None:
            extra[X_MEMORY] = definition.memory.model_dump()  # read by the memory plugin
        if definition.metadata:
            extra["stead.metadata"] = dict(definition.metadata)
        rules = definition.permissions.model_dump(exclude_defaults=True)
        if rules:
            extra[X_PERMISSIONS] = rules  # read by the policy plugin
        if definition.mcp:
            extra[X_MCP] = [server.name for server in definition.mcp]  # read by the MCP plugin
        if definition.builtin_tools:
            extra[BUILTINS_KEY] = list(definition.builtin_tools)
        kwargs: dict[str, Any] = {
            "provider": provider,
            "model": model,
            "instructions": instructions,
            "tools": [*tools, *subs],
            "name": name,
            "extra": extra,
        }
        if definition.model_options:
            kwargs["model_options"] = dict(definition.model_options)
        if definition.output is not None:
            kwargs["output_schema"] = definition.output
        context = definition.context.model_dump(exclude_none=True)
        if context:
            chosen = context.get("compaction_model")
            if isinstance(chosen, str):  # a scripted file is relative to the definition
                context["compaction_model"] = self.system.router.resolve(
                    chosen, base_dir=definition.base_dir
                ).settings()
            kwargs["context"] = context
        return kwargs

    def _flow_config(
        self,
        definition: AgentDefinition,
        *,
        data: dict[str, Any] | None,
        chain: Sequence[str] | None,
        changes: Sequence[RuntimeChange],
    ) -> dict[str, Any]:
        """A flow agent: its provider is the flow engine (`flow/<name>`); its model is the one its prompt
        steps call; its tools are its steps' tools, its sub-agents and the prompt carrier."""
        name = definition.name
        chain = list(chain) if chain is not None else [name]
        own_tools = [t.name for t in definition.resolved_tools]
        if has_prompt(definition):
            own_tools.append(PROMPT_TOOL)
        tools, subs = effective(own_tools, definition.sub_agents, changes, len(chain) - 1, name)
        inner: dict[str, Any] = {}
        model = "flow"
        if has_prompt(definition):
            provider, model = self._resolve_model(definition)
            inner = {"provider": provider, "model": model}
        extra: dict[str, Any] = {
            "definition": str(definition.source) if definition.source is not None else name,
            X_DEFINITION: name,
            X_CHAIN: chain,
            X_TOOLS: tools,
            X_SUB_AGENTS: subs,
            FLOW_KEY: inner,
        }
        if data:
            extra[X_DATA] = dict(data)
        if not definition.limits.empty:
            extra[X_LIMITS] = definition.limits.model_dump(exclude_defaults=True)
        if definition.metadata:
            extra["stead.metadata"] = dict(definition.metadata)
        out: dict[str, Any] = {
            "provider": flow_key(name),
            "model": model,
            "instructions": "",
            "tools": [*tools, *subs],
            "name": name,
            "extra": extra,
        }
        if definition.model_options:
            # the options of its prompt steps' model calls (a flow's own requests call no model)
            out["model_options"] = dict(definition.model_options)
        return out

    def _template_context(
        self, definition: AgentDefinition, tools: Sequence[str], subs: Sequence[str], data: Any
    ) -> dict[str, Any]:
        return {
            "agent": {"name": definition.name, "description": definition.description or ""},
            "tools": [self._describe_tool(t) for t in tools],
            "sub_agents": [self._describe_sub_agent(s) for s in subs],
            "data": dict(data) if isinstance(data, dict) else {},
        }

    def _describe_tool(self, name: str) -> dict[str, str]:
        t = self.system.tools.get(name)
        return {"name": name, "description": t.description if t is not None else ""}

    def _describe_sub_agent(self, name: str) -> dict[str, str]:
        d = self.registry.get(name)
        return {"name": name, "description": (d.description or "") if d is not None else ""}

    def check_changes(self, changes: Sequence[RuntimeChange]) -> list[dict[str, Any]]:
        """Validate changes (adds must name a registered tool or a definition) and encode them for the
        message metadata."""
        out: list[dict[str, Any]] = []
        for c in changes:
            if not isinstance(c, RuntimeChange):
                raise InvalidInput(f"changes must be stead.RuntimeChange objects, not {type(c).__name__}")
            if c.action == "add":
                if c.kind == "tool" and c.name not in self.system.tools:
                    raise InvalidInput(f"cannot add tool {c.name!r}: no tool of that name is registered")
                if c.kind == "sub_agent" and c.name not in self.registry:
                    raise InvalidInput(f"cannot add sub-agent {c.name!r}: no definition of that name")
            out.append(c.encode())
        return out

    # ------------------------------------------------------------------ delegation
    def _delegation_tool(self, target: str) -> Tool:
        definition = self.registry[target]
        orchestrator = self

        async def delegate(ctx: ToolContext, request: str, input: dict[str, Any] | None = None) -> str:
            """Delegate a task to a sub-agent and return its final answer.

            Args:
                request: What the sub-agent should do, self-contained (it does not see this conversation).
                input: Optional structured input for the task.
            """
            return await orchestrator.delegate(target, ctx, request, input)

        description = f"Delegate a task to the sub-agent {target!r}"
        if definition.description:
            description += f": {definition.description}"
        t = tool(name=target, description=description, durable=True)(delegate)
        t.metadata[STEP_TYPE_KEY] = "sub_agent"  # run records type its calls as sub-agent steps
        return t

    def _traceparent(self, call_id: str) -> str | None:
        """The W3C traceparent of the delegating call's span, from a tracing plugin if one is loaded, so
        the child's spans nest under the parent's `execute_tool` span."""
        for p in self.system.plugins:
            if isinstance(p, TraceContextSource):
                found = p.traceparent_for_call(call_id)
                if found is not None:
                    return found
        return None

    def _semaphore(self, agent_id: str) -> asyncio.Semaphore:
        sem = self._semaphores.get(agent_id)
        if sem is None:
            sem = self._semaphores[agent_id] = asyncio.Semaphore(self.max_concurrent)
        return sem

    async def _run_changes(self, agent_id: str) -> list[RuntimeChange]:
        """The runtime changes of the agent's current run (kept in its run KV)."""
        async with self.system.store.transaction() as tx:
            raw = await tx.get(agent_id, RUN_CHANGES_KEY)
        if raw is None:
            return []
        return decode_changes({CHANGES_KEY: json.loads(raw)})

    async def delegate(
        self, target: str, ctx: ToolContext, request: str, input: dict[str, Any] | None
    ) -> str:
        system = self.system
        parent = await system.get(ctx.agent_id)
        parent_config = parent.config
        chain = chain_of(parent_config)
        if target in chain:
            raise DelegationError(
                f"refused: delegating to {target!r} would form a cycle ({' → '.join([*chain, target])})"
            )
        if len(chain) > self.max_depth:
            raise DelegationError(
                f"refused: the delegation depth limit ({self.max_depth}) is reached ({' → '.join(chain)})"
            )
        changes = propagate(await self._run_changes(ctx.agent_id))
        data = parent_config.extra.get(X_DATA)
        ids = await ctx.kv.get_or_create("child", lambda: {"agent": new_id(), "message": new_id()})
        child_id, message_id = str(ids["agent"]), str(ids["message"])
        child_def = self.definition(target)
        read, write = payload_rules_of(child_def)
        sent = filter_payload(await self._run_payload(ctx.agent_id), read)  # what the sub-agent may see
        async with self._semaphore(ctx.agent_id):
            child: Agent | None = None
            try:
                child = await self._child(child_id, target, [*chain, target], changes, data)
                if child_def.type == "flow" or input is None:
                    content = request  # a flow gets its input structured (`input.<key>`)
                else:
                    content = f"{request}\n\nInput:\n{json.dumps(input, indent=2)}"
                link: dict[str, Any] = {
                    "run_id": ctx.run_id,
                    "step_id": ctx.call_id,
                    "agent_id": ctx.agent_id,
                    "breadcrumb": " → ".join(chain),
                }
                traceparent = self._traceparent(ctx.call_id)
                if traceparent is not None:
                    link["traceparent"] = traceparent
                metadata: dict[str, Any] = {PARENT_KEY: link}
                if changes:
                    metadata[CHANGES_KEY] = [c.encode() for c in changes]
                if sent is not None:
                    metadata[PAYLOAD_METADATA] = sent
                if input is not None and child_def.type == "flow":
                    metadata[INPUT_METADATA] = input
                # as durable as the delegation: the same message id after a crash returns the same child
                # run's result instead of starting another
                result = await _run_child(child, ctx, content, message_id, metadata)
            except Closed:
                if child is not None and child.state == "blocked" and not system.closing:
                    raise DelegationError(
                        f"the sub-agent {target!r} ({child_id}) cannot run here: blocked"
                    ) from None
                # closing or drained: leave the call unfinished; the next owner re-attaches to the child
                raise asyncio.CancelledError from None
            except asyncio.CancelledError:
                await self._abort_child(child_id)
                raise
        if result.outcome is not Outcome.COMPLETED:
            why = result.error or result.outcome.value
            raise DelegationError(f"the sub-agent {target!r} failed: {why}")  # it changes no payload
        if not result.text.strip():
            raise DelegationError(f"the sub-agent {target!r} finished without an answer")
        self._merge_back(ctx.call_id, target, sent, result.payload, write)
        return result.text.strip()

    async def _run_payload(self, agent_id: str) -> dict[str, Any] | None:
        async with self.system.store.transaction() as tx:
            raw = await tx.get(agent_id, PAYLOAD)
        return json.loads(raw) if raw is not None else None

    def _merge_back(
        self,
        call_id: str,
        target: str,
        sent: dict[str, Any] | None,
        final: dict[str, Any] | None,
        write: list[Pattern] | None,
    ) -> None:
        """The sub-agent's payload changes that it may write, for the flow hooks to merge into this run's
        payload when the delegation's result commits (refused ones are recorded as violations)."""
        if final is None or final == sent:
            return
        changes = diff(sent, final)
        ok = [c for c in changes if allowed(c, write)]
        refused = [
            {"path": ".".join(c.path), "op": c.op, "reason": f"the sub-agent {target!r} may not write it"}
            for c in changes
            if not allowed(c, write)
        ]
        if ok or refused:
            self.flows.merges[call_id] = (ok, refused, target)

    async def _abort_child(self, child_id: str) -> None:
        """The parent was aborted: abort the child too (unless the whole system is going away)."""
        system = self.system
        if system.closing:
            return
        try:
            await (await system.get(child_id)).abort()
        except Exception:  # pragma: no cover - best effort while cancelling
            log.exception("aborting sub-agent %s failed", child_id)

    async def _child(
        self,
        child_id: str,
        target: str,
        chain: list[str],
        changes: list[RuntimeChange],
        data: Any,
    ) -> Agent:
        """The child agent of a delegation: re-attached when it exists, created (once) otherwise."""
        system = self.system
        try:
            return await system.get(child_id, resume=True)  # re-attach (and resume if it still owes work)
        except AgentNotFound:
            pass
        kwargs = self.config_for(
            target, data=data if isinstance(data, dict) else None, chain=chain, changes=changes
        )
        try:
            return await system.create(agent_id=child_id, **kwargs)
        except InvalidInput:  # created meanwhile (a concurrent re-execution): attach to it
            return await system.get(child_id)


async def _run_child(
    child: Agent, ctx: ToolContext, content: str, message_id: str, metadata: dict[str, Any]
) -> RunResult:
    """`child.run` under the parent's permission mode (a read_only parent delegates read_only). While the
    child's run waits for decisions on held calls (human approvals), the delegating call says it waits for
    input too — so the parent counts as waiting — until the child's state changes."""
    while True:
        result = await child.run(
            content, id=message_id, metadata=metadata, permission_mode=ctx.permission_mode
        )
        if result.outcome is not Outcome.AWAITING_INPUT:
            return result
        ctx.awaiting_input(True)
        try:
            await child.wait_decided()
        finally:
            ctx.awaiting_input(False)


RUN_CHANGES_KEY = "kv.r.stead.changes"
"""Run KV key holding the runtime changes of the current run (cleared at settlement by the kernel)."""
