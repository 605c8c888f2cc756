"""What plugins and the system share without importing each other: the inbound-message view validators
see, the migrations type, and the small protocols through which the system offers an API backed by a plugin.
`stead.Plugin` itself lives with `AgentSystem` (`stead.system`), which it receives.

`stead.Plugin` is the one way a layer extends stead.

Every layer above the kernel — run records, tracing, orchestration, memory, approvals, MCP, realtime, the
HTTP service — is a plugin, and a plugin written outside this package can do everything a built-in one does.
A plugin may contribute:

- **tools** (`tools()`) and **providers** (`providers()`), registered with the system before it starts;
- **hooks** (`hooks()`): `stead.Hooks` objects; the kernel calls only the methods they override;
- **schema migrations** (`migrations`), per store dialect (`"sqlite"`, `"postgresql"`): module name → ordered
  SQL scripts, applied when the store opens, before anything runs; a plugin with tables but no scripts for
  the store's dialect refuses to open on it instead of failing later;
- **validators of inbound messages** (`validate_message`), called for every message before anything is
  written (A7), so a refusal leaves no trace;
- **lifecycle** (`start`, `close`) with the system, reached through its public methods only.

Everything is optional: the base class contributes nothing. Plugins compose in the order given to
`stead.open(url, plugins=[...])`; the keyword shortcuts (`records=`, `tracer_provider=`, `definitions=`) add
the built-in plugins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stead.messages import Block

__all__ = [
    "STEP_TYPE_KEY",
    "DefinitionSource",
    "IncomingMessage",
    "MemorySource",
    "Migrations",
    "RealtimeSessionHandle",
    "RealtimeSource",
    "TraceContextSource",
]

STEP_TYPE_KEY = "stead.step_type"
"""`Tool.metadata` key naming the run-record step type of the tool's calls (`sub_agent` for delegations;
absent: `tool`)."""

Migrations = Mapping[str, Mapping[str, Sequence[str]]]
"""Store dialect (`"sqlite"`, `"postgresql"`) → module name → ordered SQL scripts (append only: each script
migrates the module from version i to i + 1, and runs once per database)."""


@dataclass(frozen=True)
class IncomingMessage:
    """What a validator sees of one message on its way into an agent's queue, before any write.

    The content and metadata are the caller's, already copied and checked by the kernel (non-empty,
    JSON-serializable, within the payload limit); `settings` are the per-message settings it carries."""

    agent_id: str
    agent_name: str | None
    id: str
    delivery: str
    """`send` or `steer`."""
    role: str
    content: list[Block]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]
    agent_extra: dict[str, Any] = field(default_factory=dict)
    """The agent's configuration extras (what higher layers stored at creation)."""
    user: str | None = None
    """Who sends the message (`agent.send(..., user=...)`), or None."""
    tenant: str | None = None


@runtime_checkable
class DefinitionSource(Protocol):
    """A plugin that builds agents from named definitions (`system.create(definition=NAME, data=...)`)."""

    def config_for(self, name: str, *, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Keyword arguments for `system.create` (provider, model, instructions, tools, name, extra)."""
        ...


@runtime_checkable
class TraceContextSource(Protocol):
    """A plugin that knows the trace context of a running tool call (a tracing plugin): layers that start
    work on behalf of a call (delegation) propagate it so the new spans nest under the call's span."""

    def traceparent_for_call(self, call_id: str) -> str | None: ...


@runtime_checkable
class MemorySource(Protocol):
    """A plugin that keeps agents' long-term memory: `system.memory` is its `memory` (the memory plugin's
    `stead.memory.Memory`: notes and examples to add, search, list, promote, archive and delete)."""

    @property
    def memory(self) -> Any: ...


@runtime_checkable
class RealtimeSessionHandle(Protocol):
    """What `system.realtime(...)` returns: a live duplex session of a realtime agent (docs/realtime.md)."""

    @property
    def id(self) -> str: ...
    async def send_text(self, text: str) -> None: ...
    async def send_audio(self, pcm16: bytes) -> None: ...
    def events(self) -> AsyncIterator[Any]: ...
    async def interrupt(self) -> None: ...
    async def close(self) -> None: ...


@runtime_checkable
class RealtimeSource(Protocol):
    """A plugin that opens realtime sessions for `system.realtime(definition=...)` (the realtime plugin),
    so the system offers the method without importing the layer behind it. `system` is the
    `stead.AgentSystem` asking."""

    async def open_session(
        self,
        system: Any,
        definition: str,
        *,
        session_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> RealtimeSessionHandle: ...
