"""What a running tool call sees: its id, its agent, its permission mode and its call-bound KV."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stead.errors import StoreError
from stead.messages import dumps
from stead.store.base import Store, Tx

__all__ = ["CallKV", "ToolContext"]


class CallKV:
    """Key/value storage bound to one tool call (T7).

    Values survive a crash while the call is unfinished, and are erased in the transaction that commits
    the call's result; after that the handle refuses every operation. `get_or_create` allocates a value
    exactly once across retries, which is how a durable tool keeps a stable idempotency key for the
    outside world."""

    def __init__(self, store: Store, agent_id: str, call_id: str) -> None:
        self._store = store
        self._agent_id = agent_id
        self._prefix = f"kv.c.{call_id}."
        self.closed = False
        self.touched = False

    def _check(self) -> None:
        if self.closed:
            raise StoreError("this call's KV was erased when its result committed")
        self.touched = True

    async def get(self, key: str) -> Any | None:
        self._check()
        async with self._store.transaction() as tx:
            raw = await tx.get(self._agent_id, self._prefix + key)
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: Any) -> None:
        self._check()
        async with self._store.transaction() as tx:
            await tx.write(self._agent_id, self._prefix + key, dumps(value))

    async def get_or_create(self, key: str, factory: Callable[[], Any | Awaitable[Any]]) -> Any:
        """Return the stored value, or store `factory()` once and return it (first writer wins)."""
        self._check()
        async with self._store.transaction() as tx:
            raw = await tx.get(self._agent_id, self._prefix + key)
            if raw is not None:
                return json.loads(raw)
            value = factory()
            if isinstance(value, Awaitable):
                value = await value
            await tx.write_if_absent(self._agent_id, self._prefix + key, dumps(value))
            stored = await tx.get(self._agent_id, self._prefix + key)
        return json.loads(stored) if stored is not None else value


@dataclass
class ToolContext:
    """Passed to a tool parameter annotated `stead.ToolContext`."""

    call_id: str
    tool_name: str
    agent_id: str
    run_id: str | None
    permission_mode: str
    kv: CallKV
    store: Store
    resumed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    user: str | None = None
    """The user of the run's first message (`agent.send(..., user=...)`)."""
    tenant: str | None = None
    """The tenant of the run's first message."""
    prepared: Any = None
    """What the tool's `prepare` step returned (transactional tools; see `Tool.prepare`)."""
    on_awaiting_input: Callable[[bool], None] | None = field(default=None, repr=False)

    def awaiting_input(self, waiting: bool = True) -> None:
        """Say that this call now waits for input from outside the agent (True) or no longer does (False):
        a delegation whose child waits for a human approval. While every running call of the agent waits
        so, the agent counts as waiting (`agent.state == "waiting"`, `wait_idle` returns)."""
        if self.on_awaiting_input is not None:
            self.on_awaiting_input(waiting)

    @property
    def tx(self) -> Tx | None:
        """The open transaction a `transactional` tool runs in (None for other tools)."""
        return self.store.current()
