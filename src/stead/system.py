"""`AgentSystem`: owns one store and its plugins; creates, finds, restores and deletes agents; closes cleanly.
With it, `stead.Plugin`, the base class of what it hosts (each is typed by the other, so they share a module).

The system knows no layer above the kernel: run records, tracing, orchestration and every later layer are
`stead.Plugin`s handed to `open_system` (`stead._open`; `stead.open` adds the built-in ones for its keyword
shortcuts). Plugins contribute tools, providers, hooks, per-dialect migrations, message validators and a
start/close lifecycle, and reach the system through its public methods only.

Opening restores exactly the agents that owe work, by reading their small pending records — never their
transcripts (R3) — after every plugin has started, so restored agents run with all hooks installed.
Acceptance (validation by plugins, group commit) lives in `stead._group_commit`; `Opening`, what
`stead.open` returns, in `stead._opening` (re-exported here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, TypeVar, cast

from stead._approvals import Approval, ApprovalSource, ApprovalStatus, Decision
from stead._group_commit import GroupCommit
from stead._ids import ID_RULE, is_valid_user_id, new_id
from stead._opening import Opening
from stead._plugin import (
    DefinitionSource,
    IncomingMessage,
    MemorySource,
    Migrations,
    RealtimeSessionHandle,
    RealtimeSource,
)
from stead._runs import Run, RunReader
from stead.agent import Agent
from stead.core.config import PERMISSION_MODES, AgentConfig, ContextPolicy, Env, QueueMode
from stead.core.fleet import Fleet, FleetConfig
from stead.core.hooks import HookContext, Hooks
from stead.core.records import PENDING, SETTINGS, Pending
from stead.core.runtime import AgentRuntime, inside_agent
from stead.core.structured import check_output_schema
from stead.errors import (
    AgentNotFound,
    CloseFromInside,
    ConfigurationError,
    InvalidId,
    InvalidInput,
)
from stead.providers._options import check_model_options
from stead.providers.base import ModelOptions, Provider
from stead.providers.router import ModelRouter
from stead.store import Store
from stead.store.base import AgentRow
from stead.tools._tool import Tool, tool

__all__ = ["AgentInfo", "AgentSystem", "Opening", "Plugin"]

log = logging.getLogger("stead.system")
T = TypeVar("T")


class Plugin:
    """Extend stead: subclass and override what the layer contributes. Everything is optional.

    `name` identifies the plugin (`system.plugin(name)`); two plugins of one system may not share it."""

    name: ClassVar[str] = "plugin"
    migrations: ClassVar[Migrations] = {}

    def tools(self) -> Iterable[Tool | Callable[..., Any]]:
        """Tools this plugin registers with the system (names must not collide with other tools)."""
        return ()

    def providers(self) -> Mapping[str, Provider]:
        """Providers by name; an agent selects one with `provider=NAME` or a model string `NAME:model`."""
        return {}

    def hooks(self) -> Iterable[Hooks]:
        """Hook objects to install on the kernel (called once, when the system opens). A plugin that is
        itself a `stead.Hooks` subclass installs itself by default."""
        return (self,) if isinstance(self, Hooks) else ()

    def validate_message(self, message: IncomingMessage) -> None:
        """Refuse an inbound message by raising `stead.InvalidInput` (nothing is written). Must not block."""

    async def start(self, system: AgentSystem) -> None:
        """The store is open and migrated; no agent has been restored yet. Use public methods only."""

    async def close(self, system: AgentSystem) -> None:
        """Every agent has stopped; the store is still open. Release what `start` acquired."""


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """A row of `system.agents()`."""

    id: str
    name: str | None
    active: bool
    created_at: float


class AgentSystem:
    """Every agent of one store. Use `await stead.open(url, ...)`, ideally as `async with`."""

    def __init__(
        self,
        store: Store,
        env: Env,
        router: ModelRouter | None = None,
        plugins: Sequence[Plugin] = (),
        *,
        readonly: bool = False,
        run_agents: bool = True,
        fleet: FleetConfig | None = None,
        claim: bool = True,
        session_tag: str | None = None,
    ) -> None:
        self.store = store
        self.readonly = readonly
        self.run_agents = run_agents and not readonly
        """Whether agents' loops run in this process (False: a client of a PostgreSQL fleet, or readonly)."""
        self.fleet: Fleet | None = None
        """The worker side on PostgreSQL (`stead.core.fleet`): which agents this process owns and runs."""
        """Opened with `readonly=True`: an inspector that reads what an owner commits and writes nothing."""
        self._env = env
        self.router = router or ModelRouter(env.providers)
        self._plugins: list[Plugin] = list(plugins)
        self._started: list[Plugin] = []
        self._runtimes: dict[str, AgentRuntime] = {}
        self._closed = asyncio.Event()
        self._background: asyncio.Task[None] | None = None
        self.admission = GroupCommit(
            store,
            self.router,
            max_payload_bytes=env.max_payload_bytes,
            validators=[
                p.validate_message
                for p in self._plugins
                if type(p).validate_message is not Plugin.validate_message
            ],
            readonly=readonly,
        )
        self.restored: list[str] = []
        if self.run_agents and store.capabilities.fleet is not None:
            # a worker of a fleet (`claim`: it claims owed agents by itself, `stead.core.fleet`)
            self.fleet = Fleet(self, store, env, self._runtimes, fleet, claim=claim, session_tag=session_tag)

    async def __aenter__(self) -> AgentSystem:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ registry
    @property
    def tools(self) -> dict[str, Tool]:
        """Every registered tool by name (the user's and the plugins')."""
        return self._env.tools

    @property
    def providers(self) -> dict[str, Provider]:
        """Every registered provider by name (the user's and the plugins')."""
        return self._env.providers

    @property
    def plugins(self) -> list[Plugin]:
        """The plugins of this system, in the order their hooks run."""
        return list(self._plugins)

    def plugin(self, name: str) -> Plugin:
        """The plugin named `name`; `ConfigurationError` listing the loaded ones when there is none."""
        for p in self._plugins:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self._plugins) or "none"
        raise ConfigurationError(f"no plugin named {name!r} is loaded (plugins: {known})")

    def has_plugin(self, name: str) -> bool:
        return any(p.name == name for p in self._plugins)

    @property
    def memory(self) -> Any:
        """Long-term memory (notes and examples) of this system's agents: a `stead.memory.Memory`, served
        by the plugin that keeps it (`stead.open(url, memory=True)`); `ConfigurationError` without one."""
        return self._provider_of(
            MemorySource,
            "system.memory needs the memory plugin: open the system with stead.open(url, memory=True)",
        ).memory

    def _provider_of(self, kind: Callable[..., T], missing: str) -> T:
        """The first plugin that is a `kind` (a runtime-checkable protocol: the API a plugin backs, such
        as `RunReader`); `ConfigurationError(missing)` when no plugin is one. (`kind` is typed as a callable
        because mypy refuses protocols where `type[T]` is expected, python/mypy#4717.)"""
        for p in self._plugins:
            if isinstance(p, cast("type[T]", kind)):
                return p
        raise ConfigurationError(missing)

    def add_tools(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Register more tools (a plugin's `start` may, e.g. tools discovered from an MCP server)."""
        _register_tools(self._env.tools, tools)

    def loaded(self, agent_id: str) -> Agent | None:
        """The agent if it is loaded in this process (no I/O; None otherwise). For hooks, which must not
        block: `system.get` reads the store."""
        rt = self._runtimes.get(agent_id)
        return None if rt is None else Agent(self.admission, rt, self._approval_source)

    def _check_open(self) -> None:
        self.admission.check_open()

    def _check_writable(self) -> None:
        self.admission.check_writable()

    # ------------------------------------------------------------------ agents
    async def create(
        self,
        *,
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        instructions: str = "",
        tools: Sequence[str] = (),
        agent_id: str | None = None,
        name: str | None = None,
        steering_mode: str = "one-at-a-time",
        send_mode: str = "one-at-a-time",
        permission_mode: str = "auto",
        max_tool_concurrency: int = 8,
        max_tool_result_chars: int = 100_000,
        extra: dict[str, Any] | None = None,
        definition: str | None = None,
        data: dict[str, Any] | None = None,
        context_window: int | None = None,
        context: ContextPolicy | Mapping[str, Any] | None = None,
        max_output_tokens: int | None = None,
        model_options: ModelOptions | Mapping[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> Agent:
        """Create an agent. Unknown providers or tools and malformed or taken ids are refused, unwritten.

        `definition="name"` builds it from a definition of the registry given to `stead.open(definitions=)`
        (any plugin that is a `DefinitionSource`): its model, its instructions rendered with `data`, its
        tools, its sub-agents (as tools) and limits.

        `context_window=N` is the model's window in tokens (default: the catalog's); `context` the rest of
        the context policy, as a `stead.ContextPolicy` or a mapping with the keys of a definition's
        `context:` section (`window`, `reserve`, `keep_recent_tokens`, `compaction_model` — a model string
        —, `expire_tool_results_after_turns`, `max_tool_result_chars`, `max_output_tokens`, `auto`).
        `max_output_tokens=N` caps each of the agent's responses (default: the catalog's output limit for
        its model; never more than the window minus the request), durable like the rest of the policy.
        See docs/context.md.

        `model_options` (`stead.ModelOptions` or a mapping of its fields: `tool_choice`, `temperature`,
        `top_p`, `top_k`, `max_tokens`, `seed`, `stop`, `presence_penalty`, `frequency_penalty`) go with
        every request, mapped per vendor (`max_tokens` is the agent's output cap, `max_output_tokens`);
        `output_schema` makes every run's result typed (a run's own `output_schema` wins). See
        docs/providers.md."""
        self._check_open()
        if definition is not None:
            if provider is not None or model is not None or instructions or tools or extra:
                raise ConfigurationError(
                    "create(definition=...) takes its provider, model, instructions, tools and extra from "
                    "the definition; do not pass them too"
                )
            kwargs = self._definition_source().config_for(definition, data=data)
            if context is not None or context_window is not None or max_output_tokens is not None:
                kwargs["context"] = {**dict(kwargs.get("context") or {}), **_context_items(context)}
                if context_window is not None:
                    kwargs["context"]["window"] = context_window
                if max_output_tokens is not None:
                    kwargs["context"]["max_output_tokens"] = max_output_tokens
            kwargs.setdefault("max_tool_result_chars", max_tool_result_chars)
            if model_options is not None:
                kwargs["model_options"] = {
                    **dict(kwargs.get("model_options") or {}),
                    **_options_items(model_options),
                }
            if output_schema is not None:
                kwargs["output_schema"] = output_schema
            return await self.create(
                agent_id=agent_id,
                steering_mode=steering_mode,
                send_mode=send_mode,
                permission_mode=permission_mode,
                max_tool_concurrency=max_tool_concurrency,
                **kwargs,
            )
        if data is not None:
            raise ConfigurationError("create(data=...) needs definition=...")
        if agent_id is not None and not is_valid_user_id(agent_id):
            raise InvalidId(f"agent id {agent_id!r} is not a valid id: use {ID_RULE}")
        chosen = self.router.resolve(model, provider=provider)  # one grammar; candidates resolved now
        provider, model = chosen.provider, chosen.model
        unknown = [t for t in tools if t not in self._env.tools]
        if unknown:
            known = ", ".join(sorted(self._env.tools)) or "none"
            raise ConfigurationError(f"unknown tool(s) {', '.join(unknown)}; registered tools: {known}")
        for mode in (steering_mode, send_mode):
            if mode not in ("one-at-a-time", "all"):
                raise InvalidInput(f"queue mode must be 'one-at-a-time' or 'all', not {mode!r}")
        if permission_mode not in PERMISSION_MODES:
            raise InvalidInput(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}")
        try:
            options = check_model_options(_options_items(model_options), tools=tools)
        except ValueError as e:
            raise ConfigurationError(str(e)) from None
        try:
            schema = check_output_schema(output_schema) if output_schema is not None else None
        except InvalidInput as e:
            raise ConfigurationError(str(e)) from None
        if max_output_tokens is None and options.max_tokens is not None:
            max_output_tokens = options.max_tokens  # model_options.max_tokens is the agent's output cap (MR1)
        policy, result_chars = self._context_policy(context, context_window, max_output_tokens)
        if result_chars is not None:
            max_tool_result_chars = result_chars
        config = AgentConfig(
            provider=provider,
            model=model,
            instructions=instructions,
            tools=list(tools),
            name=name,
            steering_mode=cast(QueueMode, steering_mode),
            send_mode=cast(QueueMode, send_mode),
            permission_mode=permission_mode,
            max_tool_concurrency=max_tool_concurrency,
            max_tool_result_chars=max_tool_result_chars,
            extra=dict(extra or {}),
            context=policy,
            model_options=options.items(),
            output_schema=schema,
        )
        aid = agent_id or new_id()
        owned = self._local
        async with self.store.transaction() as tx:
            if not await tx.insert_agent(AgentRow(aid, name, config.encode(), time.time())):
                raise InvalidInput(f"an agent with id {aid} already exists")
            if self.fleet is not None:
                owned = await self.fleet.own_new(tx, aid)  # W1: the creating worker owns it (sticky)
        rt = AgentRuntime(aid, config, self._env)
        rt.owned = owned
        self._runtimes[aid] = rt
        return Agent(self.admission, rt, self._approval_source)

    def _context_policy(
        self,
        context: ContextPolicy | Mapping[str, Any] | None,
        window: int | None,
        max_output_tokens: int | None = None,
    ) -> tuple[ContextPolicy, int | None]:
        """The checked context policy (and a `max_tool_result_chars` it carries)."""
        items = _context_items(context)
        result_chars = items.pop("max_tool_result_chars", None)
        if window is not None:
            items["window"] = window
        if max_output_tokens is not None:
            items["max_output_tokens"] = max_output_tokens
        unknown = set(items) - set(ContextPolicy.__dataclass_fields__)
        if unknown:
            raise ConfigurationError(f"unknown context setting(s) {', '.join(sorted(unknown))}")
        for key in (
            "window",
            "reserve",
            "keep_recent_tokens",
            "expire_tool_results_after_turns",
            "max_output_tokens",
        ):
            value = items.get(key)
            least = 0 if key == "expire_tool_results_after_turns" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigurationError(
                    f"context {key} must be an integer of at least {least}, not {value!r}"
                )
        w = items.get("window")
        if w is not None and items.get("reserve") is not None and items["reserve"] >= w:
            raise ConfigurationError(
                f"context reserve ({items['reserve']}) must be less than the window ({w})"
            )
        chosen = items.get("compaction_model")
        if isinstance(chosen, str | list):
            items["compaction_model"] = self.router.resolve(chosen).settings()
        elif chosen is not None and not (isinstance(chosen, dict) and "provider" in chosen):
            raise ConfigurationError(f"context compaction_model must be a model string, not {chosen!r}")
        if result_chars is not None and (isinstance(result_chars, bool) or not isinstance(result_chars, int)):
            raise ConfigurationError(
                f"context max_tool_result_chars must be an integer, not {result_chars!r}"
            )
        return ContextPolicy(**items), result_chars

    def _definition_source(self) -> DefinitionSource:
        return self._provider_of(
            DefinitionSource,
            "create(definition=...) needs definitions: open the system with definitions=DIR "
            "(or a plugin that provides them)",
        )

    async def realtime(
        self,
        *,
        definition: str,
        session_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> RealtimeSessionHandle:
        """Open a realtime session of the `type: realtime` definition `definition` (docs/realtime.md): a
        duplex voice or text conversation that hands work to durable agents. `session_id` reopens a session
        (its undelivered results come first); `overrides` is the runtime layer of its settings. Needs a
        plugin that opens sessions (`stead.realtime.RealtimePlugin`)."""
        self._check_open()
        source = self._provider_of(
            RealtimeSource,
            "system.realtime() needs the realtime plugin: "
            "stead.open(..., definitions=DIR, plugins=[stead.realtime.RealtimePlugin()])",
        )
        return await source.open_session(self, definition, session_id=session_id, overrides=overrides)

    async def get(self, agent_id: str, *, resume: bool = False) -> Agent:
        """The agent with this id; raises `AgentNotFound`.

        With `resume=True`, an agent that owes work and is not running in this process (the store was
        opened with `restore=False`, or it was not in the `restore=` list) is started, as a restore would."""
        if resume:
            self._check_writable()
        rt = self._runtimes.get(agent_id)
        pending: Pending | None = None
        known: tuple[AgentConfig, Pending | None, str | None] | None = None  # as read here
        if rt is None:
            if not is_valid_user_id(agent_id):
                raise AgentNotFound(f"no agent with id {agent_id!r}")
            async with self.store.transaction() as tx:
                row = await tx.get_agent(agent_id)
                # C3/P1: the durable effective settings, so hooks and `agent.settings` see them before a turn
                settings = await tx.get(agent_id, SETTINGS) if row is not None else None
                pending = Pending.decode(await tx.get(agent_id, PENDING)) if row is not None else None
            if row is None:
                raise AgentNotFound(f"no agent with id {agent_id!r}")
            known = (AgentConfig.decode(row.config), pending, settings)
            rt = self._runtimes.get(agent_id)
            if rt is None:
                rt = self._runtimes[agent_id] = AgentRuntime(
                    agent_id, AgentConfig.decode(row.config), self._env
                )
                rt.owned = self._local  # PostgreSQL: another process may run it (`stead.core.fleet`)
                if settings:
                    rt._settings = json.loads(settings)
                if resume and pending is not None and not self.closing and rt.owned:
                    rt.restore(pending)
        fleet = self.fleet
        idle = known is not None and known[1] is None
        if fleet is not None and not rt.owned and not self.closing and (resume or fleet.auto or idle):
            # W1: owned by no live worker: this worker runs it (owed work only when it may resume it)
            await fleet.try_own(agent_id, known)
        return Agent(self.admission, rt, self._approval_source)

    @property
    def _local(self) -> bool:
        """Agents of this store run here unless a fleet decides otherwise (SQLite: always)."""
        return self.run_agents and self.store.capabilities.fleet is None

    @property
    def closing(self) -> bool:
        """Whether `close()` has begun: no new work is accepted and agents stop at their next boundary."""
        return self.admission.closing

    async def agents(self) -> list[AgentInfo]:
        """Every agent with whether it owes work."""
        async with self.store.transaction() as tx:
            rows = await tx.list_agents()
            # R1: an unreadable pending record counts as absent (as it does for restore)
            owing = {row.id for row, raw in await tx.agents_owing_work() if Pending.decode(raw) is not None}
        return [AgentInfo(r.id, r.name, active and r.id in owing, r.created_at) for r, active in rows]

    async def delete(self, agent_id: str) -> None:
        """Stop the agent (abort its turn) and remove it with its history and state."""
        self._check_writable()
        rt = self._runtimes.get(agent_id)
        if rt is not None:
            await rt.abort()
            rt.drain()
            await rt.wait_stopped()
            rt.closed = True
            rt.close_streams()
        async with self.store.transaction() as tx:
            existed = await tx.delete_agent(agent_id)
            if existed and self.fleet is not None:
                tx.after_commit(lambda: self.fleet.forget(agent_id) if self.fleet is not None else None)
            if existed and self._env.hooks.wants("agent_deleted_tx"):
                # layers' rows about the agent go in the same transaction as the agent
                ctx = HookContext(agent_id, rt.config.name if rt is not None else None, self.store, tx=tx)
                await self._env.hooks.agent_deleted_tx(ctx)
        self._runtimes.pop(agent_id, None)
        if not existed:
            raise AgentNotFound(f"no agent with id {agent_id!r}")

    # ------------------------------------------------------------------ restore / close
    async def _restore(self, only: Collection[str] | None = None) -> None:
        """R1/R3: start every agent whose pending record exists (or only those in `only`), reading only
        small records."""
        async with self.store.transaction() as tx:
            owing = await tx.agents_owing_work()
        for row, raw in owing:
            if only is not None and row.id not in only:
                continue
            pending = Pending.decode(raw)
            if pending is None:
                continue
            rt = AgentRuntime(row.id, AgentConfig.decode(row.config), self._env)
            self._runtimes[row.id] = rt
            self.restored.append(row.id)
            rt.restore(pending)
        self._log_restored()

    def _log_restored(self) -> None:
        if self.restored:
            # visible on purpose: opening a store as its owner runs the work its agents still owe
            shown = ", ".join(
                f"{aid} ({self._runtimes[aid].config.name})" if self._runtimes[aid].config.name else aid
                for aid in self.restored
            )
            log.info("resumed %d agent(s) that owe work: %s", len(self.restored), shown)

    async def drain(self) -> None:
        """Stop every agent before its next provider request; durable work stays for the next owner."""
        for rt in list(self._runtimes.values()):
            rt.drain()
        await asyncio.gather(*(rt.wait_stopped() for rt in list(self._runtimes.values())))

    async def close(self) -> None:
        """Refuse new work, finish admitted acceptances, drain every agent, close the plugins, release the
        store.

        From inside an agent's own loop (a tool, a hook) this raises `CloseFromInside` instead of waiting
        on itself; the close still happens once that agent's turn ends."""
        if inside_agent.get() is not None:
            if not self.closing:
                self.admission.closing = True
                self._background = asyncio.get_running_loop().create_task(self._close())
            raise CloseFromInside(
                "close() was called from inside an agent's own loop; it will complete "
                "after the current turn instead of waiting on itself"
            )
        if self.closing:
            await self._closed.wait()
            return
        self.admission.closing = True
        await self._close()

    async def _close(self) -> None:
        try:
            await self.admission.wait_flushed()
            if self.fleet is not None:
                await self.fleet.stop()  # W4: drain, then hand every owned agent to the fleet
            await self.drain()
            for rt in self._runtimes.values():
                rt.closed = True
                rt.close_streams()
            await self._stop_plugins()
            await self.router.aclose()  # the HTTP clients of drivers built for catalog routes
            await self.store.close()
        finally:
            self._closed.set()

    async def _start(self, restore: bool | Collection[str]) -> None:
        """Start the plugins in order, then restore the agents that owe work (`restore=False`: none; a
        collection of ids: only those); a failure stops the started plugins and closes the store."""
        try:
            await self._start_plugins()
            if self.readonly or not self.run_agents:
                pass  # an inspector or a client never runs anything
            elif self.fleet is not None:
                only = None if restore is True or restore is False else set(restore)
                self.restored = await self.fleet.start(only)
                self._log_restored()
            elif restore is True:
                await self._restore()
            elif restore:
                await self._restore(only=set(restore))
        except BaseException:
            await self._stop_plugins()
            await self.store.close()
            raise

    async def _start_plugins(self) -> None:
        for p in self._plugins:
            await p.start(self)
            self._started.append(p)

    async def _stop_plugins(self) -> None:
        """Close started plugins in reverse order; a failing close is logged and never stops the others."""
        while self._started:
            p = self._started.pop()
            try:
                await p.close(self)
            except Exception:
                log.exception("closing plugin %r failed (ignored)", p.name)

    def abandon(self) -> None:
        """Drop everything in memory without writing (tests: after an injected store crash)."""
        self.admission.closing = True
        if self.fleet is not None:
            self.fleet.kill()
        for rt in self._runtimes.values():
            rt.kill()
            rt.closed = True
        self._closed.set()

    # ------------------------------------------------------------------ run records (docs/observability.md)
    def _run_reader(self) -> RunReader:
        return self._provider_of(
            RunReader, "run records are off: open the system with records=True (the default)"
        )

    async def runs(self, agent_id: str | None = None, limit: int = 50) -> list[Run]:
        """Recorded runs, newest first (optionally of one agent), without steps or children."""
        return await self._run_reader().runs(agent_id, limit)

    async def run(self, run_id: str) -> Run:
        """One recorded run with its steps and child runs (recursively); raises `stead.RunNotFound`."""
        return await self._run_reader().run(run_id)

    # ------------------------------------------------------------------ approvals (docs/approvals.md)
    def _approval_source(self) -> ApprovalSource:
        return self._provider_of(ApprovalSource, "approvals are off: open the system with approvals=True")

    async def approvals(
        self,
        status: ApprovalStatus | None = "pending",
        agent_id: str | None = None,
        root_run_id: str | None = None,
    ) -> list[Approval]:
        """Approvals, oldest first: `status=None` lists every status; `agent_id` one agent's;
        `root_run_id` everything a root run waits on (its sub-agents' approvals included)."""
        return await self._approval_source().approvals(status, agent_id=agent_id, root_run_id=root_run_id)

    async def approval(self, approval_id: str) -> Approval:
        """One approval; raises `stead.NotFound`."""
        return await self._approval_source().approval(approval_id)

    async def approve(
        self,
        approval_id: str,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        *,
        decided_by: str | None = None,
    ) -> Decision:
        """Approve: the call runs once, under its tool's own flags — with `arguments` instead of the
        model's when given (validated against the tool's schema first: `stead.InvalidInput`, nothing
        written). The first decision wins: a repeated or different later decision returns the stored one
        with `decided=False`."""
        self._check_writable()
        return await self._approval_source().approve(
            approval_id, note=note, arguments=arguments, decided_by=decided_by
        )

    async def reject(
        self, approval_id: str, note: str | None = None, *, decided_by: str | None = None
    ) -> Decision:
        """Reject: the call never runs; its error result "rejected by reviewer: NOTE" commits with the
        decision. The first decision wins (see `approve`)."""
        self._check_writable()
        return await self._approval_source().reject(approval_id, note=note, decided_by=decided_by)


def _options_items(options: ModelOptions | Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, ModelOptions):
        return options.items()
    return dict(options)


def _context_items(context: ContextPolicy | Mapping[str, Any] | None) -> dict[str, Any]:
    if context is None:
        return {}
    if isinstance(context, ContextPolicy):
        return {k: v for k, v in dataclasses.asdict(context).items() if v is not None}
    if not isinstance(context, Mapping):
        raise ConfigurationError(f"context must be a stead.ContextPolicy or a mapping, not {context!r}")
    return dict(context)


def _register_tools(into: dict[str, Tool], tools: Iterable[Tool | Callable[..., Any]]) -> None:
    """Add tools by name; the same tool twice is kept once, two different tools of one name are refused."""
    for t in tools:
        t_obj = t if isinstance(t, Tool) else tool(t)
        known = into.get(t_obj.name)
        if known is not None:
            if known is t_obj or known.fn is t_obj.fn:
                continue
            raise ConfigurationError(f"two tools are named {t_obj.name!r}")
        into[t_obj.name] = t_obj
