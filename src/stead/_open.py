"""`stead.open`: the composition root. Turns the keyword shortcuts into the built-in plugins and opens the
system with them (`stead.system.open_system`).

This is the one module that knows the built-in layers by name; it imports each only when its shortcut is
used, so `import stead` loads none of them (no Jinja2, no definitions, no orchestration) and the system
itself never imports a layer above the kernel.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from stead.core.config import RetryPolicy
from stead.core.fleet import FleetConfig
from stead.core.hooks import Hooks
from stead.providers.base import Provider
from stead.store.faults import Faults
from stead.system import AgentSystem, Plugin, _opening, open_system
from stead.tools._tool import Tool

if TYPE_CHECKING:
    from stead.definitions import Registry
    from stead.memory import MemoryConfig
    from stead.observability.records import RunRecorder

__all__ = ["open"]


@_opening
async def open(
    url: str = "sqlite:///stead.db",
    *,
    plugins: Sequence[Plugin] = (),
    providers: dict[str, Provider] | None = None,
    tools: Iterable[Tool | Callable[..., Any]] = (),
    hooks: Hooks | Sequence[Hooks] | None = None,
    retry: RetryPolicy | None = None,
    faults: Faults | None = None,
    max_payload_bytes: int = 1_000_000,
    restore: bool | Collection[str] = True,
    records: bool = True,
    tracer_provider: Any = None,
    definitions: str | os.PathLike[str] | Registry | None = None,
    max_concurrent_delegations: int = 5,
    max_delegation_depth: int = 4,
    clock: Callable[[], float] | None = None,
    readonly: bool = False,
    memory: bool | MemoryConfig = False,
    approvals: bool | None = None,
    mcp: Sequence[Any] = (),
    run_agents: bool = True,
    fleet: FleetConfig | None = None,
) -> AgentSystem:
    """Open (or create) the store at `url` with its plugins, and restore every agent that owes work
    (`restore=False`: none, for inspection; a collection of ids: only those). Raises `stead.StoreLocked`
    at once if another process owns the store. Resumed agents are logged (`stead.system`, INFO).

    `plugins=[...]` extends the system (`stead.Plugin`). The keywords are shortcuts that add built-in
    plugins: `records=True` (the default) run records (`system.runs()`; a `RunRecorder` given in `hooks` is
    used instead of a new one); `tracer_provider=` OpenTelemetry GenAI spans; `definitions=` (a directory of
    agent definitions, or a `stead.definitions.Registry`) `system.create(definition=...)` with durable
    sub-agent delegation (at most `max_concurrent_delegations` running per parent, `max_delegation_depth`
    levels deep), runtime changes and guardrails (`clock` measures `limits.max_wall_seconds`).

    `readonly=True` opens the store for inspection instead, also while another process owns it: no
    ownership lock, nothing created or migrated, no agent restored (whatever `restore` says), no model
    called; `agents()`, `get(id)`, `agent.history()`, `runs()` and `run(id)` read every change the owner
    has committed (each read is a fresh read transaction); every write is refused with
    `stead.errors.ReadOnly`.

    `memory=True` (or a `stead.memory.MemoryConfig`) adds long-term memory (`system.memory`): notes and
    examples injected into agents' runs, searched lexically and semantically, and the guarded `remember`
    tool for agents whose definition allows writes (docs/memory.md). A definition with a `memory:` section
    in `definitions=` turns it on as `memory=True` would.

    The result can be awaited (`system = await stead.open(...)`) or used directly as an async context
    manager (`async with stead.open(...) as system:`), as aiosqlite's `connect`.

    `approvals=True` enforces permission modes on tool calls and keeps durable human approvals
    (`stead.policy.PolicyPlugin`: `system.approvals()`, `system.approve(id)`, `system.reject(id)`); it is on
    by default with `definitions=` (`approvals=False` turns it off), and a `PolicyPlugin` in `plugins` is
    used instead of a new one.

    `mcp=[...]` connects MCP servers (`stead.mcp.McpServer` declarations or dicts of the same keys: `name`,
    `command`/`args`/`env` or `url`/`headers`, `allow`, `trust_annotations`) and registers their tools as
    `SERVER__TOOL` (needs `stead[mcp]`); servers declared by definitions (`mcp:`) are added too.

    On PostgreSQL (`postgresql://…`) the process is a worker of a fleet by default (docs/postgres.md): it
    registers, claims owed agents nobody live owns (that is its restore), keeps claiming while open and
    hands its agents over on close; `fleet=stead.core.fleet.FleetConfig(...)` sets lease TTL, heartbeat,
    sweep, capacity and polling. `run_agents=False` opens a client instead: it creates agents, sends and
    steers (idempotent ids), aborts and reads history and runs of agents other processes run, and never
    runs a loop itself; the owner is woken by a notification sent in the accepting transaction.

    Hooks run in this order: run records, `hooks`, orchestration, policy, memory, `plugins` (in order),
    MCP, tracing."""
    hook_list: list[Hooks] = [] if hooks is None else ([hooks] if isinstance(hooks, Hooks) else list(hooks))
    # built-in hook objects given directly become their plugins (which bring their tables)
    recorders = _instances(hook_list, "stead.observability.records", "RunRecorder")
    tracers = _instances(hook_list, "stead.observability.tracing", "TracingHooks")
    hook_list = [h for h in hook_list if h not in recorders[:1] and h not in tracers[:1]]
    ordered: list[Plugin] = []
    if records or recorders:
        from stead.observability.plugin import RecordsPlugin

        ordered.append(RecordsPlugin(cast("RunRecorder", recorders[0]) if recorders else None))
    ordered.append(_UserHooks(hook_list))  # the caller's hooks run right after the run records
    if definitions is not None:
        from stead.definitions import Registry as _Registry
        from stead.definitions import load_registry
        from stead.orchestration._plugin import OrchestrationPlugin

        registry = (
            definitions
            if isinstance(definitions, _Registry)
            # `model: NAME:MODEL` in a definition may name a provider registered here
            else load_registry(
                definitions, providers=[*(providers or {}), *(n for p in plugins for n in p.providers())]
            )
        )
        ordered.append(
            OrchestrationPlugin(
                registry,
                max_concurrent_delegations=max_concurrent_delegations,
                max_delegation_depth=max_delegation_depth,
                clock=clock,
            )
        )
        if memory is False and any(d.memory is not None for d in registry.values()):
            memory = True  # a definition's `memory:` section turns memory on for the system that runs it
    want_policy = approvals if approvals is not None else definitions is not None
    if want_policy and not any(p.name == "policy" for p in plugins):
        from stead.policy import PolicyPlugin

        ordered.append(PolicyPlugin())
    if memory is not False and not any(p.name == "memory" for p in plugins):
        from stead.memory import MemoryConfig as _MemoryConfig
        from stead.memory import MemoryPlugin

        ordered.append(MemoryPlugin(memory if isinstance(memory, _MemoryConfig) else None))
    ordered.extend(plugins)
    servers = list(mcp)
    if definitions is not None:
        servers += [server for d in registry.values() for server in d.mcp]
    if servers and not any(p.name == "mcp" for p in ordered):
        from stead.mcp import McpPlugin

        ordered.append(McpPlugin(servers))
    if (tracer_provider is not None or tracers) and not any(p.name == "tracing" for p in ordered):
        from stead.observability.plugin import TracingPlugin

        ordered.append(TracingPlugin(tracer_provider, hooks=tracers[0] if tracers else None))
    return await open_system(
        url,
        plugins=ordered,
        providers=providers,
        tools=tools,
        retry=retry,
        faults=faults,
        max_payload_bytes=max_payload_bytes,
        restore=restore,
        readonly=readonly,
        run_agents=run_agents,
        fleet=fleet,
    )


def _instances(hooks: list[Hooks], module: str, name: str) -> list[Hooks]:
    """The hooks that are instances of the built-in class `module.name` (never importing the module:
    if it is not loaded, no instance of it can exist)."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return []
    cls = getattr(loaded, name)
    return [h for h in hooks if isinstance(h, cls)]


class _UserHooks(Plugin):
    """The hooks passed to `stead.open(hooks=...)`, as a plugin (so they keep their place in the order)."""

    name = "user-hooks"

    def __init__(self, hooks: list[Hooks]) -> None:
        self.given = hooks

    def hooks(self) -> list[Hooks]:
        return list(self.given)
