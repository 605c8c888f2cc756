"""Worker mode on PostgreSQL: a fleet of processes sharing one database, each agent run by one of them.

Safety is the store's: every transaction that touches an agent this process holds checks its epoch in the
database (`stead_fence`), and a moved epoch raises `LeaseLost`, which stops that agent's loop here for good
(`AgentRuntime.disown`: nothing more is written or emitted, the mirror is dropped, nothing is retried).
This module only gives liveness (docs/postgres.md):

- register a fresh worker id per process start; heartbeat every `heartbeat` seconds on the event loop (the
  database clock decides). A heartbeat that finds this worker evicted stops every loop and re-registers.
- sweep every `sweep` seconds ± 20 %: workers silent for `lease_ttl` seconds are evicted and their agents
  released with `epoch + 1`; then claim owed, unowned agents up to `capacity`. Idle agents stay with their
  worker (sticky) until it drains or is over capacity.
- one dedicated autocommit LISTEN connection (`stead_w_<worker hex>`: an acceptor woke an agent this worker
  owns; `stead_claim`: owed work is unowned), with a poll every `poll` seconds as the fallback (a dropped
  listener, PgBouncer) and a rescan of owned agents after every (re)connect.
- a graceful stop drains every agent before its next provider request, then releases it (`epoch + 1`,
  `stead_claim` notified) so another worker continues at once.

The fleet never imports `stead.system`; the system hands it its runtimes, its environment and whether it
is closing (`FleetHost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from stead.core import records as R
from stead.core.config import AgentConfig, Env
from stead.core.records import Pending
from stead.core.runtime import AgentRuntime
from stead.errors import ConfigurationError, LeaseLost, StoreError
from stead.store.base import FleetLease, Store, Tx

__all__ = ["SESSION_PREFIX", "Fleet", "FleetConfig", "FleetHost", "notify_abort", "worker_channel"]

log = logging.getLogger("stead.fleet")

CLAIM_CHANNEL = "stead_claim"
SESSION_PREFIX = "stead-w-"
"""`application_name` of a worker's pooled sessions: this prefix and the worker's session tag."""
ABORT_PREFIX = "abort:"


def worker_channel(worker_id: str) -> str:
    """The LISTEN channel of one worker: `stead_w_` and its id's hex digits."""
    return "stead_w_" + worker_id.replace("-", "")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Liveness settings of one worker (docs/postgres.md, Defaults)."""

    lease_ttl: float = 10.0
    """A worker whose heartbeat is older than this is evicted and its agents move (epoch + 1)."""
    heartbeat: float = 2.0
    sweep: float = 2.0
    """Sweep (and claim) period; each wait is jittered ± 20 %."""
    capacity: int = 1000
    """At most this many agents owned at once."""
    poll: float = 2.0
    """Fallback rescan of owned agents and claim of unowned work, for missed or impossible notifications."""
    listen: bool = True
    """LISTEN for wake-ups (off behind PgBouncer transaction pooling: the poll alone then wakes agents)."""

    def __post_init__(self) -> None:
        for name in ("lease_ttl", "heartbeat", "sweep", "poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.capacity < 1:
            raise ValueError("capacity must be at least 1")
        if self.heartbeat >= self.lease_ttl:
            raise ValueError("heartbeat must be shorter than lease_ttl")


class FleetHost(Protocol):
    """What the fleet needs from its system."""

    @property
    def closing(self) -> bool: ...


class Fleet:
    """The worker side of one `AgentSystem` on PostgreSQL."""

    def __init__(
        self,
        host: FleetHost,
        store: Store,
        env: Env,
        runtimes: dict[str, AgentRuntime],
        config: FleetConfig | None = None,
        *,
        claim: bool = True,
        on_change: Callable[[str, str], None] | None = None,
        session_tag: str | None = None,
    ) -> None:
        lease = store.capabilities.fleet
        if lease is None:
            raise ConfigurationError(f"{store.dialect} stores do not serve worker fleets (no FleetLease)")
        self.host = host
        self.store = store
        self.lease: FleetLease = lease
        """The store's ownership primitives (`Store.capabilities.fleet`)."""
        self.env = env
        self.runtimes = runtimes
        self.config = config or FleetConfig()
        self.auto = claim
        """Claim owed work by itself (restore=True); otherwise only what it creates or is asked to run."""
        self.on_change = on_change
        self.session_tag = session_tag
        """The tag in the `application_name` of this worker's pooled sessions (also in its row's `host`)."""
        self.me: str = ""
        self.registrations = 0
        self.lease_losses = 0
        self.listening = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._rechecks: dict[str, asyncio.Task[None]] = {}
        self._wake_since: dict[str, int] = {}
        """Per agent, the newest `loop_runs` a pending wake-up request saw: a loop started after it has
        read everything committed before the request, so the request needs no further wake."""
        self._stopping = False
        env.lease_lost = self._lease_lost
        env.remote_abort = self._remote_abort
        env.pin_lease = lease.pin

    # ------------------------------------------------------------------ lifecycle
    async def start(self, only: Collection[str] | None = None) -> list[str]:
        """Register, claim what is owed (or only `only`), then run the background loops. Returns the ids
        of the agents this worker resumed."""
        await self._register()
        resumed: list[str] = []
        if only is not None:
            for aid in sorted(only):
                if await self.try_own(aid):
                    resumed.append(aid)
        elif self.auto:
            with contextlib.suppress(StoreError):
                # a restarted process takes over at once what its killed predecessor held
                await self._evict_vanished(0.0)
                await self.lease.sweep(self.config.lease_ttl)
            resumed = await self._claim()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeat_loop(), name="stead-fleet-heartbeat"),
            loop.create_task(self._sweep_loop(), name="stead-fleet-sweep"),
            loop.create_task(self._claim_loop(), name="stead-fleet-claim"),
        ]
        if self.config.listen:
            self._listener = loop.create_task(self._listen_loop(), name="stead-fleet-listen")
        return [a for a in resumed if self.runtimes[a].pending is not None]

    async def stop(self) -> None:
        """Graceful drain: every owned agent stops before its next provider request and is released to
        the fleet (`epoch + 1`), then the background loops end."""
        self._stopping = True
        for t in [*self._tasks, *([self._listener] if self._listener else [])]:
            if t.get_name() != "stead-fleet-heartbeat":
                t.cancel()
        owned = [rt for rt in self.runtimes.values() if rt.owned]
        for rt in owned:
            rt.drain()
        await asyncio.gather(*(rt.wait_stopped() for rt in owned))
        for t in list(self._rechecks.values()):
            t.cancel()
        released = 0
        for rt in owned:
            if not rt.owned:
                continue  # lost meanwhile
            try:
                await self.lease.release(rt.id)
                released += 1
                self._changed("released", rt.id)
            except StoreError as e:
                log.warning(
                    "worker %s: releasing agent %s failed (the sweep moves it): %s", self.me, rt.id, e
                )
            rt.disown(released=True)  # release() notified `stead_claim`: another worker continues
        for t in self._tasks:
            t.cancel()
        background = [*self._tasks, *([self._listener] if self._listener else [])]
        if background:
            # bounded: a loop stuck in the driver (a notification stream that does not end when cancelled)
            # must not keep the worker from stopping; what is left is cancelled with the event loop
            _, stuck = await asyncio.wait(background, timeout=5.0)
            for t in stuck:
                log.warning("worker %s: background task %s did not stop", self.me, t.get_name())
        self._tasks = []
        self._listener = None

    def kill(self) -> None:
        """Stop the background loops without writing anything (the system was abandoned)."""
        self._stopping = True
        for t in [*self._tasks, *([self._listener] if self._listener else []), *self._rechecks.values()]:
            t.cancel()

    def owned(self) -> list[str]:
        """The agents this worker runs now."""
        return sorted(aid for aid, rt in self.runtimes.items() if rt.owned)

    # ------------------------------------------------------------------ ownership
    async def _register(self) -> None:
        host = socket.gethostname() + (f"#{self.session_tag}" if self.session_tag else "")
        self.me = await self.lease.register_worker(host, os.getpid(), self.config.capacity)
        self.registrations += 1
        self._changed("registered", self.me)

    async def own_new(self, tx: Tx, agent_id: str) -> bool:
        """Inside the transaction creating `agent_id`: this worker owns it from the start (sticky)."""
        rows = await tx.fetch(
            "UPDATE agents SET owner = ?::uuid, epoch = epoch + 1, owned_since = now() "
            "WHERE id = ? AND owner IS NULL RETURNING epoch",
            (self.me, agent_id),
        )
        if rows:
            epoch = int(rows[0][0])
            tx.after_commit(lambda: self.lease.hold(agent_id, epoch))
            self._changed("created", agent_id)
        return bool(rows)

    async def try_own(
        self, agent_id: str, known: tuple[AgentConfig, Pending | None, str | None] | None = None
    ) -> bool:
        """Take `agent_id` if nobody live owns it and capacity allows, and start it if it owes work.
        `known`: its config, pending record and settings as the caller just read them (no second read:
        nobody else could have written them, the agent had no live owner)."""
        rt = self.runtimes.get(agent_id)
        if rt is not None and rt.owned:
            return True
        if len(self.owned()) >= self.config.capacity:
            return False
        async with self.store.transaction() as tx:
            rows = await tx.fetch(
                "UPDATE agents a SET owner = ?::uuid, epoch = a.epoch + 1, owned_since = now() "
                "WHERE a.id = ? AND (a.owner IS NULL OR a.owner = ?::uuid OR NOT EXISTS "
                "(SELECT 1 FROM stead_workers w WHERE w.id = a.owner AND w.state <> 'evicted')) "
                "RETURNING a.epoch",
                (self.me, agent_id, self.me),
            )
        if not rows:
            return False
        self.lease.hold(agent_id, int(rows[0][0]))
        return await self._adopt(agent_id, known)

    async def _claim(self) -> list[str]:
        """Claim owed, unowned agents up to the free capacity and start them."""
        if self._stopping or self.host.closing or not self.auto:
            return []
        free = self.config.capacity - len(self.owned())
        if free <= 0:
            return []
        got: list[tuple[str, int]] = await self.lease.claim(free)
        started = []
        for aid, _epoch in got:
            if await self._adopt(aid):
                started.append(aid)
        return started

    async def _adopt(
        self, agent_id: str, known: tuple[AgentConfig, Pending | None, str | None] | None = None
    ) -> bool:
        """This worker now holds `agent_id`: read its row and pending record (fenced) and run it."""
        if known is not None:
            config, pending, settings = known
            return self._start(agent_id, config, pending, settings)
        try:
            async with self.store.transaction() as tx:
                row = await tx.get_agent(agent_id)
                pending = Pending.decode(await tx.get(agent_id, R.PENDING)) if row is not None else None
                # C3/P1: the durable effective settings, so that `agent.settings` shows them before a turn
                settings = await tx.get(agent_id, R.SETTINGS) if row is not None else None
        except LeaseLost:
            self._forget(agent_id)
            return False
        if row is None:
            self._forget(agent_id)
            return False
        return self._start(agent_id, AgentConfig.decode(row.config), pending, settings)

    def _start(
        self, agent_id: str, config: AgentConfig, pending: Pending | None, settings: str | None
    ) -> bool:
        rt = self.runtimes.get(agent_id)
        if rt is None:
            rt = self.runtimes[agent_id] = AgentRuntime(agent_id, config, self.env)
        rt.adopt(pending)
        if settings:
            rt._settings = json.loads(settings)
        self._changed("claimed", agent_id)
        return True

    def forget(self, agent_id: str) -> None:
        """`agent_id` was deleted: nothing of it is held or run here any more."""
        rt = self.runtimes.get(agent_id)
        if rt is not None:
            rt.owned = False
        self._forget(agent_id)

    def _forget(self, agent_id: str) -> None:
        self.lease.drop(agent_id)  # no more fencing for it: a later transaction would only raise again

    def _lease_lost(self, agent_id: str) -> None:
        """A transaction of `agent_id` raised `LeaseLost` (its runtime has already stopped itself)."""
        self.lease_losses += 1
        self._forget(agent_id)
        self._changed("lease-lost", agent_id)

    def _lose_all(self, why: str) -> None:
        for aid, rt in list(self.runtimes.items()):
            if rt.owned:
                rt.disown()
                self._forget(aid)
                self.lease_losses += 1
                self._changed("lease-lost", aid)
        log.warning("worker %s: %s; every agent stopped here", self.me, why)

    async def _release_surplus(self) -> None:
        """Over capacity: hand idle agents back (sticky otherwise)."""
        owned = [self.runtimes[a] for a in self.owned()]
        surplus = len(owned) - self.config.capacity
        for rt in owned:
            if surplus <= 0:
                return
            if rt.pending is None and rt.idle:
                with contextlib.suppress(StoreError):
                    await self.lease.release(rt.id)
                rt.disown(released=True)
                self._changed("released", rt.id)
                surplus -= 1

    # ------------------------------------------------------------------ wake-ups
    def wake(self, agent_id: str, since: int | None = None) -> None:
        """Something was accepted or decided for `agent_id` by another process: re-read its pending record
        and start its loop, unless a loop started after the request (`since`: the agent's `loop_runs` when
        the request was known to be needed; by default now) — that loop read the change already. Waking a
        waiting agent for nothing would flip its state to `working` after `wait_idle` said `waiting`."""
        rt = self.runtimes.get(agent_id)
        if rt is None or not rt.owned:
            return
        seen = rt.loop_runs if since is None else since
        self._wake_since[agent_id] = max(seen, self._wake_since.get(agent_id, seen))
        if agent_id in self._rechecks:
            return  # the running recheck answers this request too (it reads the newest `since`)
        task = asyncio.get_running_loop().create_task(self._recheck(rt), name=f"stead-fleet-wake-{agent_id}")
        self._rechecks[agent_id] = task

    async def _recheck(self, rt: AgentRuntime) -> None:
        try:
            while rt.owned and not self.host.closing:
                loop_task = rt._loop_task
                if loop_task is not None:
                    # the running loop re-reads the store at every stage; check again once it stops
                    await asyncio.wait([loop_task])
                    continue
                if rt.loop_runs > self._wake_since.get(rt.id, -1):
                    return  # a loop started after every request and has read what they announced
                try:
                    async with self.store.transaction() as tx:
                        pending = Pending.decode(await tx.get(rt.id, R.PENDING))
                except LeaseLost as e:
                    rt._lease_lost(e)
                    return
                except StoreError:
                    return  # the poll tries again
                if rt._loop_task is not None:
                    continue
                if pending is not None and rt.owned:
                    if rt.pending is None or rt.pending.run_id != pending.run_id:
                        rt.pending = pending
                    rt.wake()
                return
        finally:
            self._rechecks.pop(rt.id, None)
            self._wake_since.pop(rt.id, None)

    async def _rescan(self) -> None:
        """Wake every owned agent whose pending record exists in the store but whose loop is not running
        (a notification may have been missed: reconnect, poll)."""
        # a blocked agent (no provider here) or one waiting for decisions has nothing new to do: only new
        # input (a notification, an acceptance here) wakes it, or it would run a stage every poll
        # each agent's `loop_runs` is taken before the read: a loop that starts meanwhile (a local
        # acceptance) reads the store itself, so the scan must not wake it again once it waits
        runs = {
            a: rt.loop_runs
            for a in self.owned()
            if (rt := self.runtimes[a])._loop_task is None and rt.blocked is None and not rt.waiting
        }
        if not runs:
            return
        rows = await self._sql(
            "SELECT agent_id FROM kv WHERE key = %s AND agent_id = ANY(%s)", (R.PENDING, list(runs))
        )
        for (aid,) in rows:
            self.wake(str(aid), since=runs[str(aid)])

    async def _evict_vanished(self, min_age: float) -> list[str]:
        """Fast crash detection: a worker none of whose tagged sessions exists any more is dead (a killed
        process's sockets close at once; a stopped one keeps them, and waits for the TTL). Its heartbeat must
        be `min_age` seconds old, so that a PostgreSQL restart, which drops every session for a moment,
        does not evict workers that are reconnecting. Safety never depends on this: the epoch fences."""
        rows = await self._sql(
            "UPDATE stead_workers w SET state = 'evicted' WHERE w.state <> 'evicted' "
            "AND strpos(w.host, '#') > 0 AND w.id <> %s::uuid "
            "AND w.heartbeat_at <= now() - make_interval(secs => %s) "
            "AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = current_database() "
            "AND a.application_name = %s || split_part(w.host, '#', 2)) RETURNING w.id",
            (self.me, float(min_age), SESSION_PREFIX),
        )
        for (wid,) in rows:
            self._changed("evicted", f"{wid} (its sessions are gone)")
        return [str(r[0]) for r in rows]

    async def _end_frozen_sessions(self) -> int:
        """End the database sessions of evicted workers (by the tag in their `application_name`): a worker
        frozen inside a transaction (SIGSTOP, a partition) keeps its row locks, which the sweep skips, and a
        pipelined transaction never counts as idle for `idle_in_transaction_session_timeout`. Only sessions
        in a transaction that began before the eviction could have happened are ended; a tag a live
        registration still uses (the same process, re-registered) is left alone."""
        rows = await self._sql(
            "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a JOIN stead_workers w "
            "ON w.state = 'evicted' AND strpos(w.host, '#') > 0 "
            "AND a.application_name = %s || split_part(w.host, '#', 2) "
            "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
            "AND a.xact_start IS NOT NULL "
            # only sessions from before the eviction (a worker continued later reconnects)
            "AND a.backend_start < w.heartbeat_at + make_interval(secs => %s) "
            "AND NOT EXISTS (SELECT 1 FROM stead_workers l WHERE l.state <> 'evicted' "
            "AND l.host = w.host)",
            (SESSION_PREFIX, float(self.config.lease_ttl)),
        )
        if rows:
            log.warning("worker %s: ended %d session(s) of evicted workers", self.me, len(rows))
        return len(rows)

    async def _sql(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One short autocommit statement of the fleet's own bookkeeping, outside every stead transaction
        (the store's lease-operation path: not an agent's store operation, never fault-injected)."""
        rows: list[tuple[Any, ...]] = await self.lease.lease_sql(sql, params)
        return rows

    async def _remote_abort(self, agent_id: str) -> None:
        await notify_abort(self.store, agent_id)

    # ------------------------------------------------------------------ background loops
    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat)
            try:
                state = await self.lease.heartbeat(self.me)
            except StoreError as e:
                log.warning("worker %s: heartbeat failed (retrying): %s", self.me, e)
                continue
            if state is None and not self._stopping:
                self._lose_all("evicted (its heartbeat was late)")
                old = self.me
                try:
                    await self._register()
                except StoreError as e:
                    log.warning("worker %s: re-registering failed (retrying): %s", old, e)
                    continue
                if self._listener is not None:
                    self._listener.cancel()  # LISTEN on the new channel
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._listener
                    self._listener = asyncio.get_running_loop().create_task(
                        self._listen_loop(), name="stead-fleet-listen"
                    )
                self._kick.set()

    async def _sweep_loop(self) -> None:
        while True:
            base = self.config.sweep
            await asyncio.sleep(base * random.uniform(0.8, 1.2))
            try:
                await self._evict_vanished(self.config.heartbeat)
                evicted = await self.lease.sweep(self.config.lease_ttl)
            except StoreError as e:
                log.warning("worker %s: sweep failed (retrying): %s", self.me, e)
                continue
            except Exception:
                log.exception("worker %s: sweep failed unexpectedly (retrying)", self.me)
                continue
            for wid in evicted:
                self._changed("evicted", str(wid))
            try:
                ended = await self._end_frozen_sessions()
            except StoreError as e:
                log.warning("worker %s: ending sessions of evicted workers failed: %s", self.me, e)
                ended = 0
            if evicted or ended:
                self._kick.set()

    async def _claim_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.config.poll)
            self._kick.clear()
            try:
                await self._release_surplus()
                await self._claim()
                await self._rescan()
            except StoreError as e:
                log.warning("worker %s: claim/poll failed (retrying): %s", self.me, e)
            except Exception:
                log.exception("worker %s: claim/poll failed unexpectedly (retrying)", self.me)

    async def _listen_loop(self) -> None:
        import psycopg

        conninfo = self.lease.conninfo
        delay = 0.05
        while True:
            channel = worker_channel(self.me)
            try:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo, autocommit=True, application_name=f"stead-worker {self.me}"
                )
                try:
                    await conn.execute(f'LISTEN "{channel}"')
                    await conn.execute(f"LISTEN {CLAIM_CHANNEL}")
                    self.listening = True
                    delay = 0.05
                    self._kick.set()  # rescan and claim: notifications sent while not listening are lost
                    while True:
                        stream = conn.notifies(timeout=30.0)
                        try:
                            async for n in stream:
                                self._notified(n.channel, n.payload)
                        finally:
                            # it holds the connection's lock until closed; bounded: a cancelled close
                            # must never keep the worker from stopping
                            with contextlib.suppress(Exception):
                                await asyncio.wait_for(stream.aclose(), 2.0)
                        await conn.execute("SELECT 1")  # a dead connection shows here
                finally:
                    self.listening = False
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2.0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # psycopg.Error, OSError: reconnect; the poll covers the gap
                log.warning("worker %s: listener connection lost (reconnecting): %s", self.me, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.poll)

    def _notified(self, channel: str, payload: str) -> None:
        if channel == CLAIM_CHANNEL:
            self._kick.set()
            return
        if payload.startswith(ABORT_PREFIX):
            rt = self.runtimes.get(payload[len(ABORT_PREFIX) :])
            if rt is not None and rt.owned:
                task = asyncio.get_running_loop().create_task(rt.abort())
                rt.background.add(task)
                task.add_done_callback(rt.background.discard)
            return
        self.wake(payload)

    def _changed(self, what: str, subject: str) -> None:
        log.info("worker %s: %s %s", self.me, what, subject)
        if self.on_change is not None:
            self.on_change(what, subject)


async def notify_abort(store: Store, agent_id: str) -> None:
    """Ask the worker that owns `agent_id` to abort its turn (from a process that does not own it)."""
    async with store.transaction() as tx:
        await tx.fetch(
            "SELECT pg_notify('stead_w_' || replace(owner::text, '-', ''), ?) FROM agents "
            "WHERE id = ? AND owner IS NOT NULL",
            (ABORT_PREFIX + agent_id, agent_id),
        )
