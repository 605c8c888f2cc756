"""The transaction machinery every store shares: joining, the store lock, commit-or-rollback, after-commit
callbacks and savepoints. A store supplies its dialect as methods (`TxStore._begin`, `_commit`, `_finish`;
`TxBase._sp_begin`, `_sp_release`, `_sp_rollback`); the order of its operations (what fault injection
counts) is the dialect's own.

The model both stores use: the transactions of one store run one at a time in this process (an asyncio
lock held from `transaction()` entry to its commit or rollback), a nested `transaction()` of the same task
joins the open one, and the after-commit callbacks run, in registration order, only after the outermost
commit (never after a rollback, also not those of a rolled-back savepoint).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Savepoint", "TxBase", "TxContext", "TxStore"]

log = logging.getLogger("stead.store")


class TxBase:
    """An open transaction's shared state: its store, task, callbacks and savepoint counter."""

    __slots__ = ("callbacks", "open", "savepoints", "store", "task")

    store: Any  # narrowed by each store's transaction class

    def __init__(self, store: Any) -> None:
        self.store = store
        self.task = asyncio.current_task()
        self.open = True
        self.callbacks: list[Callable[[], object]] = []
        self.savepoints = 0

    def after_commit(self, fn: Callable[[], object]) -> None:
        self.callbacks.append(fn)

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        return Savepoint(self)

    # -- batch operations: one after another unless the dialect does better (PostgreSQL: one statement)
    async def get_many(self, keys: Sequence[tuple[str, str]]) -> list[str | None]:
        return [await self.get(agent_id, key) for agent_id, key in keys]

    async def write_if_absent_many(self, rows: Sequence[tuple[str, str, str]]) -> list[bool]:
        return [await self.write_if_absent(agent_id, key, value) for agent_id, key, value in rows]

    async def get(self, agent_id: str, key: str) -> str | None:
        raise NotImplementedError

    async def write_if_absent(self, agent_id: str, key: str, value: str) -> bool:
        raise NotImplementedError

    # -- dialect hooks
    async def _sp_begin(self, name: str) -> None:
        raise NotImplementedError

    async def _sp_release(self, name: str) -> None:
        raise NotImplementedError

    async def _sp_rollback(self, name: str) -> None:
        """Roll the section back (its callbacks are already dropped); never raises a database error."""
        raise NotImplementedError


TxT = TypeVar("TxT", bound=TxBase)


class TxStore(Generic[TxT]):
    """The transaction side of a store. A subclass sets `_lock` (an `asyncio.Lock`) and implements the
    dialect hooks; each subclass gets its own context variable for the task's open transaction."""

    _tx_var: ClassVar[ContextVar[Any]] = ContextVar("stead_tx", default=None)
    _lock: asyncio.Lock

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tx_var = ContextVar(f"stead_tx_{cls.__module__}.{cls.__qualname__}", default=None)

    def transaction(self) -> AbstractAsyncContextManager[TxT]:
        return TxContext(self)

    def current(self) -> TxT | None:
        tx: TxT | None = self._tx_var.get()
        if tx is not None and tx.open and tx.store is self and tx.task is asyncio.current_task():
            return tx
        return None

    # -- dialect hooks
    def _begin(self) -> TxT:
        """With the lock held: a new transaction (raise `Closed`/`StoreCrashed` when the store is gone)."""
        raise NotImplementedError

    async def _commit(self, tx: TxT) -> None:
        """Commit `tx` (nothing when it never wrote); a failure raises and the transaction rolls back."""
        raise NotImplementedError

    async def _finish(self, tx: TxT, committed: bool) -> None:
        """Roll back unless `committed`, and release what `tx` holds; the lock is released after it."""
        raise NotImplementedError


class TxContext(Generic[TxT]):
    """`store.transaction()`: join the task's open transaction, or run a new one to commit or rollback."""

    __slots__ = ("_joined", "_store", "_token", "_tx")

    def __init__(self, store: TxStore[TxT]) -> None:
        self._store = store
        self._tx: TxT | None = None
        self._joined = False
        self._token: Token[Any] | None = None

    async def __aenter__(self) -> TxT:
        store = self._store
        outer = store.current()
        if outer is not None:
            self._joined = True
            self._tx = outer
            return outer
        await store._lock.acquire()
        try:
            tx = store._begin()
        except BaseException:
            store._lock.release()
            raise
        self._tx = tx
        self._token = store._tx_var.set(tx)
        return tx

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._joined:
            return
        store = self._store
        tx = self._tx
        assert tx is not None and self._token is not None
        try:
            store._tx_var.reset(self._token)
        except ValueError:  # pragma: no cover - reset from another context
            store._tx_var.set(None)
        committed = False
        try:
            if et is None:
                await store._commit(tx)
                committed = True
        finally:
            tx.open = False
            try:
                await store._finish(tx, committed)
            finally:
                store._lock.release()
        if et is not None:
            return  # rolled back: its after-commit callbacks never run
        for fn in tx.callbacks:
            try:
                fn()
            except Exception:  # an after-commit failure is logged, never raised into a committed caller
                log.exception("after-commit callback failed")


class Savepoint:
    """`tx.savepoint()`: an exception inside rolls back only this section (and drops its callbacks)."""

    __slots__ = ("_mark", "_name", "_tx")

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx
        tx.savepoints += 1
        self._name = f"sp{tx.savepoints}"
        self._mark = 0

    async def __aenter__(self) -> None:
        await self._tx._sp_begin(self._name)
        self._mark = len(self._tx.callbacks)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            try:
                await self._tx._sp_release(self._name)
                return
            except BaseException:
                # a failed RELEASE must not keep the section's writes: roll it back like a failed body
                await self._rollback()
                raise
        await self._rollback()

    async def _rollback(self) -> None:
        del self._tx.callbacks[self._mark :]
        await self._tx._sp_rollback(self._name)
