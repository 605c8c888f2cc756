"""The run-record seam: how any layer adds steps to a run's record without importing the plugin that keeps
the records.

`record_step`, `rename_step`, `update_step`, `record_run`, `end_run` and `record_guardrail` (re-exported by
`stead.extend`) write inside the caller's transaction `tx`, so a step commits exactly when the change it
describes does. They hand the write to the `StepWriter` bound to `tx.store` — the records plugin binds
itself when it starts (`bind_step_writer`) — and do nothing when none is bound (run records off), so a
plugin records its steps without caring whether records are on, and without knowing whose tables they are.

`PARENT_KEY` / `SESSION_KEY` and `parent_link` are the metadata contract that links a child run to its
parent: the orchestration layer writes it, the records, tracing, approvals and server layers read it.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from stead._ids import new_id
from stead.messages import Usage
from stead.store.base import Store, Tx

__all__ = [
    "PARENT_KEY",
    "RUN_STATUSES",
    "SESSION_KEY",
    "STEP_TYPES",
    "StepWriter",
    "bind_step_writer",
    "end_run",
    "parent_link",
    "record_guardrail",
    "record_run",
    "record_step",
    "rename_step",
    "step_writer",
    "update_step",
]

PARENT_KEY = "stead.parent"
"""Metadata key of the activating message that links a child run to its parent run and step."""

SESSION_KEY = "stead.session_id"
"""Metadata key of the activating message that names a session for a root run."""

STEP_TYPES = ("prompt", "tool", "sub_agent", "guardrail", "validation", "memory", "compaction")
RUN_STATUSES = ("running", "completed", "failed", "cancelled", "awaiting_input")


def parent_link(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The `stead.parent` link of an activating message's metadata, if it is a well-formed one."""
    if not metadata:
        return None
    link = metadata.get(PARENT_KEY)
    if isinstance(link, dict) and isinstance(link.get("run_id"), str):
        return link
    return None


class StepWriter(Protocol):
    """What keeps run records (the records plugin): each method writes inside `tx` and never commits."""

    async def write_step(self, tx: Tx, run_id: str, sid: str, type: str, name: str, **fields: Any) -> None:
        """Append step `sid` to `run_id` (the next number; the name gets the run's breadcrumb). `fields`:
        the optional keywords of `record_step`."""
        ...

    async def rename_step(self, tx: Tx, run_id: str, step_id: str, name: str) -> None: ...

    async def update_step(self, tx: Tx, run_id: str, step_id: str, **fields: Any) -> None:
        """`fields`: the optional keywords of `update_step` that are not None."""
        ...

    async def record_run(self, tx: Tx, run_id: str, agent_id: str, **fields: Any) -> None: ...

    async def end_run(
        self, tx: Tx, run_id: str, *, status: str, error: str | None, final_message: str | None
    ) -> None: ...


_WRITERS: weakref.WeakKeyDictionary[Store, StepWriter] = weakref.WeakKeyDictionary()


def bind_step_writer(store: Store, writer: StepWriter | None) -> None:
    """Make `writer` keep the run records of `store` (None: records off again)."""
    if writer is None:
        _WRITERS.pop(store, None)
    else:
        _WRITERS[store] = writer


def step_writer(store: Store) -> StepWriter | None:
    """The writer of `store`'s run records, or None when run records are off."""
    return _WRITERS.get(store)


async def record_step(
    tx: Tx,
    run_id: str,
    type: str,
    name: str,
    *,
    status: str = "completed",
    target: str | None = None,
    target_run_id: str | None = None,
    target_log_id: str | None = None,
    parent_step_id: str | None = None,
    input: Any = None,
    output: Any = None,
    error: str | None = None,
    started_at: float | None = None,
    completed_at: float | None = None,
    step_id: str | None = None,
) -> str:
    """Append one step to a run inside `tx` (the next number; the name gets the run's breadcrumb) and return
    its id. For layers above the kernel: validation, memory, compaction and guardrail steps. With run
    records off (no records plugin in this system) nothing is written and the id is still returned, so a
    plugin records its steps without caring whether records are on."""
    if type not in STEP_TYPES:
        raise ValueError(f"step type must be one of {', '.join(STEP_TYPES)}, not {type!r}")
    sid = step_id or new_id()
    writer = _WRITERS.get(tx.store)
    if writer is None:
        return sid
    await writer.write_step(
        tx,
        run_id,
        sid,
        type,
        name,
        status=status,
        target=target,
        target_run_id=target_run_id,
        target_log_id=target_log_id,
        parent_step_id=parent_step_id,
        input=input,
        output=output,
        error=error,
        started_at=started_at,
        completed_at=completed_at,
    )
    return sid


async def rename_step(tx: Tx, run_id: str, step_id: str, name: str) -> None:
    """Give a recorded step a better name (the run's breadcrumb is prefixed), inside `tx`: a layer that knows
    what a tool call or an inference stands for names it (a flow names its steps after the flow's steps). A
    no-op when run records are off or there is no such step."""
    writer = _WRITERS.get(tx.store)
    if writer is not None:
        await writer.rename_step(tx, run_id, step_id, name)


async def record_run(
    tx: Tx,
    run_id: str,
    agent_id: str,
    *,
    agent_name: str | None = None,
    session_id: str | None = None,
    started_at: float | None = None,
) -> None:
    """Open a run record (status `running`) for work the kernel's loop does not drive — a realtime
    session — inside `tx`; `end_run` closes it. A no-op with run records off, and for an existing id."""
    writer = _WRITERS.get(tx.store)
    if writer is not None:
        await writer.record_run(
            tx, run_id, agent_id, agent_name=agent_name, session_id=session_id, started_at=started_at
        )


async def update_step(
    tx: Tx,
    run_id: str,
    step_id: str,
    *,
    status: str | None = None,
    input: Any = None,
    output: Any = None,
    error: str | None = None,
    completed_at: float | None = None,
    usage: Usage | None = None,
    provider: str | None = None,
    target_run_id: str | None = None,
) -> None:
    """Update a step written by `record_step` (or the kernel's prompt step) inside `tx`: its status (a final
    status sets `completed_at`, now unless given), input (replaced: memory records what it injected into a
    prompt), output, error, the child run it points at, and — for a long-lived `prompt` step — its
    provider and usage (the totals so far: they replace the stored ones). A no-op with records off."""
    writer = _WRITERS.get(tx.store)
    if writer is None:
        return
    given = {
        "status": status,
        "input": input,
        "output": output,
        "error": error,
        "completed_at": completed_at,
        "usage": usage,
        "provider": provider,
        "target_run_id": target_run_id,
    }
    fields = {k: v for k, v in given.items() if v is not None}
    if fields:
        await writer.update_step(tx, run_id, step_id, **fields)


async def end_run(
    tx: Tx,
    run_id: str,
    *,
    status: str = "completed",
    error: str | None = None,
    final_message: str | None = None,
) -> None:
    """Close a run opened with `record_run` inside `tx`: its status, its totals summed from its prompt
    steps, steps still running end with it; its tokens roll up to its ancestors. A no-op with records off."""
    if status not in RUN_STATUSES:
        raise ValueError(f"run status must be one of {', '.join(RUN_STATUSES)}, not {status!r}")
    writer = _WRITERS.get(tx.store)
    if writer is not None:
        await writer.end_run(tx, run_id, status=status, error=error, final_message=final_message)


async def record_guardrail(tx: Tx, run_id: str, name: str, error: str, *, detail: Any = None) -> str:
    """Record a violated guardrail (a limit) as a failed `guardrail` step of `run_id`, inside `tx`; return the
    step id. The orchestration layer calls this in the transaction that ends the run (e.g. from
    `before_inference` via a transactional hook, or `settled_tx`)."""
    return await record_step(
        tx,
        run_id,
        "guardrail",
        name,
        status="failed",
        target=name,
        output={"violation": error, **({"detail": detail} if detail is not None else {})},
        error=error,
    )
