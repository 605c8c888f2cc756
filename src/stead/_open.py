"""`stead.open`: the composition root. Turns the keyword shortcuts into the built-in plugins (`open`) and
opens the system with them (`open_system`: collects what the plugins contribute, opens and migrates the
store, builds the kernel's `Env` and the `AgentSystem`, starts the plugins, restores owed agents).

This is the one module that knows the built-in layers by name; it imports each only when its shortcut is
used, so `import stead` loads none of them (no Jinja2, no definitions, no orchestration) and the system
itself never imports a layer above the kernel. `open_system` knows none of them: it takes plugins.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from stead._ids import new_id
from stead._opening import opening
from stead.core.config import Env, RetryPolicy
from stead.core.expire import RECALL_TOOL, recall_tool
from stead.core.fleet import SESSION_PREFIX, FleetConfig, notify_abort
from stead.core.hooks import Hooks, HookSet
from stead.errors import ConfigurationError
from stead.providers.base import Provider
from stead.providers.router import ModelRouter
from stead.store import dialect_of, open_store
from stead.store.faults import Faults
from stead.system import AgentSystem, Plugin, _register_tools
from stead.tools._tool import Tool

if TYPE_CHECKING:
    from stead.definitions import Registry
    from stead.memory import MemoryConfig
    from stead.observability.records import RunRecorder

__all__ = ["open", "open_system"]


@opening
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


async def open_system(
    url: str,
    *,
    plugins: Sequence[Plugin] = (),
    providers: Mapping[str, Provider] | None = None,
    tools: Iterable[Tool | Callable[..., Any]] = (),
    hooks: Sequence[Hooks] = (),
    retry: RetryPolicy | None = None,
    faults: Faults | None = None,
    max_payload_bytes: int = 1_000_000,
    restore: bool | Collection[str] = True,
    readonly: bool = False,
    run_agents: bool = True,
    fleet: FleetConfig | None = None,
) -> AgentSystem:
    """Open the store at `url` with `plugins` and return the system (what `stead.open` does once it has
    turned its keyword shortcuts into plugins).

    Order: every plugin's tools, providers, hooks and migrations are collected (`hooks` run before the
    plugins' hooks); the store opens and migrates; plugins start in order; then agents that owe work are
    restored (`restore=False`: none; a collection of ids: only those).

    On PostgreSQL the process is a worker of a fleet (`stead.core.fleet`, settings `fleet`): restoring
    means claiming owed agents nobody live owns, and it keeps claiming while open (`restore=False`: it
    runs only the agents it creates or resumes). `run_agents=False` opens a client instead: it creates
    agents, accepts messages, aborts and reads, and never runs a loop."""
    names = [p.name for p in plugins]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigurationError(f"two plugins are named {', '.join(map(repr, dupes))}")
    provider_map: dict[str, Provider] = {}
    tool_map: dict[str, Tool] = {}
    hook_list: list[Hooks] = list(hooks)
    for p in plugins:
        for pname, prov in p.providers().items():
            if pname in provider_map and provider_map[pname] is not prov:
                raise ConfigurationError(f"two plugins register a provider named {pname!r}")
            provider_map[pname] = prov
        hook_list.extend(p.hooks())
    provider_map.update(providers or {})  # the caller's own providers win over plugins'
    _register_tools(tool_map, tools)
    for p in plugins:
        _register_tools(tool_map, p.tools())
    tool_map.setdefault(RECALL_TOOL, recall_tool())  # the kernel's built-in tool of expiration (K1)
    dialect = dialect_of(url)  # what the store registered for the URL's scheme declares (`stead.stores`)
    migrations = _collect_migrations(plugins, hook_list, dialect)
    tag = None
    if dialect == "postgresql" and run_agents and not readonly and "application_name=" not in url:
        # every session of this worker carries its tag, so that the fleet can end the sessions (and free
        # the row locks) of a worker evicted while frozen inside a transaction (`stead.core.fleet`)
        tag = new_id()[:16]
        url = f"{url}{'&' if '?' in url else '?'}application_name={SESSION_PREFIX}{tag}"
    store = await open_store(url, faults=faults, migrations=migrations, readonly=readonly)
    router = ModelRouter(provider_map)
    env = Env(
        store=store,
        providers=provider_map,
        tools=tool_map,
        hooks=HookSet(hook_list),
        retry=retry or RetryPolicy(),
        max_payload_bytes=max_payload_bytes,
        compatible=router.compatible,
        resolve_provider=router.provider_for,
        context_window=router.context_window,
        output_limit=router.output_limit,
        # aborting an agent another process runs (a worker's fleet answers for the agents it owns)
        remote_abort=functools.partial(notify_abort, store) if store.capabilities.fleet is not None else None,
    )
    system = AgentSystem(
        store,
        env,
        router,
        plugins,
        readonly=readonly,
        run_agents=run_agents,
        fleet=fleet,
        claim=restore is True,
        session_tag=tag,
    )
    await system._start(restore)
    return system


def _collect_migrations(
    plugins: Sequence[Plugin], hooks: Sequence[Hooks], dialect: str
) -> dict[str, list[str]]:
    """Every module's scripts for the store's dialect. A plugin with migrations but none for this dialect
    cannot be opened here (its SQL would fail later, mid-run)."""
    out: dict[str, list[str]] = {}
    sources: list[tuple[str, Mapping[str, Sequence[str]]]] = []
    for p in plugins:
        if not p.migrations:
            continue
        scripts = p.migrations.get(dialect)
        if scripts is None:
            have = ", ".join(sorted(p.migrations))
            raise ConfigurationError(
                f"plugin {p.name!r} has no schema migrations for {dialect} stores (it has: {have})"
            )
        sources.append((f"plugin {p.name!r}", scripts))
    for h in hooks:
        if isinstance(h, Plugin):
            continue  # a plugin that is its own hooks declared its migrations per dialect, above
        legacy = type(h).migrations  # Hooks.migrations: module -> scripts, SQLite dialect
        if legacy:
            if dialect != "sqlite":
                raise ConfigurationError(
                    f"hooks {type(h).__name__} declare SQLite migrations only; wrap them in a stead.Plugin "
                    f"with migrations for {dialect}"
                )
            sources.append((f"hooks {type(h).__name__}", legacy))
    for who, scripts in sources:
        for module, module_scripts in scripts.items():
            if module in out and out[module] != list(module_scripts):
                raise ConfigurationError(f"{who} declares different migrations for module {module!r}")
            out[module] = list(module_scripts)
    return out
