"""How an MCP server is declared (a definition's `mcp:` list, or `McpPlugin(servers=[...])`): pure data,
no MCP SDK import, so definitions load without the optional `mcp` extra."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from stead.extend import ConfigurationError

__all__ = ["McpServer", "ToolOverride", "expand"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str, where: str, environ: Mapping[str, str] | None = None) -> str:
    """SEC7k2: `value` with each `${NAME}` replaced by the environment variable NAME, in one pass — and
    nothing else: `$NAME`, `${NAME:-default}`, `$(command)`, `~` and a `${...}` inside a variable's value
    stay as written. A `${NAME}` that is not set is a `ConfigurationError` naming it (`where`: which
    server and key), never sent as written."""
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigurationError(f"{where} uses ${{{name}}}, which is not set in the environment")
        return env[name]

    return _VARIABLE.sub(one, value)


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

    def expanded_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """`env` with `${NAME}` expanded (only that form, `expand`)."""
        return {k: expand(v, f"MCP server {self.name!r}: env {k}", environ) for k, v in self.env.items()}

    def expanded_headers(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """`headers` with `${NAME}` expanded (only that form, `expand`)."""
        return {
            k: expand(v, f"MCP server {self.name!r}: header {k}", environ) for k, v in self.headers.items()
        }

    def key(self) -> str:
        """What two declarations of one server must agree on (one connection per server per process)."""
        return self.model_dump_json()
