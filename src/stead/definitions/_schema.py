"""The agent definition schema (DESIGN §7): what an agent *is*, as written in a YAML file.

Only the `loop` type and the fields below exist so far; later issues add sub-agents, memory, limits and
payloads. Unknown keys are refused, so a typo never silently does nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from stead.providers.base import Provider
from stead.tools._tool import Tool

__all__ = ["KNOWN_PROVIDERS", "AgentDefinition", "parse_model"]

KNOWN_PROVIDERS = ("scripted", "openai", "anthropic")
"""Model prefixes a definition may use: `scripted:FILE.yaml`, `openai:MODEL`, `anthropic:MODEL`."""

_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")


def parse_model(model: str) -> tuple[str, str]:
    """Split `provider:model` (e.g. `openai:gpt-4.1-mini`, `scripted:model.yaml`)."""
    provider, sep, name = model.partition(":")
    if not sep or not provider or not name:
        raise ValueError(f"must look like 'provider:model' (e.g. 'openai:gpt-4.1-mini'), not {model!r}")
    return provider, name


class AgentDefinition(BaseModel):
    """An agent definition. Build it with `stead.definitions.load_definition(path)`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Lowercase letters, digits, `_` and `-` (at most 64)."""
    description: str | None = None
    type: Literal["loop"] = "loop"
    """`loop`: the model decides, calling tools until it answers (`flow` and `realtime` come later)."""
    instructions: str = ""
    model: str
    """`provider:model` — `scripted:model.yaml` (a scripted model file next to the definition),
    `openai:gpt-4.1-mini`, `anthropic:claude-sonnet-4-5`, ..."""
    tools: list[str] = Field(default_factory=list)
    """Import paths: `package.module:name` or `file.py:name` (relative to the definition file)."""

    _source: Path | None = PrivateAttr(default=None)
    _tools: list[Tool] = PrivateAttr(default_factory=list)
    _provider: Provider | None = PrivateAttr(default=None)

    @pydantic.field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a valid name: use 1-64 lowercase letters, digits, '_' or '-'")
        return value

    @pydantic.field_validator("type", mode="before")
    @classmethod
    def _check_type(cls, value: Any) -> Any:
        if isinstance(value, str) and value in ("flow", "realtime"):
            raise ValueError(f"type {value!r} is not supported yet; use 'loop'")
        if value != "loop":
            raise ValueError(f"unknown agent type {value!r}; use 'loop'")
        return value

    @pydantic.field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        provider, _ = parse_model(value)
        if provider not in KNOWN_PROVIDERS:
            raise ValueError(f"unknown provider {provider!r}; known: {', '.join(KNOWN_PROVIDERS)}")
        return value

    # ------------------------------------------------------------------ resolved by the loader
    @property
    def source(self) -> Path | None:
        """The file this definition was loaded from."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """The directory relative paths (tools, scripted models) resolve against."""
        return self._source.parent if self._source is not None else Path.cwd()

    @property
    def provider_name(self) -> str:
        return parse_model(self.model)[0]

    @property
    def model_name(self) -> str:
        return parse_model(self.model)[1]

    @property
    def resolved_tools(self) -> list[Tool]:
        """The imported tools, in the order the definition lists them."""
        return list(self._tools)
