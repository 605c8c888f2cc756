"""Where a flow's state lives: the run KV of its agent, next to the kernel's tool ledger.

    kv.r.payload                  the run's payload (the kernel's key: it ends up in the end-of-run record)
    kv.r.stead.flow               the head: status, the step in progress, its outstanding calls, the loop
                                  frame, the step that just finished, counters
    kv.r.stead.flow.s.<step>      the latest result of each step (`steps.<name>` in expressions)
    kv.r.stead.flow.r.<call id>   the full result of each call the flow made, written by the flow's
                                  `tool_result_tx` hook in the transaction that commits the ledger result
    kv.r.stead.flow.items         the items of the for_each loop in progress

The run KV is erased at settlement, after the payload was copied into the end-of-run record.

`FlowTx` is a read-through overlay: the engine reads through it and writes into it; the writes are applied
in one transaction later (`flush`) — the transaction that dispatches the next step's calls, or the one that
ends the run — so a step's derived state becomes durable atomically with what it decided.
"""

from __future__ import annotations

import json
from typing import Any

from stead.extend import RUN_PAYLOAD_KEY as PAYLOAD
from stead.extend import Tx, dumps

__all__ = ["HEAD", "ITEMS", "PAYLOAD", "RAW", "STEP", "FlowTx"]

HEAD = "kv.r.stead.flow"
STEP = "kv.r.stead.flow.s."
RAW = "kv.r.stead.flow.r."
ITEMS = "kv.r.stead.flow.items"

_DELETED = object()


class FlowTx:
    """Reads through to a transaction (cached); writes are kept until `flush`."""

    def __init__(self, tx: Tx, agent_id: str) -> None:
        self.tx = tx
        self.agent_id = agent_id
        self._cache: dict[str, Any] = {}
        self.writes: dict[str, str | None] = {}
        self.violations: list[dict[str, Any]] = []
        """Payload changes refused while computing (recorded as a validation step when flushed)."""
        self.data: dict[str, Any] = {}
        """The agent's creation data (`data.` in expressions)."""

    async def get(self, key: str) -> Any:
        if key in self._cache:
            value = self._cache[key]
            return None if value is _DELETED else value
        raw = await self.tx.get(self.agent_id, key)
        value = None if raw is None else json.loads(raw)
        self._cache[key] = value
        return value

    def put(self, key: str, value: Any) -> None:
        self._cache[key] = value
        self.writes[key] = dumps(value)

    def delete(self, key: str) -> None:
        self._cache[key] = _DELETED
        self.writes[key] = None

    async def flush(self, tx: Tx) -> None:
        """Apply the writes inside `tx` (the caller's transaction)."""
        for key, value in self.writes.items():
            if value is None:
                await tx.delete(self.agent_id, key)
            else:
                await tx.write(self.agent_id, key, value)
