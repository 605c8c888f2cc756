"""How an MCP server is declared (a definition's `mcp:` list, or `McpPlugin(servers=[...])`): pure data,
no MCP SDK import, so definitions load without the optional `mcp` extra."""

from __future__ import annotations

import re
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["McpServer", "ToolOverride"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")


class ToolOverride(BaseModel):
    """What a definition says about one of a server's tools; wins over the server's annotations."""

    model_config = ConfigDict(extra="forbid")

    effects: Literal["read", "write", "external"] | None = None
    destructive: bool | None = None
    durable: bool | None = None
    approval: Literal["policy", "always", "never"] | None = None


class McpServer(BaseModel):
    """One MCP server: `command` (+ `args`, `env`, `cwd`) for stdio, or `url` (+ `headers`) for streamable
    HTTP. Its tools are offered as `NAME__TOOL`; `allow` limits which (by the server's tool names).
    `trust_annotations: true` lets the server's tool annotations set `effects` / `durable` /
    `destructive` (docs/mcp.md); otherwise every tool is `external`, at most once, and goes through the
    policy. `tools` overrides single tools. `timeout`: seconds per call (and for connecting)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    allow: list[str] | None = None
    trust_annotations: bool = False
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    timeout: float = Field(default=60.0, gt=0)

    @pydantic.field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value) or "__" in value:
            raise ValueError(f"{value!r} is not a valid server name: use 1-32 letters, digits, '_' or '-'")
        return value

    @pydantic.model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r} needs either command (stdio) or url (HTTP), not both")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError(f"MCP server {self.name!r}: args, env and cwd are for command servers")
        if self.command is not None and self.headers:
            raise ValueError(f"MCP server {self.name!r}: headers are for url servers")
        return self

    def key(self) -> str:
        """What two declarations of one server must agree on (one connection per server per process)."""
        return self.model_dump_json()
