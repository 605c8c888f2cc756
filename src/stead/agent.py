"""`stead.Agent`: the handle users hold. Validates and copies input, then hands it to the kernel.

`agent.run(...)` is `send` plus waiting: it returns the result of the run that consumed *that* message,
computed from the durable record (`stead.core.results`), so it is exactly as durable as `send` — called
again with the same id after a crash, it returns the same run's result instead of running again.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from stead._approvals import Approval, ApprovalSource, ApprovalStatus
from stead._changes import CHANGES_KEY, RuntimeChange
from stead._ids import ID_RULE, is_valid_user_id, new_id
from stead._plugin import IncomingMessage
from stead.core import records as R
from stead.core.batch import decode_batch
from stead.core.compaction import request as request_compaction
from stead.core.config import PERMISSION_MODES, AgentConfig
from stead.core.decide import refuse_call, release_call
from stead.core.events import Event, Settled
from stead.core.gate import decode_gates
from stead.core.hooks import CompactionInfo
from stead.core.outcome import Outcome
from stead.core.records import PAYLOAD_METADATA, Pending
from stead.core.results import RunResult, read_run_records, read_run_state, waiting_result
from stead.core.runtime import AgentRuntime, Inbound, inside_agent
from stead.core.structured import OUTPUT_SCHEMA_METADATA, check_output_schema, parse_answer
from stead.errors import (
    Closed,
    CompactionFailed,
    ConfigurationError,
    InvalidId,
    InvalidInput,
    RunFailed,
    RunNotFound,
)
from stead.messages import (
    Block,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    Usage,
    decode_block,
    encode_block,
    unstorable,
)

if TYPE_CHECKING:
    from stead._group_commit import BeforeAccept, GroupCommit
    from stead.store.base import Tx

__all__ = ["Acceptance", "Agent", "Input", "check_message", "check_storable"]

REMOTE_POLL = 0.05
"""Seconds between looks at the store while another process runs the agent (`Agent.run`)."""


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The answer to `send`/`steer`: the message id, its queue, and whether this call created it (A3)."""

    id: str
    delivery: Literal["send", "steer"]
    created: bool


@dataclass
class Input:
    """One message for `Agent.deliver` (several commit in one transaction, A1)."""

    content: str | Sequence[Block]
    id: str | None = None
    delivery: Literal["send", "steer"] = "send"
    role: Literal["user", "system"] = "user"
    metadata: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    user: str | None = None
    """Who sends it (stored with the message; a run's first message names the run's user)."""
    tenant: str | None = None


class Agent:
    """A durable agent. Obtain one from `system.create(...)` or `system.get(id)`."""

    def __init__(
        self,
        admission: GroupCommit,
        runtime: AgentRuntime,
        approval_source: Callable[[], ApprovalSource] | None = None,
    ) -> None:
        self._admission = admission
        self._rt = runtime
        self._approval_source = approval_source

    def __repr__(self) -> str:
        return f"<stead.Agent {self.id} name={self.name!r} active={self.active}>"

    @property
    def id(self) -> str:
        return self._rt.id

    @property
    def name(self) -> str | None:
        return self._rt.config.name

    @property
    def config(self) -> AgentConfig:
        """What the agent is (provider, model, instructions, tools, ...): a copy; changing it changes
        nothing."""
        cfg = self._rt.config
        return replace(
            cfg,
            model=cfg.model if isinstance(cfg.model, str) else list(cfg.model),
            tools=list(cfg.tools),
            extra=copy.deepcopy(cfg.extra),
            context=copy.deepcopy(cfg.context),
        )

    @property
    def active(self) -> bool:
        """Whether the agent owes work (a durable pending record exists)."""
        return self._rt.active

    @property
    def state(self) -> Literal["idle", "working", "waiting", "blocked", "stopped"]:
        """`idle`: nothing owed. `working`: work is owed and this process runs it. `waiting`: work is owed
        but nothing can happen before a decision on held tool calls (approvals; also a delegation whose
        child waits so). `blocked`: work is owed but this process lacks its provider (or the store keeps
        refusing its writes, C7). `stopped`: work is owed but the agent was drained or closed here; the next
        owner of the store runs it."""
        rt = self._rt
        if not rt.active:
            return "idle"
        if rt.blocked is not None:
            return "blocked"
        if rt.draining or rt.closed:
            return "stopped"
        if rt.state_waiting:
            return "waiting"
        return "working"

    @property
    def settings(self) -> dict[str, Any]:
        """The effective per-message settings (provider, model, effort, permission_mode, profile)."""
        return dict(self._rt.settings)

    async def send(
        self,
        content: str | Sequence[Block],
        *,
        id: str | None = None,
        role: Literal["user", "system"] = "user",
        metadata: dict[str, Any] | None = None,
        user: str | None = None,
        tenant: str | None = None,
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        effort: str | None = None,
        permission_mode: str | None = None,
        profile: str | None = None,
        changes: Sequence[RuntimeChange] | None = None,
        payload: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> Acceptance:
        """Queue a message for when the agent would otherwise stop. Returns after the durable write (A2).

        `changes` (`stead.RuntimeChange`s) add or remove tools and sub-agents for the run this message
        starts, scoped to the root, every agent of the delegation tree, the sub-agents, or named agents;
        they travel in the message metadata (`stead.changes`) and are as durable as the message.

        `payload` (a JSON object) is the starting payload of the run this message starts: it rides in the
        metadata (`stead.payload`), flows and payload tools change it, and the run's result carries it as
        it ended (`RunResult.payload`).

        `user` and `tenant` (ids: 1-128 characters from `A-Z a-z 0-9 . _ : @ -`) say who sends the message;
        they are stored with it, validators and hooks see them, and the run a message starts keeps them
        for all its hooks and tools (`ctx.user`, `ctx.tenant`): memory scopes its notes by them.

        `output_schema` (a JSON schema of the supported subset, docs/providers.md "Structured output") is
        the output schema of the run this message starts (a typed result): sent to the model as the vendor's
        native structured output, and a final answer that does not fit fails the run. It rides in the
        metadata (`stead.output_schema`); a message that does not start a run ignores it."""
        settings = _settings(provider, model, effort, permission_mode, profile)
        if output_schema is not None:
            metadata = {**(metadata or {}), OUTPUT_SCHEMA_METADATA: check_output_schema(output_schema)}
        if changes:
            # checked by the orchestration plugin's validator, like any message carrying changes
            metadata = {**(metadata or {}), CHANGES_KEY: [_encode_change(c) for c in changes]}
        if payload is not None:
            if not isinstance(payload, dict):
                raise InvalidInput(f"payload must be a dict (a JSON object), not {type(payload).__name__}")
            metadata = {**(metadata or {}), PAYLOAD_METADATA: payload}
        (acc,) = await self.deliver([Input(content, id, "send", role, metadata, settings, user, tenant)])
        return acc

    async def steer(
        self,
        content: str | Sequence[Block],
        *,
        id: str | None = None,
        role: Literal["user", "system"] = "user",
        metadata: dict[str, Any] | None = None,
        user: str | None = None,
        tenant: str | None = None,
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        effort: str | None = None,
        permission_mode: str | None = None,
        profile: str | None = None,
    ) -> Acceptance:
        """Queue a message injected at the next boundary between responses (outranks sends, C2)."""
        settings = _settings(provider, model, effort, permission_mode, profile)
        (acc,) = await self.deliver([Input(content, id, "steer", role, metadata, settings, user, tenant)])
        return acc

    async def run(
        self,
        content: str | Sequence[Block],
        *,
        id: str | None = None,
        check: bool = False,
        role: Literal["user", "system"] = "user",
        metadata: dict[str, Any] | None = None,
        user: str | None = None,
        tenant: str | None = None,
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        effort: str | None = None,
        permission_mode: str | None = None,
        profile: str | None = None,
        changes: Sequence[RuntimeChange] | None = None,
        payload: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> RunResult:
        """Send a message and wait for the run that consumed it to settle; return that run's result
        (`.text`, `.messages`, `.usage`, `.run_id`, `.outcome`, `.payload` — the run's payload as it ended,
        starting from `payload`). A run that has nothing left to do but wait for decisions on held tool calls
        returns with outcome `awaiting_input` (and the messages so far); decide them (`system.approve` /
        `system.reject`) and call `run` again with the same `id` for the rest.

        As durable as `send`: with an `id` that was accepted before — in this process or before a crash —
        nothing is sent again; the result is that of the run that consumed the earlier message (waiting
        while it is still queued or its run still works). A failed run is returned like any other unless
        `check=True`, which raises `stead.RunFailed` (carrying the result) for a run that failed; an aborted
        run has outcome `cancelled` and is returned. Raises `stead.Closed` if this process stops running
        the agent before the run ends (closing, draining, or the agent's provider is missing here), and
        `stead.RunNotFound` if the message's records were removed (a model change reset the conversation).
        For an agent another process runs (a PostgreSQL client, `run_agents=False`), it polls the store
        every 50 ms until the run has ended.

        `output_schema` (or the agent's own, a definition's `output:`) makes the result typed: the answer is
        asked for as the vendor's structured output, checked against the schema (a run whose answer does
        not fit fails, saying why), and `RunResult.output` is its parsed JSON value.
        """
        rt = self._rt
        events = rt.subscribe()  # before sending: no settlement after the send can be missed
        try:
            acc = await self.send(
                content,
                id=id,
                role=role,
                metadata=metadata,
                user=user,
                tenant=tenant,
                provider=provider,
                model=model,
                effort=effort,
                permission_mode=permission_mode,
                profile=profile,
                changes=changes,
                payload=payload,
                output_schema=output_schema,
            )
            while True:
                result = await self._run_result(acc.id)
                if result is not None:
                    break
                if not rt.owned:
                    # another process runs the agent (PostgreSQL, `stead.core.fleet`): its events never
                    # reach this one; the store says when the run has ended, or that it waits (W8)
                    result = await self._remote_waiting_result(acc.id)
                    if result is not None:
                        break
                    await asyncio.sleep(REMOTE_POLL)
                    continue
                if not await _until_settled(rt, events):
                    # nothing will happen here any more: one last look, then say why
                    result = await self._run_result(acc.id)
                    if result is not None:
                        break
                    if self.state == "waiting":
                        # the run waits for decisions (or the message is queued behind one that does)
                        result = await self._waiting_result(acc.id) or RunResult(
                            "", Outcome.AWAITING_INPUT, "", [], Usage(0, 0), None, acc.id
                        )
                        break
                    if self.state == "working":
                        # woken again after its loop stopped (a fleet recheck or a decision clears
                        # `waiting` until the next stage looks): wait for that loop too
                        continue
                    why = rt.blocked or ("it is closed" if rt.closed else "it was drained")
                    raise Closed(f"agent {self.id} stopped before the run of message {acc.id} ended: {why}")
        finally:
            rt.unsubscribe(events)
        schema = output_schema if output_schema is not None else rt.config.output_schema
        if schema is not None and result.outcome is Outcome.COMPLETED:
            result = replace(result, output=parse_answer(result.text))
        if check and result.outcome is Outcome.FAILED:
            raise RunFailed(f"run {result.run_id} failed: {result.error}", result)
        return result

    async def _run_result(self, message_id: str) -> RunResult | None:
        """The result of the run that consumed `message_id`, or None while it is queued or running.

        Consumption moves the message from the queue to the history in one transaction (C1), but on
        PostgreSQL a transaction that only reads runs each read in its own snapshot, so a consumption can
        commit between two reads. The queue is read first: a message it no longer holds is in the history
        at every later read (W7). The history is read from its end, only as far back as the run (O(run)).
        """
        async with self._rt.env.store.transaction() as tx:
            queued = await is_queued(tx, self.id, message_id)
            state = None if queued else await read_run_state(tx, self.id, message_id)
        if state is None:
            if queued:
                return None
            raise RunNotFound(
                f"message {message_id} of agent {self.id} is neither queued nor in the history "
                "(a model change that reset the conversation removed its run)"
            )
        return state.result

    async def _remote_waiting_result(self, message_id: str) -> RunResult | None:
        """W8: for an agent another process runs, the `awaiting_input` result while the store shows it
        waiting for decisions — every call of its dispatched batch held, no steered message queued (which
        would reject them) — else None. Read in one transaction; on PostgreSQL a decision committed between
        its reads shows as a call no longer held, so the caller polls again."""
        async with self._rt.env.store.transaction() as tx:
            pending = Pending.decode(await tx.get(self.id, R.PENDING))
            if pending is None or pending.stage != "tools":
                return None
            entries = await tx.read_prefix(self.id, R.TOOL)
            gates = decode_gates(entries)
            if not entries or not all(
                call.id in gates and gates[call.id].held for _, call in decode_batch(entries)
            ):
                return None
            if any(v for k, v in await tx.read_prefix(self.id, R.STEER)):
                return None
            records = await read_run_records(tx, self.id, message_id)
        so_far = None if records is None else waiting_result(records, message_id)
        return so_far or RunResult("", Outcome.AWAITING_INPUT, "", [], Usage(0, 0), None, message_id)

    async def _waiting_result(self, message_id: str) -> RunResult | None:
        async with self._rt.env.store.transaction() as tx:
            records = await read_run_records(tx, self.id, message_id)
        return None if records is None else waiting_result(records, message_id)

    # ------------------------------------------------------------------ held calls (approvals)
    async def approvals(self, status: ApprovalStatus | None = "pending") -> list[Approval]:
        """This agent's approvals (`status=None`: all), oldest first; needs an approvals plugin
        (`stead.open(approvals=True)`)."""
        return await self._approvals().approvals(status, agent_id=self.id)

    def _approvals(self) -> ApprovalSource:
        if self._approval_source is None:
            raise ConfigurationError("approvals are off: open the system with approvals=True")
        return self._approval_source()

    async def release_call(
        self,
        call_id: str,
        *,
        arguments: dict[str, Any] | None = None,
        note: str | None = None,
        result_note: str | None = None,
    ) -> bool:
        """For plugins (a policy's approve): let a held call run, once, under its tool's flags —
        with `arguments` instead of the model's when given (validate them first). Runs in the caller's
        open transaction if there is one; wakes the agent after the commit. False when the call is not
        held (decided before, aborted, unknown)."""
        return await release_call(self._rt, call_id, arguments=arguments, note=note, result_note=result_note)

    async def refuse_call(
        self, call_id: str, output: str, *, decision: str = "rejected", note: str | None = None
    ) -> bool:
        """For plugins (a policy's reject or expiry): a held call gets the error result `output` in this
        transaction (the caller's, if open) and never runs; `decision` names why. False when the call is
        not held."""
        return await refuse_call(self._rt, call_id, output, decision=decision, note=note)

    async def deliver(
        self, inputs: Sequence[Input], *, before_accept: BeforeAccept | None = None
    ) -> list[Acceptance]:
        """Accept several messages in one transaction: all of them or none (A1). Concurrent deliveries
        share one commit (group commit). `before_accept(tx)` runs inside that transaction just before these
        messages are accepted — a plugin's own rows about them (a gateway's idempotency records) commit
        with them or not at all; raising there refuses this delivery only."""
        self._admission.check_open()
        items = [self._validate(i) for i in inputs]
        if not items:
            raise InvalidInput("deliver() needs at least one message")
        ids = [i.id for i in items]
        if len(set(ids)) != len(ids):
            raise InvalidInput("the same message id appears twice in one delivery")
        for item in items:
            self._admission.validate(self._incoming(item))
        created = await self._admission.submit(self._rt, items, before_accept)
        return [Acceptance(i.id, i.delivery, c) for i, c in zip(items, created, strict=True)]  # type: ignore[arg-type]

    def _validate(self, item: Input) -> Inbound:
        """A7: refuse bad input before any write, and copy the payload."""
        msg_id = item.id if item.id is not None else new_id()
        if not is_valid_user_id(msg_id):
            raise InvalidId(f"message id {_shown(item.id)} is not a valid id: use {ID_RULE}")
        if item.delivery not in ("send", "steer"):
            raise InvalidInput(f"delivery must be 'send' or 'steer', not {item.delivery!r}")
        if item.role not in ("user", "system"):
            raise InvalidInput(f"role must be 'user' or 'system', not {item.role!r}")
        blocks = _content_blocks(item.content)
        _check_depth("metadata", item.metadata)  # SEC6k1: before anything recurses into it
        _check_depth("settings", item.settings)
        try:
            metadata = json.loads(json.dumps(item.metadata)) if item.metadata is not None else None
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"metadata must be JSON-serializable: {e}") from None
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInput("metadata must be a dict")
        settings = copy.deepcopy(item.settings)
        mode = settings.get("permission_mode")
        if mode is not None and mode not in PERMISSION_MODES:
            raise InvalidInput(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}, not {mode!r}")
        if "model" in settings:
            # one grammar (stead.providers.router): a provider prefix, the catalog, a scripted file, a list
            current = self._rt.settings.get("provider")
            chosen = self._admission.router.resolve(
                settings["model"],
                provider=settings.get("provider"),
                current=current if isinstance(current, str) else None,
            )
            settings["model"] = chosen.model
            if "provider" in settings or chosen.provider != current:
                settings["provider"] = chosen.provider
        elif "provider" in settings:
            self._admission.router.check(str(settings["provider"]), self._rt.settings.get("model"))
        for what, value in (("user", item.user), ("tenant", item.tenant)):
            if value is not None and not is_valid_user_id(value):
                raise InvalidId(f"{what} {_shown(value)} is not a valid id: use {ID_RULE}")
        content = encoded_content(blocks, metadata, self._admission.max_payload_bytes)
        check_storable("message settings", settings)
        return Inbound(msg_id, item.delivery, item.role, content, metadata, settings, item.user, item.tenant)

    def _incoming(self, item: Inbound) -> IncomingMessage:
        return IncomingMessage(
            agent_id=self.id,
            agent_name=self.name,
            id=item.id,
            delivery=item.delivery,
            role=item.role,
            content=[decode_block(b) for b in item.content],
            metadata=item.metadata,
            settings=item.settings,
            agent_extra=self._rt.config.extra,
            user=item.user,
            tenant=item.tenant,
        )

    async def abort(self) -> None:
        """Cancel the current turn (X1). Returns once the agent has settled; a no-op when idle."""
        await self._rt.abort()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until nothing is owed, the agent has nothing left to do but wait for decisions on held
        calls (`state == "waiting"`), or the system stops running it. Raises `TimeoutError`."""
        if timeout is None:
            await self._rt.wait_idle()
        else:
            await asyncio.wait_for(self._rt.wait_idle(), timeout)

    async def wait_decided(self, timeout: float | None = None) -> None:
        """While the agent is `waiting` (for decisions on held calls), wait until that changes: a decision,
        an abort, a new message, or the system stops running it. Returns at once when not waiting. With
        `agent.run`, which returns `awaiting_input` for such a run: `while (r := await agent.run(m, id=i))
        .outcome is Outcome.AWAITING_INPUT: await agent.wait_decided()`. Raises `TimeoutError`."""
        rt = self._rt
        events = rt.subscribe()
        try:

            async def until() -> None:
                while self.state == "waiting":
                    ev = await events.get()
                    if ev is None:
                        return  # closed

            if timeout is None:
                await until()
            else:
                await asyncio.wait_for(until(), timeout)
        finally:
            rt.unsubscribe(events)

    async def compact(self) -> CompactionInfo:
        """Compact the conversation now (K1) and return what was done (`stead.extend.CompactionInfo`:
        tokens before and after, the passes, the summary).

        The request is durable (it survives a restart, which runs it); it is carried out at the agent's
        next safe boundary — at once for an idle agent, which compacts without an inference; after the
        current tool batch settles for a working one (for one waiting for decisions on held calls: after
        they are made). Requests made while one is pending share it. Raises
        `stead.CompactionFailed` when the compaction failed (the history is unchanged) or — `rejected` —
        nobody will run it here (the agent was aborted, is closing, drained or blocked)."""
        rt = self._rt
        self._admission.check_open()
        rt.check_open()
        if inside_agent.get() == rt.id:
            raise CompactionFailed(
                f"agent {rt.id} cannot wait for its own compaction from inside its loop (a tool or hook): "
                "it runs after the current tool batch",
                rejected=True,
            )
        if rt.draining:
            raise CompactionFailed(
                f"agent {rt.id} is drained: nobody here will run the compaction", rejected=True
            )
        fut: asyncio.Future[CompactionInfo] = asyncio.get_running_loop().create_future()
        rt.compaction_waiters.append(fut)
        try:
            async with rt.env.store.transaction() as tx:
                await request_compaction(rt, tx)
        except BaseException:
            if fut in rt.compaction_waiters:
                rt.compaction_waiters.remove(fut)
            raise
        return await fut

    async def history(self, *, include_archived: bool = False) -> list[Message]:
        """The conversation as stored (read from the store, not from memory). With `include_archived=True`:
        every message the conversation ever held — the records compactions archived followed by the current
        ones, in order, originals rather than shortened copies, each compaction's summary where it
        happened (`stead history --all`)."""
        async with self._rt.env.store.transaction() as tx:
            raw = await tx.load(self.id)
            archive = await tx.load_archive(self.id) if include_archived else []
        return R.build_messages(R.full_records(archive, [json.loads(r) for r in raw]))

    async def queued(self) -> list[Input]:
        """The accepted messages not yet consumed, in the order the agent will take them (steered ones
        first, then sends, each in acceptance order), read from the store."""
        async with self._rt.env.store.transaction() as tx:
            rows = await tx.read_prefix(self.id, R.QUEUE)
        queued = [R.Queued.decode(k, v) for k, v in rows if v]
        queued.sort(key=lambda q: (q.delivery != "steer", q.key))
        return [
            Input(
                [decode_block(b) for b in q.content],
                q.id,
                "steer" if q.delivery == "steer" else "send",
                "system" if q.role == "system" else "user",
                q.metadata,
                dict(q.settings),
                q.user,
                q.tenant,
            )
            for q in queued
        ]

    def events(self) -> AsyncIterator[Event]:
        """Live events from now on (deltas, completed blocks, tool calls, done, settled)."""
        return _EventStream(self._rt)


async def is_queued(tx: Tx, agent_id: str, message_id: str) -> bool:
    """Whether `message_id` is still in the agent's queue (accepted, not consumed)."""
    return any(json.loads(v).get("id") == message_id for _, v in await tx.read_prefix(agent_id, R.QUEUE) if v)


async def _until_settled(rt: AgentRuntime, events: asyncio.Queue[Event | None]) -> bool:
    """Wait for the agent's next settlement (True) or until nothing runs for it here any more (False)."""
    idle = asyncio.ensure_future(rt.wait_idle())
    try:
        while True:
            get = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({get, idle}, return_when=asyncio.FIRST_COMPLETED)
            if get in done:
                ev = get.result()
                if ev is None:
                    return False  # the agent was closed
                if isinstance(ev, Settled):
                    return True
                continue
            get.cancel()
            return False
    finally:
        idle.cancel()


class _EventStream:
    def __init__(self, rt: AgentRuntime) -> None:
        self._rt = rt
        self._q = rt.subscribe()

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Event:
        ev = await self._q.get()
        if ev is None:
            self._rt.unsubscribe(self._q)
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        self._rt.unsubscribe(self._q)


def _encode_change(change: RuntimeChange) -> dict[str, Any]:
    if not isinstance(change, RuntimeChange):
        raise InvalidInput(f"changes must be stead.RuntimeChange objects, not {type(change).__name__}")
    return change.encode()


def _settings(
    provider: str | None,
    model: str | Sequence[str] | None,
    effort: str | None,
    permission_mode: str | None,
    profile: str | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (
        ("provider", provider),
        ("model", model),
        ("effort", effort),
        ("permission_mode", permission_mode),
        ("profile", profile),
    ):
        if v is not None:
            out[k] = v
    return out


def _shown(value: object) -> str:
    """An id as an error message shows it: repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


PAYLOAD_LIMIT_HINT = "raise it with stead.open(max_payload_bytes=...)"


def check_message(
    content: str | Sequence[Block],
    *,
    metadata: dict[str, Any] | None = None,
    max_payload_bytes: int,
    limit_hint: str = PAYLOAD_LIMIT_HINT,
) -> None:
    """Refuse content that `send` would refuse (empty, not text, larger than the payload limit), without
    an agent: callers that create an agent for a message check first, so a refused message never leaves
    an agent behind. `limit_hint` says how to raise the limit (the CLI names its option)."""
    encoded_content(_content_blocks(content), metadata, max_payload_bytes, limit_hint)


def encoded_content(
    blocks: Sequence[Block],
    metadata: dict[str, Any] | None,
    limit: int,
    limit_hint: str = PAYLOAD_LIMIT_HINT,
) -> list[dict[str, Any]]:
    """The stored form of the blocks; `InvalidInput` naming the limit and how to raise it when the
    payload (content and metadata, as JSON) is larger than `limit` bytes."""
    content = [encode_block(b) for b in blocks]
    check_storable("message content", content)
    check_storable("message metadata", metadata)
    size = len(json.dumps(content)) + len(json.dumps(metadata or {}))
    if size > limit:
        raise InvalidInput(f"message is {size} bytes; the limit is {limit} bytes ({limit_hint})")
    return content


def check_storable(what: str, value: Any) -> None:
    """A7: refuse text no store can hold (a lone surrogate), naming where it is (`InvalidInput`)."""
    problem = unstorable(value)
    if problem is not None:
        raise InvalidInput(f"{what} contains {problem}")


MAX_METADATA_DEPTH = 32
"""SEC6k1: how deeply a message's metadata (and settings) may nest; their size counts towards the payload
limit (`max_payload_bytes`)."""


def _check_depth(what: str, value: Any) -> None:
    """`InvalidInput` when `value` nests lists and objects more than `MAX_METADATA_DEPTH` levels deep
    (walked without recursion, stopping at the first level too deep)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth >= MAX_METADATA_DEPTH:
                raise InvalidInput(f"{what} nests more than {MAX_METADATA_DEPTH} levels deep")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


def _content_blocks(content: str | Sequence[Block]) -> list[Block]:
    if isinstance(content, str):
        if not content.strip():
            raise InvalidInput("message content is empty")
        return [Text(content)]
    blocks = list(content)
    if not blocks:
        raise InvalidInput("message content is empty")
    for b in blocks:
        if isinstance(b, ToolCall | ToolResult):
            raise InvalidInput("input messages may contain text (and reasoning) blocks only")
        if not isinstance(b, Text | Reasoning):
            raise InvalidInput(f"not a content block: {b!r}")
    if all(isinstance(b, Text) and not b.text.strip() for b in blocks):
        raise InvalidInput("message content is empty")
    return blocks
