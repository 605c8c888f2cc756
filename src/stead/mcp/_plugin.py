"""`McpPlugin`: MCP servers' tools as stead tools (`SERVER__TOOL`), offered to the agents that declare the
server, with flags from the server's annotations only when the declaration trusts them.

Annotations → flags (`trust_annotations: true`; docs/mcp.md), spec defaults for a missing hint (not
read-only, destructive, not idempotent, open world):

| annotations                 | effects                      | durable (may run again) | destructive |
|-----------------------------|------------------------------|-------------------------|-------------|
| read-only, closed world     | `read`                       | yes                     | no          |
| read-only, open world       | `external`                   | yes                     | no          |
| idempotent, not destructive | `write` (`external` if open) | yes (no further effect) | no          |
| not idempotent              | `write` / `external`         | no: at most once        | no          |
| destructive                 | `write` / `external`         | no                      | yes         |

Without trust every tool is `external`, at most once, and goes through the policy (a server's own claims
are not an authorization: "Clients should never make tool use decisions based on ToolAnnotations
received from untrusted servers"). Per-tool overrides in the declaration (`tools: {NAME: {...}}`) win. A
tool is never `transactional`: its effects happen in another process.

Results: `is_error` becomes an error result; `structured_content` is shown (as JSON) when the tool
declares an output schema (unless it only wraps a plain value), the text content otherwise; images, audio
and resources become short text markers. A call in flight when its server dies: a durable tool's call is
sent again once the server is back; any other gets an error result saying its effect is unknown (T5's
in-doubt rule).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stead.extend import (
    AgentSystem,
    ConfigurationError,
    HookContext,
    Hooks,
    OfferedToolsInfo,
    Plugin,
    Tool,
    ToolArgumentError,
    ToolContext,
)
from stead.mcp._config import McpServer
from stead.mcp._connection import Connection, ServerGone

__all__ = ["MCP_KEY", "McpPlugin", "McpTool", "McpToolError", "flags_for", "render_result", "tool_name"]

log = logging.getLogger("stead.mcp")

MCP_KEY = "stead.mcp"
"""`AgentConfig.extra` key: the names of the MCP servers whose tools the agent is offered."""
_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


class McpToolError(Exception):
    """The server answered the call with `is_error`, or the call could not complete."""


def tool_name(server: str, tool: str) -> str:
    """The stead name of a server's tool: `SERVER__TOOL`, with characters outside `[a-zA-Z0-9_-]` replaced
    by `_` and cut to 64 characters."""
    return _INVALID.sub("_", f"{server}__{tool}")[:64]


def flags_for(annotations: Any, trusted: bool) -> tuple[str, bool, bool]:
    """(effects, durable, destructive) of a tool with these annotations (the table in the docstring)."""
    if not trusted:
        return "external", False, False
    read_only = bool(getattr(annotations, "read_only_hint", None) or False)
    destructive_hint = getattr(annotations, "destructive_hint", None)
    idempotent = bool(getattr(annotations, "idempotent_hint", None) or False)
    open_world_hint = getattr(annotations, "open_world_hint", None)
    open_world = True if open_world_hint is None else bool(open_world_hint)
    if read_only:
        return ("external" if open_world else "read"), True, False
    destructive = True if destructive_hint is None else bool(destructive_hint)
    effects = "external" if open_world else "write"
    return effects, idempotent and not destructive, destructive


def render_result(result: Any, structured: bool) -> str:
    """What the model sees of a `CallToolResult`: the structured content (as JSON) when the tool declares
    an output schema — unless it only wraps a plain value (`{"result": ...}`, how SDK servers return a
    string), then the text — else the content blocks."""
    data = result.structured_content
    has_text = any(getattr(b, "type", "") == "text" for b in result.content or ())
    if (
        structured
        and data is not None
        and not (has_text and isinstance(data, dict) and set(data) == {"result"})
    ):
        return json.dumps(data, ensure_ascii=False)
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(
                f"[{kind} {getattr(block, 'mime_type', '')}, {len(getattr(block, 'data', ''))} chars]"
            )
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(str(block))
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


@dataclass
class McpTool(Tool):
    """A tool of an MCP server. Arguments are checked against the server's JSON schema (T6)."""

    server: str = ""
    remote: str = ""
    structured: bool = False
    plugin: McpPlugin | None = field(default=None, repr=False)
    _validator: Any = field(default=None, repr=False)

    def validate(self, arguments: dict[str, Any] | str) -> dict[str, Any]:
        args = super().validate(arguments)  # JSON, an object
        if self._validator is not None:
            problems = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
            if problems:
                shown = "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in problems[:5]
                )
                raise ToolArgumentError(f"arguments do not match the schema of {self.name}: {shown}")
        return args

    async def call(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        assert self.plugin is not None
        return await self.plugin.call(self, arguments)


class McpPlugin(Plugin):
    """MCP servers' tools. `stead.open(url, mcp=[...])` adds one; definitions with `mcp:` add their servers.

    `servers`: `McpServer` declarations (or dicts of the same keys). `in_process`: server name → an
    in-process `mcp.server.mcpserver.MCPServer` (tests), used instead of the declaration's command/url.
    Agents are offered the tools of the servers named in `extra["stead.mcp"]` (a definition's `mcp:`),
    and any agent may list single tools (`tools=["time__get_current_time"]`)."""

    name: ClassVar[str] = "mcp"

    def __init__(
        self,
        servers: Sequence[McpServer | Mapping[str, Any]] = (),
        *,
        in_process: Mapping[str, Any] | None = None,
        backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        self.specs: dict[str, McpServer] = {}
        for s in servers:
            spec = s if isinstance(s, McpServer) else McpServer.model_validate(dict(s))
            known = self.specs.get(spec.name)
            if known is not None and known.key() != spec.key():
                raise ConfigurationError(f"two different MCP servers are named {spec.name!r}")
            self.specs[spec.name] = spec
        self.in_process = dict(in_process or {})
        unknown = sorted(set(self.in_process) - set(self.specs))
        if unknown:
            raise ConfigurationError(f"in-process MCP servers without a declaration: {', '.join(unknown)}")
        self.backoff = backoff
        self.connections: dict[str, Connection] = {}
        self.tools_by_server: dict[str, dict[str, McpTool]] = {}
        self._names: dict[str, list[str]] = {}
        self._system: AgentSystem | None = None
        self._hooks = _McpHooks(self)

    def hooks(self) -> list[Hooks]:
        return [self._hooks]

    async def start(self, system: AgentSystem) -> None:
        self._system = system
        if system.readonly or not self.specs:
            return
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "MCP servers are declared but the MCP SDK is not installed: pip install 'stead[mcp]'"
            ) from None
        for name, spec in self.specs.items():
            conn = Connection(
                spec, server=self.in_process.get(name), on_tools=self._listed, backoff=self.backoff
            )
            self.connections[name] = conn
        results = await asyncio.gather(*(c.start() for c in self.connections.values()))
        for conn, up in zip(self.connections.values(), results, strict=True):
            if not up:
                log.warning(
                    "MCP server %r is not up yet (%s); its tools appear when it starts",
                    conn.name,
                    conn.last_error or "timed out",
                )

    async def close(self, system: AgentSystem) -> None:
        await asyncio.gather(*(c.close() for c in self.connections.values()))

    # ------------------------------------------------------------------ tools
    def tool_names(self, server: str) -> list[str]:
        """The stead names of a server's tools, as last listed (after its `allow` filter)."""
        return list(self._names.get(server, ()))

    def _listed(self, conn: Connection) -> None:
        """A (re)listing arrived: build or update the server's tools and register new ones."""
        spec = conn.spec
        have = self.tools_by_server.setdefault(spec.name, {})
        names: list[str] = []
        new: list[McpTool] = []
        for remote in conn.tools:
            if spec.allow is not None and remote.name not in spec.allow:
                continue
            t = have.get(remote.name)
            if t is None:
                t = McpTool(name=tool_name(spec.name, remote.name), description="", fn=_never, parameters={})
                t.server, t.remote, t.plugin = spec.name, remote.name, self
                have[remote.name] = t
                new.append(t)
            self._describe(t, spec, remote)
            names.append(t.name)
        self._names[spec.name] = names
        if new and self._system is not None:
            self._system.add_tools(new)

    @staticmethod
    def _describe(t: McpTool, spec: McpServer, remote: Any) -> None:
        schema = dict(remote.input_schema or {"type": "object"})
        t.description = remote.description or remote.title or remote.name
        t.parameters = schema
        t.structured = remote.output_schema is not None
        effects, durable, destructive = flags_for(remote.annotations, spec.trust_annotations)
        approval = "policy"
        override = spec.tools.get(remote.name)
        if override is not None:
            effects = override.effects or effects
            durable = durable if override.durable is None else override.durable
            destructive = destructive if override.destructive is None else override.destructive
            approval = override.approval or approval
        t.effects, t.durable, t.destructive, t.approval = effects, durable, destructive, approval
        t.metadata["stead.mcp.annotations"] = (
            remote.annotations.model_dump(exclude_none=True) if remote.annotations is not None else {}
        )
        try:
            from jsonschema import Draft202012Validator

            t._validator = Draft202012Validator(schema)
        except Exception:  # an unusable schema: the server validates instead
            t._validator = None

    def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
        servers = ctx.extra.get(MCP_KEY)
        if not servers:
            return info.tools
        out = list(info.tools)
        for server in servers:
            out.extend(n for n in self._names.get(str(server), ()) if n not in out)
        return out

    # ------------------------------------------------------------------ calls
    async def call(self, t: McpTool, arguments: dict[str, Any]) -> str:
        conn = self.connections.get(t.server)
        if conn is None:
            raise McpToolError(f"the MCP server {t.server!r} is not connected in this process")
        try:
            result = await conn.call(t.remote, arguments)
        except ServerGone as e:
            if e.sent and not t.durable:
                raise McpToolError(
                    f"{e}; whether its effect happened is unknown, so it was not sent again"
                ) from None
            result = await conn.call(t.remote, arguments)  # not sent, or safe to repeat: once more
        if result.is_error:
            raise McpToolError(render_result(result, False) or "the tool reported an error")
        return render_result(result, t.structured)


async def _never(**_: Any) -> Any:  # pragma: no cover - McpTool.call replaces the function
    raise AssertionError("McpTool.call is used instead")


class _McpHooks(Hooks):
    def __init__(self, plugin: McpPlugin) -> None:
        self.plugin = plugin

    def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
        return self.plugin.offered_tools(ctx, info)
