"""`AgentSystem`: owns one store; creates, finds, restores and deletes agents; closes cleanly.

Opening restores exactly the agents that owe work, by reading their small pending records — never their
transcripts (R3). Acceptances from concurrent callers are grouped into one transaction (group commit),
each in its own savepoint, so a hundred concurrent senders cost one commit, and a failing one refuses only
itself.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, cast

from stead._ids import ID_RULE, is_valid_user_id, new_id
from stead.agent import Agent
from stead.core.config import AgentConfig, Env, QueueMode, RetryPolicy
from stead.core.hooks import Hooks, HookSet
from stead.core.records import PENDING, SETTINGS, Pending
from stead.core.runtime import AgentRuntime, Inbound, inside_agent
from stead.errors import (
    AgentNotFound,
    Closed,
    CloseFromInside,
    ConfigurationError,
    InvalidId,
    InvalidInput,
    ReadOnly,
    StoreError,
)
from stead.observability import Run, RunRecorder, get_run, list_runs
from stead.providers.base import Provider
from stead.routing import ModelRouter
from stead.store import Faults, Store, open_store
from stead.store.base import AgentRow
from stead.tools._tool import Tool, tool

if TYPE_CHECKING:
    from stead.definitions import Registry
    from stead.orchestration import OrchestrationHooks, Orchestrator

__all__ = ["AgentInfo", "AgentSystem", "Opening", "open"]

log = logging.getLogger("stead.system")
P = ParamSpec("P")


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
        self, store: Store, env: Env, router: ModelRouter | None = None, *, readonly: bool = False
    ) -> None:
        self.store = store
        self.readonly = readonly
        """Opened with `readonly=True`: an inspector that reads what an owner commits and writes nothing."""
        self._env = env
        self.router = router or ModelRouter(env.providers)
        self._runtimes: dict[str, AgentRuntime] = {}
        self._closing = False
        self._closed = asyncio.Event()
        self._pending_accepts: list[tuple[AgentRuntime, list[Inbound], asyncio.Future[list[bool]]]] = []
        self._flush_task: asyncio.Task[None] | None = None
        self._inflight = 0
        self.restored: list[str] = []
        self._orchestrator: Orchestrator | None = None

    async def __aenter__(self) -> AgentSystem:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ registry
    @property
    def tools(self) -> dict[str, Tool]:
        return self._env.tools

    @property
    def providers(self) -> dict[str, Provider]:
        return self._env.providers

    @property
    def orchestrator(self) -> Orchestrator:
        """Definitions, delegation and guardrails (`stead.open(definitions=...)`)."""
        if self._orchestrator is None:
            from stead.orchestration import Orchestrator as _Orchestrator

            self._orchestrator = _Orchestrator(None)
            self._orchestrator.bind(self)
        return self._orchestrator

    def _check_open(self) -> None:
        if self._closing:
            raise Closed("the agent system is closed")
        self._check_writable()

    def _check_writable(self) -> None:
        if self.readonly:
            raise ReadOnly(
                f"{self.store.url} was opened with readonly=True (for inspection): agents, history and "
                "runs can be read; creating agents, sending, steering, resuming and deleting are refused"
            )

    def _check_provider(self, name: str, model: Any) -> None:
        self.router.check(name, model)

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
        extra: dict[str, Any] | None = None,
        definition: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> Agent:
        """Create an agent. Unknown providers or tools and malformed or taken ids are refused, unwritten.

        `definition="name"` builds it from a definition of the registry given to `stead.open(definitions=)`:
        its model, its instructions rendered with `data`, its tools, its sub-agents (as tools) and limits."""
        self._check_open()
        if definition is not None:
            if provider is not None or model is not None or instructions or tools or extra:
                raise ConfigurationError(
                    "create(definition=...) takes its provider, model, instructions, tools and extra from "
                    "the definition; do not pass them too"
                )
            kwargs = self.orchestrator.config_for(definition, data=data)
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
        provider = self.router.provider_name(provider, model)
        if model is None:
            model = "default"
        self._check_provider(provider, model)
        unknown = [t for t in tools if t not in self._env.tools]
        if unknown:
            known = ", ".join(sorted(self._env.tools)) or "none"
            raise ConfigurationError(f"unknown tool(s) {', '.join(unknown)}; registered tools: {known}")
        for mode in (steering_mode, send_mode):
            if mode not in ("one-at-a-time", "all"):
                raise InvalidInput(f"queue mode must be 'one-at-a-time' or 'all', not {mode!r}")
        from stead.core.config import PERMISSION_MODES

        if permission_mode not in PERMISSION_MODES:
            raise InvalidInput(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}")
        config = AgentConfig(
            provider=provider,
            model=model if isinstance(model, str) else list(model),
            instructions=instructions,
            tools=list(tools),
            name=name,
            steering_mode=cast(QueueMode, steering_mode),
            send_mode=cast(QueueMode, send_mode),
            permission_mode=permission_mode,
            max_tool_concurrency=max_tool_concurrency,
            extra=dict(extra or {}),
        )
        aid = agent_id or new_id()
        async with self.store.transaction() as tx:
            if not await tx.insert_agent(AgentRow(aid, name, config.encode(), time.time())):
                raise InvalidInput(f"an agent with id {aid} already exists")
        rt = AgentRuntime(aid, config, self._env)
        self._runtimes[aid] = rt
        return Agent(self, rt)

    async def get(self, agent_id: str, *, resume: bool = False) -> Agent:
        """The agent with this id; raises `AgentNotFound`.

        With `resume=True`, an agent that owes work and is not running in this process (the store was
        opened with `restore=False`, or it was not in the `restore=` list) is started, as a restore would."""
        if resume:
            self._check_writable()
        rt = self._runtimes.get(agent_id)
        pending: Pending | None = None
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
            rt = self._runtimes.get(agent_id)
            if rt is None:
                rt = self._runtimes[agent_id] = AgentRuntime(
                    agent_id, AgentConfig.decode(row.config), self._env
                )
                if settings:
                    rt._settings = json.loads(settings)
                if resume and pending is not None and not self._closing:
                    rt.restore(pending)
        return Agent(self, rt)

    @property
    def closing(self) -> bool:
        """Whether `close()` has begun: no new work is accepted and agents stop at their next boundary."""
        return self._closing

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
        self._runtimes.pop(agent_id, None)
        if not existed:
            raise AgentNotFound(f"no agent with id {agent_id!r}")

    # ------------------------------------------------------------------ acceptance (group commit)
    async def _accept(self, rt: AgentRuntime, items: list[Inbound]) -> list[bool]:
        rt.check_open()
        rt.begin_accept()
        self._inflight += 1
        try:
            outer = self.store.current()
            if outer is not None:
                # A6: inside the caller's transaction; published when (and only if) the caller commits
                return [await rt.accept(outer, item) for item in items]
            fut: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
            self._pending_accepts.append((rt, items, fut))
            if self._flush_task is None:
                self._flush_task = asyncio.get_running_loop().create_task(self._flush())
            return await fut
        finally:
            self._inflight -= 1
            rt.end_accept()

    async def _flush(self) -> None:
        """Commit every acceptance submitted so far in one transaction (group commit).

        Optimistically the whole group commits without savepoints; if one acceptance fails (a refusing
        activation hook, a store error), the group is rolled back and retried with each sender in its own
        savepoint, so a failure refuses only its own sender."""
        await asyncio.sleep(0)  # one scheduling round: concurrent senders join this commit
        batch, self._pending_accepts = self._pending_accepts, []
        self._flush_task = None
        try:
            try:
                outcomes = await self._commit_group(batch, isolate=False)
            except Exception:
                if len(batch) == 1:
                    raise
                outcomes = await self._commit_group(batch, isolate=True)
        except BaseException as e:
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else StoreError(str(e)))
            if not isinstance(e, Exception):
                raise
            return
        for (_, _, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    async def _commit_group(
        self, batch: list[tuple[AgentRuntime, list[Inbound], asyncio.Future[list[bool]]]], *, isolate: bool
    ) -> list[list[bool] | BaseException]:
        outcomes: list[list[bool] | BaseException] = []
        async with self.store.transaction() as tx:
            for rt, items, _ in batch:
                if not isolate:
                    outcomes.append([await rt.accept(tx, item) for item in items])
                    continue
                try:
                    async with tx.savepoint():
                        created = [await rt.accept(tx, item) for item in items]
                    # only once the savepoint is released (a failing RELEASE refuses this sender)
                    outcomes.append(created)
                except Exception as e:
                    outcomes.append(e)
        return outcomes

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
        """Refuse new work, finish admitted acceptances, drain every agent, release the store.

        From inside an agent's own loop (a tool, a hook) this raises `CloseFromInside` instead of waiting
        on itself; the close still happens once that agent's turn ends."""
        if inside_agent.get() is not None:
            if not self._closing:
                self._closing = True
                task = asyncio.get_running_loop().create_task(self._close())
                self._background = task
            raise CloseFromInside(
                "close() was called from inside an agent's own loop; it will complete "
                "after the current turn instead of waiting on itself"
            )
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        await self._close()

    async def _close(self) -> None:
        try:
            while self._flush_task is not None or self._pending_accepts:
                task = self._flush_task
                if task is not None:
                    await asyncio.wait([task])
                else:
                    await asyncio.sleep(0)
            await self.drain()
            for rt in self._runtimes.values():
                rt.closed = True
                rt.close_streams()
            await self.router.aclose()  # the HTTP clients of drivers built for catalog routes
            await self.store.close()
        finally:
            self._closed.set()

    def abandon(self) -> None:
        """Drop everything in memory without writing (tests: after an injected store crash)."""
        self._closing = True
        for rt in self._runtimes.values():
            rt.kill()
            rt.closed = True
        self._closed.set()

    # ------------------------------------------------------------------ run records (DESIGN §8)
    async def runs(self, agent_id: str | None = None, limit: int = 50) -> list[Run]:
        """Recorded runs, newest first (optionally of one agent), without steps or children."""
        return await list_runs(self.store, agent_id, limit)

    async def run(self, run_id: str) -> Run:
        """One recorded run with its steps and child runs (recursively); raises `stead.RunNotFound`."""
        return await get_run(self.store, run_id)


class Opening:
    """What `stead.open(...)` returns: awaitable (`system = await stead.open(...)`) and an async context
    manager (`async with stead.open(...) as system:`, which closes the system on exit), as aiosqlite's
    `connect` is. `async with await stead.open(...)` works too: the system is its own context manager."""

    __slots__ = ("_coro", "_system")

    def __init__(self, coro: Coroutine[Any, Any, AgentSystem]) -> None:
        self._coro = coro
        self._system: AgentSystem | None = None

    def __await__(self) -> Generator[Any, None, AgentSystem]:
        return self._coro.__await__()

    async def __aenter__(self) -> AgentSystem:
        self._system = await self._coro
        return self._system

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._system is not None:
            await self._system.close()


def _opening(fn: Callable[P, Coroutine[Any, Any, AgentSystem]]) -> Callable[P, Opening]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Opening:
        return Opening(fn(*args, **kwargs))

    return wrapper


@_opening
async def open(
    url: str = "sqlite:///stead.db",
    *,
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
) -> AgentSystem:
    """Open (or create) the store at `url`, register providers and tools, and restore every agent that
    owes work (`restore=False`: none; a collection of ids: only those). Resumed agents are logged (INFO,
    logger `stead.system`): opening as the owner runs the work they owe, model calls included. Raises
    `stead.StoreLocked` at once if another process owns the store.

    `readonly=True` opens it for inspection instead, also while another process owns it: no ownership
    lock, nothing created or migrated, no agent restored (whatever `restore` says), no model called;
    `agents()`, `get(id)`, `agent.history()`, `runs()` and `run(id)` read every change the owner has
    committed (each read is a fresh read transaction); every write is refused with
    `stead.errors.ReadOnly`.

    The result can be awaited or used directly as `async with stead.open(...) as system:`.

    `records=True` (the default) installs a `RunRecorder` (run records, `system.runs()`) unless `hooks`
    already holds one; `tracer_provider=` installs `TracingHooks` (OpenTelemetry GenAI spans).

    `definitions=` (a directory of agent definitions, or a `stead.definitions.Registry`) enables
    `system.create(definition=...)`: the definitions' tools and scripted models are registered, each
    definition becomes a delegation tool for the agents that list it as a sub-agent (at most
    `max_concurrent_delegations` running per parent, `max_delegation_depth` levels deep), and runtime changes
    and guardrails are installed (`clock` measures wall time for `limits.max_wall_seconds`)."""
    orchestrator: Orchestrator | None = None
    orchestration_hooks: OrchestrationHooks | None = None
    if definitions is not None:
        from stead.definitions import Registry, load_registry
        from stead.orchestration import OrchestrationHooks as _Hooks
        from stead.orchestration import Orchestrator as _Orchestrator

        registry = definitions if isinstance(definitions, Registry) else load_registry(definitions)
        orchestrator = _Orchestrator(
            registry,
            max_concurrent_delegations=max_concurrent_delegations,
            max_delegation_depth=max_delegation_depth,
            clock=clock,
        )
        providers = {**orchestrator.providers(), **(providers or {})}
        user_tools = [t if isinstance(t, Tool) else tool(t) for t in tools]
        by_name = {t.name: t for t in user_tools}
        for d_tool in orchestrator.tools():
            mine = by_name.get(d_tool.name)
            if mine is not None and mine.fn is not d_tool.fn and orchestrator.is_sub_agent(d_tool.name):
                raise ConfigurationError(
                    f"tool {d_tool.name!r} has the name of a definition (a sub-agent tool)"
                )
        tools = [*user_tools, *(t for t in orchestrator.tools() if t.name not in by_name)]
        orchestration_hooks = _Hooks(
            orchestrator.clock, lambda: any(isinstance(h, RunRecorder) for h in env.hooks.hooks)
        )
    tool_map: dict[str, Tool] = {}
    for t in tools:
        t_obj = t if isinstance(t, Tool) else tool(t)
        if t_obj.name in tool_map:
            raise ConfigurationError(f"two tools are named {t_obj.name!r}")
        tool_map[t_obj.name] = t_obj
    hook_list: list[Hooks] = [] if hooks is None else ([hooks] if isinstance(hooks, Hooks) else list(hooks))
    if records and not any(isinstance(h, RunRecorder) for h in hook_list):
        hook_list.insert(0, RunRecorder(orchestrator.is_sub_agent if orchestrator is not None else None))
    if orchestration_hooks is not None:
        hook_list.append(orchestration_hooks)
    if tracer_provider is not None:
        from stead.observability.tracing import TracingHooks

        if not any(isinstance(h, TracingHooks) for h in hook_list):
            hook_list.append(TracingHooks(tracer_provider))
    migrations: dict[str, list[str]] = {}
    for h in hook_list:
        for module, scripts in type(h).migrations.items():
            if module in migrations and migrations[module] != scripts:
                raise ConfigurationError(f"two hooks declare different migrations for module {module!r}")
            migrations[module] = list(scripts)
    store = await open_store(url, faults=faults, migrations=migrations, readonly=readonly)
    router = ModelRouter(providers or {})
    env = Env(
        store=store,
        providers=dict(providers or {}),
        tools=tool_map,
        hooks=HookSet(hook_list),
        retry=retry or RetryPolicy(),
        max_payload_bytes=max_payload_bytes,
    )
    env.resolve_provider = router.provider_for
    env.compatible = router.compatible
    system = AgentSystem(store, env, router, readonly=readonly)
    if orchestrator is not None:
        orchestrator.bind(system)
        system._orchestrator = orchestrator
    if orchestration_hooks is not None:
        orchestration_hooks.bind(system)
    try:
        if readonly:
            pass  # an inspector never runs anything
        elif restore is True:
            await system._restore()
        elif restore:
            await system._restore(only=set(restore))
    except BaseException:
        await store.close()
        raise
    return system
