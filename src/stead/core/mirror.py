"""The in-memory mirror of one agent's durable state: the pending record, the history records (and the
conversation built from them) and the effective settings.

The invariant: the mirror changes only in the after-commit callbacks of the transaction that made the
change durable, so a rollback — or a crash — never leaves memory ahead of the store, and the conversation
in memory always equals what a reload rebuilds (S1, R4). The one exception is `load`: a stage that loads
the history sees it at once (it runs before its own transaction commits), and publishes it again after the
commit; nothing else can have changed it meanwhile, because the stage holds the store's transaction.

The mirror is a cache, never an authority: every stage re-reads the pending record and the queues from
the store before deciding anything (C4).

On PostgreSQL other processes write too (`stead.core.fleet`): a client or another worker may accept
messages for an agent this process owns, so its queue entries, `msg.*` identities and even the pending
record (an activation) can appear in the store without any callback here. The owner (the process holding
the agent's lease at the current epoch, fenced on every transaction) writes the settings and the
dispatched batch, and the history — except the error result of a held call that another process rejects
(`stead.core.decide`). So the mirror's records can lag behind the store in one way only: a tool result
missing. Two checks catch it (C4): a result commit that finds its call answered by someone else (the
first committed result wins) drops the history here (`drop_history`), and an inference stage whose
records have a call without a result reloads them first (`lacks_results`). `pending` may lag behind the
store until the owner is woken (pg_notify from the accepting transaction, or the poll) and re-reads it.
A mirror whose lease is lost is dropped whole (`AgentRuntime.disown`), never reused: the next owner loads
from the store.
"""

from __future__ import annotations

import json
from typing import Any

from stead.core import records as R
from stead.core.config import AgentConfig
from stead.core.records import MessageBuilder, Pending
from stead.messages import Message
from stead.store.base import Tx

__all__ = ["Mirror"]


class Mirror:
    """Pending record, history records and settings of one agent, as last committed."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.pending: Pending | None = None
        self._records: list[dict[str, Any]] | None = None  # None: not loaded in this process
        self._builder: MessageBuilder | None = None
        self._messages: list[Message] | None = None
        self._settings: dict[str, Any] | None = None
        self.compaction_failures = 0
        """Consecutive failed compactions (the circuit breaker, K1), as committed."""
        self.learned_window: int | None = None
        """The window a provider's "context too long" error named (used when nothing else says it)."""

    @property
    def active(self) -> bool:
        """Whether work is owed (the pending record exists)."""
        return self.pending is not None

    @property
    def settings(self) -> dict[str, Any]:
        """The effective per-message settings (C3)."""
        return self._settings if self._settings is not None else self.config.initial_settings()

    @property
    def records(self) -> list[dict[str, Any]] | None:
        """The history records (None until loaded in this process). Read-only."""
        return self._records

    @property
    def loaded(self) -> bool:
        return self._records is not None

    def messages(self) -> list[Message]:
        """The conversation as the provider sees it (built from the history records)."""
        if self._messages is None:
            if self._builder is None:
                self._builder = MessageBuilder(self._records)
            self._messages = self._builder.messages()
        return self._messages

    async def load(self, tx: Tx, agent_id: str) -> None:
        """Read the history and the settings inside `tx` (see the module docstring)."""
        raw = await tx.load(agent_id)
        records = [json.loads(r) for r in raw]
        settings_raw = await tx.get(agent_id, R.SETTINGS)
        settings = json.loads(settings_raw) if settings_raw else self.config.initial_settings()
        breaker = json.loads(await tx.get(agent_id, R.COMPACTION) or "{}")
        failures = int(breaker.get("fails", 0))
        learned = breaker.get("window")

        def publish() -> None:
            self._set_records(records)
            self._settings = settings
            self.compaction_failures = failures
            self.learned_window = learned

        tx.after_commit(publish)
        self._set_records(records)
        self._settings = settings
        self.compaction_failures = failures
        self.learned_window = learned

    def lacks_results(self) -> bool:
        """Whether a tool call of the current turn in memory has no result after it. With the pending
        record at `inference` every call has been answered in the store, so such a mirror lags behind it:
        a result was committed by another writer (a rejection decided in another process, on PostgreSQL).
        Looks back to the latest input only (results always precede the next consumed input)."""
        answered: set[str] = set()
        for rec in reversed(self._records or ()):
            kind = rec.get("k")
            if kind == "t":
                answered.add(rec["b"].get("i"))
            elif kind == "b" and rec["b"].get("t") == "c" and rec["b"].get("i") not in answered:
                return True
            elif kind in ("u", "e", "c"):
                return False
        return False

    def drop_history(self) -> None:
        """The history in memory may lag behind the store (a result commit found its call answered by
        another writer): forget it, so the next stage loads what was committed (C4). Always safe: the
        mirror is a cache."""
        self._set_records(None)

    def _set_records(self, records: list[dict[str, Any]] | None) -> None:
        if records is self._records:
            return
        self._records = records
        self._builder = None
        self._messages = None

    # -- after-commit publishers: call these only from an after-commit callback -------------------------
    def publish_records(self, new: list[dict[str, Any]], *, reset: bool = False) -> None:
        """Committed history records: appended, or (`reset`) replacing the whole history."""
        if reset:
            self._set_records(list(new))
            return
        if self._records is None or not new:
            return  # never loaded in this process: the next stage loads the whole history from the store
        self._records.extend(new)
        if self._builder is not None:
            for rec in new:
                self._builder.add(rec)
        self._messages = None

    def publish_settings(self, settings: dict[str, Any]) -> None:
        self._settings = settings
