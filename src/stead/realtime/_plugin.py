"""The realtime layer as a plugin: `RealtimePlugin` opens realtime sessions for `system.realtime(...)`.

    system = await stead.open(url, definitions="examples/team", plugins=[RealtimePlugin()])
    session = await system.realtime(definition="voice")

Realtime definitions (`type: realtime`) come from the system's definitions (`stead.open(definitions=)`)
or from the plugin's own `definitions=` directory; their `target_agents` must be loop definitions of the
system's registry (the orchestration plugin builds the children). The plugin brings its tables (SQLite and
PostgreSQL migrations) and uses only public seams: the orchestrator's `config_for`, `system.create/get/
run/runs`, the store's transactions and `stead.extend`'s run-record helpers.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from stead.definitions import AgentDefinition, Registry, load_registry, render_instructions
from stead.extend import (
    ConfigurationError,
    HookContext,
    Hooks,
    InvalidInput,
    Migrations,
    Plugin,
    end_run,
    new_id,
    record_run,
    record_step,
)
from stead.orchestration import Orchestrator, orchestrator_of
from stead.realtime._broker import Broker, Delegation
from stead.realtime._clock import Clock, SystemClock
from stead.realtime._config import effective_settings
from stead.realtime._models import ModelFactory, resolve_realtime
from stead.realtime._protocol import SessionConfig
from stead.realtime._session import INVOKE, RealtimeSession, _Identity, tool_specs
from stead.realtime._store import DELEGATION_COLS, MIGRATIONS

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = ["RealtimePlugin"]

FRAMING = (
    "You talk with the user in real time. Real work is done by durable agents: call "
    f"{INVOKE} with a self-contained request. It returns at once with status 'started': tell the user "
    "briefly that the work has started and keep the conversation going. The result arrives later as a "
    "system message starting with [stead]; only then tell the user the result. Never make up results or "
    "progress."
)


class RealtimePlugin(Plugin):
    """Realtime co-agents: duplex sessions that hand work to durable agents (docs/realtime.md).

    `definitions`: a directory (or `Registry`) of realtime definitions besides the system's own;
    `models`: realtime models by prefix (`{"mine": factory}` serves `model: mine:anything`); `clock`: time
    for narration pacing and usage debouncing (tests inject a fake); `narration_poll`: seconds between
    reads of the children's progress; `usage_debounce`: seconds between usage checkpoints; `env`: where keys
    are looked up (default `os.environ`)."""

    name: ClassVar[str] = "realtime"
    migrations: ClassVar[Migrations] = MIGRATIONS

    def __init__(
        self,
        definitions: str | os.PathLike[str] | Registry | None = None,
        *,
        models: Mapping[str, ModelFactory] | None = None,
        clock: Clock | None = None,
        narration_poll: float = 1.0,
        usage_debounce: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._given = definitions
        self.models = dict(models or {})
        self.clock: Clock = clock or SystemClock()
        self.narration_poll = narration_poll
        self.usage_debounce = usage_debounce
        self.env = env
        self.registry: Registry | None = None
        self.sessions: dict[str, RealtimeSession] = {}
        """The sessions open in this process, by id."""
        self._system: AgentSystem | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self, system: AgentSystem) -> None:
        self._system = system
        if self._given is not None:
            self.registry = self._given if isinstance(self._given, Registry) else load_registry(self._given)
        for definition in self._realtime_definitions(system):
            self._targets(system, definition)  # refuse unknown targets when the system opens

    async def close(self, system: AgentSystem) -> None:
        for session in list(self.sessions.values()):
            await session.close()

    def hooks(self) -> Iterable[Hooks]:
        return (_DeletedAgents(self),)

    def _orchestrator(self, system: AgentSystem) -> Orchestrator:
        try:
            return orchestrator_of(system)
        except ConfigurationError:
            raise ConfigurationError(
                "realtime agents hand work to agents of a definitions directory: open the system with "
                "definitions=DIR (the directory of the target agents)"
            ) from None

    def _realtime_definitions(self, system: AgentSystem) -> list[AgentDefinition]:
        found = [d for d in (self.registry or {}).values() if d.type == "realtime"]
        if system.has_plugin("orchestration"):
            found += [d for d in self._orchestrator(system).registry.values() if d.type == "realtime"]
        return found

    def definition(self, system: AgentSystem, name: str) -> AgentDefinition:
        for registry in (self.registry, self._orchestrator(system).registry):
            if registry is not None and name in registry:
                d = registry[name]
                if d.type != "realtime":
                    raise ConfigurationError(
                        f"definition {name!r} has type {d.type!r}; "
                        "system.realtime() needs a 'type: realtime' one"
                    )
                return d
        known = sorted(d.name for d in self._realtime_definitions(system))
        raise ConfigurationError(
            f"no realtime definition named {name!r} (realtime definitions: {', '.join(known) or 'none'})"
        )

    def _targets(self, system: AgentSystem, definition: AgentDefinition) -> list[AgentDefinition]:
        registry = self._orchestrator(system).registry
        out = []
        for name in definition.target_agents:
            target = registry.get(name)
            where = f"{definition.source}: " if definition.source is not None else ""
            if target is None:
                raise ConfigurationError(
                    f"{where}target_agents: unknown agent {name!r}; "
                    f"definitions: {', '.join(sorted(registry))}"
                )
            if target.type != "loop":
                raise ConfigurationError(
                    f"{where}target_agents: {name!r} is a {target.type} agent, not a loop agent"
                )
            out.append(target)
        return out

    # ------------------------------------------------------------------ sessions
    async def open_session(
        self,
        system: AgentSystem,
        definition: str,
        *,
        session_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> RealtimeSession:
        d = self.definition(system, definition)
        targets = self._targets(system, d)
        settings = effective_settings(d, targets, overrides)
        choice = resolve_realtime(
            settings.model, base_dir=d.base_dir, clock=self.clock, registered=self.models, env=self.env
        )
        orchestrator = self._orchestrator(system)
        if session_id is not None:
            if not session_id.strip() or len(session_id) > 128:
                raise InvalidInput("session_id must be a non-empty string of at most 128 characters")
            if session_id in self.sessions:
                raise InvalidInput(f"realtime session {session_id} is already open in this process")
        identity, adopted = await self._open_records(system, d, session_id, choice.spec)
        extra = d.resolved_tools
        context = {
            "agent": {"name": d.name, "description": d.description or ""},
            "tools": [{"name": t.name, "description": t.description} for t in extra],
            "sub_agents": [{"name": t.name, "description": t.description or ""} for t in targets],
            "data": {},
        }
        instructions = "\n\n".join(p for p in (FRAMING, render_instructions(d, context).strip()) if p)
        config = SessionConfig(
            instructions=instructions,
            tools=tool_specs(
                [t.name for t in targets], {t.name: t.description or "" for t in targets}, extra
            ),
            output=settings.output,
            voice=settings.voice,
            transcription=settings.transcription,
            turn_detection=settings.turn_detection,
            extra=dict(settings.session),
        )
        broker = Broker(system, orchestrator, agent_id=identity.agent_id, agent_name=d.name)
        session = RealtimeSession(
            system,
            identity=identity,
            definition=d,
            settings=settings,
            choice=choice,
            config=config,
            targets=[t.name for t in targets],
            tools={t.name: t for t in extra},
            broker=broker,
            clock=self.clock,
            poll=self.narration_poll,
            debounce=self.usage_debounce,
            on_close=self._forget,
        )
        self.sessions[identity.session_id] = session
        try:
            await session.start(adopted)
        except BaseException:
            await session._stop("failed", "the session could not start")
            raise
        return session

    def _forget(self, session: RealtimeSession) -> None:
        self.sessions.pop(session.id, None)

    async def _open_records(
        self, system: AgentSystem, d: AgentDefinition, session_id: str | None, model: str
    ) -> tuple[_Identity, list[Delegation]]:
        """In one transaction: the realtime agent's id, the session row (new or reopened), its run record with
        one long-lived prompt step; sessions of this agent left open by a process that stopped are closed
        as `dropped` and their undelivered delegations adopted by this session."""
        now = time.time()
        live = set(self.sessions)
        async with system.store.transaction() as tx:
            await tx.execute(
                "INSERT INTO realtime_agents(name, agent_id, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO NOTHING",
                (d.name, new_id(), now),
            )
            ((agent_id,),) = await tx.fetch("SELECT agent_id FROM realtime_agents WHERE name = ?", (d.name,))
            sid = session_id or new_id()
            next_seq = 1
            rows = await tx.fetch(
                "SELECT agent_id, status, run_id FROM realtime_sessions WHERE id = ?", (sid,)
            )
            run_id = new_id()
            if rows:
                if rows[0][0] != agent_id:
                    raise InvalidInput(f"session {sid} belongs to another realtime agent")
                if rows[0][1] == "open":  # left open by a process that stopped
                    await end_run(tx, rows[0][2], status="failed", error="the session's process stopped")
                (seq,) = await tx.fetch(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM realtime_transcripts WHERE session_id = ?", (sid,)
                )
                next_seq = int(seq[0])
            await record_run(tx, run_id, agent_id, agent_name=d.name, session_id=sid, started_at=now)
            step_id = await record_step(tx, run_id, "prompt", "session", status="running", target=model)
            if rows:
                await tx.execute(
                    "UPDATE realtime_sessions SET run_id = ?, prompt_step_id = ?, model = ?, "
                    "status = 'open', "
                    "ended_at = NULL, error = NULL WHERE id = ?",
                    (run_id, step_id, model, sid),
                )
            else:
                await tx.execute(
                    "INSERT INTO realtime_sessions(id, agent_id, agent_name, run_id, prompt_step_id, model, "
                    "status, "
                    "started_at) VALUES (?, ?, ?, ?, ?, ?, 'open', ?)",
                    (sid, agent_id, d.name, run_id, step_id, model, now),
                )
            dead = await tx.fetch(
                "SELECT id, run_id FROM realtime_sessions WHERE agent_id = ? AND status = 'open' AND id <> ?",
                (agent_id, sid),
            )
            for other, other_run in dead:
                if other in live:
                    continue
                await tx.execute(
                    "UPDATE realtime_sessions SET status = 'dropped', ended_at = ?, "
                    "error = 'the session''s process stopped' WHERE id = ?",
                    (now, other),
                )
                await end_run(tx, other_run, status="failed", error="the session's process stopped")
            rows = await tx.fetch(
                f"SELECT {DELEGATION_COLS} FROM realtime_delegations "
                "WHERE agent_id = ? AND delivered_at IS NULL "
                "ORDER BY created_at, id",
                (agent_id,),
            )
            adopted: list[Delegation] = []
            for row in rows:
                dl = Delegation.from_row(row)
                if dl.session_id in live:
                    continue
                if dl.session_id != sid:
                    await tx.execute(
                        "UPDATE realtime_delegations SET session_id = ? WHERE id = ?", (sid, dl.id)
                    )
                    dl.session_id = sid
                adopted.append(dl)
        return _Identity(sid, agent_id, d.name, run_id, step_id, next_seq), adopted


class _DeletedAgents(Hooks):
    """SEC2: a deleted agent's realtime rows (its name, sessions, their transcripts and delegations) go in
    the deletion's transaction; a session of it still open here closes after the commit."""

    def __init__(self, plugin: RealtimePlugin) -> None:
        self.plugin = plugin
        self.closing: set[asyncio.Task[None]] = set()

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        tx, agent_id = ctx.tx, ctx.agent_id
        if tx is None:
            return
        sessions = "SELECT id FROM realtime_sessions WHERE agent_id = ?"
        await tx.write_sql(f"DELETE FROM realtime_transcripts WHERE session_id IN ({sessions})", (agent_id,))
        for table in ("realtime_delegations", "realtime_sessions", "realtime_agents"):
            await tx.write_sql(f"DELETE FROM {table} WHERE agent_id = ?", (agent_id,))
        open_here = [s for s in self.plugin.sessions.values() if s.agent_id == agent_id]
        if open_here:
            tx.after_commit(lambda: self._close(open_here))

    def _close(self, sessions: list[RealtimeSession]) -> None:
        for session in sessions:
            task = asyncio.get_running_loop().create_task(session.close())
            self.closing.add(task)
            task.add_done_callback(self.closing.discard)


def realtime_plugin_of(system: AgentSystem) -> RealtimePlugin:
    plugin = system.plugin("realtime")
    if not isinstance(plugin, RealtimePlugin):
        raise ConfigurationError("the plugin named 'realtime' is not a stead.realtime.RealtimePlugin")
    return plugin
