"""`stead.Agent`: the handle users hold. Validates and copies input, then hands it to the kernel."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stead._ids import ID_RULE, is_valid_user_id, new_id
from stead.core import records as R
from stead.core.config import PERMISSION_MODES
from stead.core.events import Event
from stead.core.runtime import AgentRuntime, Inbound
from stead.errors import InvalidId, InvalidInput
from stead.messages import Block, Message, Reasoning, Text, ToolCall, ToolResult, encode_block

if TYPE_CHECKING:
    from stead.orchestration import RuntimeChange
    from stead.system import AgentSystem

__all__ = ["Acceptance", "Agent", "Input", "check_message"]


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


class Agent:
    """A durable agent. Obtain one from `system.create(...)` or `system.get(id)`."""

    def __init__(self, system: AgentSystem, runtime: AgentRuntime) -> None:
        self._system = system
        self._rt = runtime

    def __repr__(self) -> str:
        return f"<stead.Agent {self.id} name={self.name!r} active={self.active}>"

    @property
    def id(self) -> str:
        return self._rt.id

    @property
    def name(self) -> str | None:
        return self._rt.config.name

    @property
    def active(self) -> bool:
        """Whether the agent owes work (a durable pending record exists)."""
        return self._rt.active

    @property
    def state(self) -> Literal["idle", "working", "blocked", "stopped"]:
        """`idle`: nothing owed. `working`: work is owed and this process runs it. `blocked`: work is owed
        but this process lacks its provider. `stopped`: work is owed but the agent was drained or closed
        here; the next owner of the store runs it."""
        rt = self._rt
        if not rt.active:
            return "idle"
        if rt.blocked is not None:
            return "blocked"
        if rt.draining or rt.closed:
            return "stopped"
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
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        effort: str | None = None,
        permission_mode: str | None = None,
        profile: str | None = None,
        changes: Sequence[RuntimeChange] | None = None,
    ) -> Acceptance:
        """Queue a message for when the agent would otherwise stop. Returns after the durable write (A2).

        `changes` (`stead.RuntimeChange`s) add or remove tools and sub-agents for the run this message
        starts, scoped to the root, every agent of the delegation tree, the sub-agents, or named agents;
        they travel in the message metadata (`stead.changes`) and are as durable as the message."""
        settings = _settings(provider, model, effort, permission_mode, profile)
        if changes:
            metadata = {**(metadata or {}), "stead.changes": self._system.orchestrator.check_changes(changes)}
        (acc,) = await self.deliver([Input(content, id, "send", role, metadata, settings)])
        return acc

    async def steer(
        self,
        content: str | Sequence[Block],
        *,
        id: str | None = None,
        role: Literal["user", "system"] = "user",
        metadata: dict[str, Any] | None = None,
        provider: str | None = None,
        model: str | Sequence[str] | None = None,
        effort: str | None = None,
        permission_mode: str | None = None,
        profile: str | None = None,
    ) -> Acceptance:
        """Queue a message injected at the next boundary between responses (outranks sends, C2)."""
        settings = _settings(provider, model, effort, permission_mode, profile)
        (acc,) = await self.deliver([Input(content, id, "steer", role, metadata, settings)])
        return acc

    async def deliver(self, inputs: Sequence[Input]) -> list[Acceptance]:
        """Accept several messages in one transaction: all of them or none (A1)."""
        self._system._check_open()
        items = [self._validate(i) for i in inputs]
        if not items:
            raise InvalidInput("deliver() needs at least one message")
        ids = [i.id for i in items]
        if len(set(ids)) != len(ids):
            raise InvalidInput("the same message id appears twice in one delivery")
        created = await self._system._accept(self._rt, items)
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
        if "model" in settings and "provider" not in settings:
            current = str(self._rt.settings.get("provider"))
            inferred = self._system.router.infer_provider(settings["model"], current)
            if inferred != current:
                settings["provider"] = inferred
        if "provider" in settings or "model" in settings:
            self._system._check_provider(
                str(settings.get("provider", self._rt.settings.get("provider"))),
                settings.get("model", self._rt.settings.get("model")),
            )
        content = encoded_content(blocks, metadata, self._system._env.max_payload_bytes)
        return Inbound(msg_id, item.delivery, item.role, content, metadata, settings)

    async def abort(self) -> None:
        """Cancel the current turn (X1). Returns once the agent has settled; a no-op when idle."""
        await self._rt.abort()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until nothing is owed (or the system stops running it). Raises `TimeoutError`."""
        if timeout is None:
            await self._rt.wait_idle()
        else:
            await asyncio.wait_for(self._rt.wait_idle(), timeout)

    async def history(self) -> list[Message]:
        """The conversation as stored (read from the store, not from memory)."""
        async with self._system.store.transaction() as tx:
            raw = await tx.load(self.id)
        return R.build_messages([json.loads(r) for r in raw])

    def events(self) -> AsyncIterator[Event]:
        """Live events from now on (deltas, completed blocks, tool calls, done, settled)."""
        return _EventStream(self._rt)


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
    size = len(json.dumps(content)) + len(json.dumps(metadata or {}))
    if size > limit:
        raise InvalidInput(f"message is {size} bytes; the limit is {limit} bytes ({limit_hint})")
    return content


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
