"""Group commit: how accepted messages of every agent of one system reach the store.

An `Agent` handle validates and copies its input (A7), asks the plugins' validators (`GroupCommit.validate`),
and hands the result to `GroupCommit.submit`. Submissions from concurrent callers are grouped into one
transaction: a hundred concurrent senders cost one commit, their messages written by the kernel's
`stead.core.admission.accept_many` in a fixed number of store round trips (a sender with a `before`
callback starts a new group only when its agent already has messages in the current one). Optimistically
the whole group commits without savepoints; if one acceptance fails (a refusing activation hook, a store
error) the group is rolled back and retried with each sender in its own savepoint, so a failure refuses
only its own sender. Inside a caller's own open transaction nothing is grouped: the acceptance joins that
transaction and is published only if it commits (A6).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from stead._plugin import IncomingMessage
from stead.core.admission import Inbound, accept, accept_many
from stead.core.runtime import AgentRuntime
from stead.errors import Closed, ReadOnly, StoreError
from stead.providers.router import ModelRouter
from stead.store.base import Store, Tx

__all__ = ["BeforeAccept", "GroupCommit"]

BeforeAccept = Callable[[Tx], Awaitable[None]]
"""Runs inside the accepting transaction, before the messages are accepted (a caller's own rows, such as a
gateway's idempotency records, commit with them); raising refuses that delivery only. It sees what earlier
deliveries of the group left for its agent; deliveries to other agents in the same group may be accepted
after it runs."""

_Group = list[tuple[AgentRuntime, list[Inbound], "BeforeAccept | None", "asyncio.Future[list[bool]]"]]


class GroupCommit:
    """The accepting side of one `AgentSystem`: open/closed state, validators, limits, group commit."""

    def __init__(
        self,
        store: Store,
        router: ModelRouter,
        *,
        max_payload_bytes: int,
        validators: Sequence[Callable[[IncomingMessage], None]] = (),
        readonly: bool = False,
    ) -> None:
        self.store = store
        self.readonly = readonly
        self.router = router
        self.max_payload_bytes = max_payload_bytes
        self.validators = list(validators)
        self.closing = False
        self._pending: _Group = []
        self._flush_task: asyncio.Task[None] | None = None

    def check_open(self) -> None:
        if self.closing:
            raise Closed("the agent system is closed")
        self.check_writable()

    def check_writable(self) -> None:
        if self.readonly:
            raise ReadOnly(
                f"{self.store.url} was opened with readonly=True (for inspection): agents, history and "
                "runs can be read; creating agents, sending, steering, resuming and deleting are refused"
            )

    def validate(self, message: IncomingMessage) -> None:
        """Run every plugin validator; the first refusal (`stead.InvalidInput`) propagates."""
        for check in self.validators:
            check(message)

    async def submit(
        self, rt: AgentRuntime, items: list[Inbound], before: BeforeAccept | None = None
    ) -> list[bool]:
        """Durably accept `items` for `rt` (all or none); return, per item, whether this call created it.
        `before` runs in the same transaction first (group-committed with concurrent senders too)."""
        rt.check_open()
        rt.begin_accept()
        try:
            outer = self.store.current()
            if outer is not None:
                # A6: inside the caller's transaction; published when (and only if) the caller commits
                if before is not None:
                    await before(outer)
                return await accept_many(outer, [(rt, item) for item in items])
            fut: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
            self._pending.append((rt, items, before, fut))
            if self._flush_task is None:
                self._flush_task = asyncio.get_running_loop().create_task(self._flush())
            return await fut
        finally:
            rt.end_accept()

    async def wait_flushed(self) -> None:
        """Wait until every acceptance submitted so far has committed or failed (used by close)."""
        while self._flush_task is not None or self._pending:
            task = self._flush_task
            if task is not None:
                await asyncio.wait([task])
            else:
                await asyncio.sleep(0)

    async def _flush(self) -> None:
        """The one flusher: commits what is pending, then what arrived while that commit was in flight
        (on PostgreSQL a commit is a round trip: senders arriving meanwhile share the next one)."""
        try:
            await asyncio.sleep(0)  # one scheduling round: concurrent senders join this commit
            while self._pending:
                batch, self._pending = self._pending, []
                await self._flush_batch(batch)
        except BaseException as e:
            left, self._pending = self._pending, []
            for *_, fut in left:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else StoreError(str(e)))
            raise
        finally:
            self._flush_task = None

    async def _flush_batch(self, batch: _Group) -> None:
        try:
            try:
                outcomes = await self._commit_group(batch, isolate=False)
            except Exception:
                if len(batch) == 1:
                    raise
                outcomes = await self._commit_group(batch, isolate=True)
        except BaseException as e:
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else StoreError(str(e)))
            if not isinstance(e, Exception):
                raise
            return
        for (*_, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    async def _commit_group(self, batch: _Group, *, isolate: bool) -> list[list[bool] | BaseException]:
        outcomes: list[list[bool] | BaseException] = []
        async with self.store.transaction() as tx:
            if not isolate:
                return await _accept_senders(tx, batch)
            for rt, items, before, _ in batch:
                try:
                    async with tx.savepoint():
                        if before is not None:
                            await before(tx)
                        created = [await accept(rt, tx, item) for item in items]
                    # only once the savepoint is released (a failing RELEASE refuses this sender)
                    outcomes.append(created)
                except Exception as e:
                    outcomes.append(e)
        return outcomes


async def _accept_senders(tx: Tx, batch: _Group) -> list[list[bool] | BaseException]:
    """Every sender's messages, in order, in as few store round trips as their `before` callbacks allow:
    consecutive senders share one `accept_many`, each sender's callback running just before its messages
    join the group. A sender with a callback whose agent already has messages in the group starts a new
    group, so a callback always sees what the senders before it left for its agent (its idempotency rows,
    its activation, its events head); senders of other agents cannot change that."""
    outcomes: list[list[bool] | BaseException] = []
    group: list[tuple[AgentRuntime, Inbound]] = []
    sizes: list[int] = []
    agents: set[str] = set()

    async def flush() -> None:
        if not sizes:
            return
        created = await accept_many(tx, group)
        at = 0
        for n in sizes:
            outcomes.append(created[at : at + n])
            at += n
        group.clear()
        sizes.clear()
        agents.clear()

    for rt, items, before, _ in batch:
        if before is not None:
            if rt.id in agents:
                await flush()
            await before(tx)
        group.extend((rt, item) for item in items)
        sizes.append(len(items))
        agents.add(rt.id)
    await flush()
    return outcomes
