"""A registry: the agent definitions of one directory, by name, with their references checked."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from stead.definitions._schema import AgentDefinition

__all__ = ["Registry"]


class Registry(Mapping[str, AgentDefinition]):
    """Definitions by name. Build one with `stead.definitions.load_registry(directory)` or from
    already-loaded definitions (`Registry.of(a, b, ...)`, references unchecked)."""

    def __init__(self, directory: Path | None, definitions: dict[str, AgentDefinition]) -> None:
        self.directory = directory
        self._defs = dict(definitions)

    @staticmethod
    def of(*definitions: AgentDefinition) -> Registry:
        return Registry(None, {d.name: d for d in definitions})

    def __getitem__(self, name: str) -> AgentDefinition:
        return self._defs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._defs)

    def __len__(self) -> int:
        return len(self._defs)

    def __repr__(self) -> str:
        return f"<stead.definitions.Registry {sorted(self._defs)}>"
