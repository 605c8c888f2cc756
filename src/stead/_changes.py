"""Runtime changes: add or remove tools and sub-agents for one run, with a scope (docs/orchestration.md).

A change rides in the metadata of the message that starts the run (`metadata["stead.changes"]`), so it is
as durable as the message. Applicability by scope, for an agent at `depth` (0 = the root of the delegation
tree) named `name`:

    root           depth 0 only
    global         every agent of the tree
    all-subagents  depth > 0 only
    specific       only the agents named in `agents`

Propagation to a child when delegating: `root` is dropped, `all-subagents` becomes `global`, `global` and
`specific` are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stead.errors import InvalidInput

__all__ = ["CHANGES_KEY", "RuntimeChange", "decode_changes"]

CHANGES_KEY = "stead.changes"
"""Message metadata key carrying the run's changes (a list of encoded `RuntimeChange`s)."""

Action = Literal["add", "remove"]
Kind = Literal["tool", "sub_agent"]
Scope = Literal["root", "global", "all-subagents", "specific"]

_ACTIONS = ("add", "remove")
_KINDS = ("tool", "sub_agent")
_SCOPES = ("root", "global", "all-subagents", "specific")


@dataclass(frozen=True)
class RuntimeChange:
    """Add or remove one tool or sub-agent for the run a message starts.

    `stead.RuntimeChange(action="remove", kind="tool", name="search", scope="all-subagents")`"""

    action: Action
    kind: Kind
    name: str
    scope: Scope = "root"
    agents: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise InvalidInput(f"RuntimeChange.action must be 'add' or 'remove', not {self.action!r}")
        if self.kind not in _KINDS:
            raise InvalidInput(f"RuntimeChange.kind must be 'tool' or 'sub_agent', not {self.kind!r}")
        if self.scope not in _SCOPES:
            raise InvalidInput(f"RuntimeChange.scope must be one of {', '.join(_SCOPES)}, not {self.scope!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInput("RuntimeChange.name must be a non-empty string")
        if isinstance(self.agents, str):
            raise InvalidInput("RuntimeChange.agents must be a list of agent (definition) names")
        object.__setattr__(self, "agents", tuple(self.agents))
        if self.scope == "specific" and not self.agents:
            raise InvalidInput("a RuntimeChange with scope 'specific' needs agents=[...]")

    def encode(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action, "kind": self.kind, "name": self.name, "scope": self.scope}
        if self.agents:
            d["agents"] = list(self.agents)
        return d

    @staticmethod
    def decode(raw: Any) -> RuntimeChange:
        if not isinstance(raw, dict):
            raise InvalidInput(f"a runtime change must be an object, not {type(raw).__name__}")
        return RuntimeChange(
            action=raw.get("action"),  # type: ignore[arg-type]
            kind=raw.get("kind"),  # type: ignore[arg-type]
            name=raw.get("name"),  # type: ignore[arg-type]
            scope=raw.get("scope", "root"),
            agents=tuple(raw.get("agents") or ()),
        )


def decode_changes(metadata: dict[str, Any] | None) -> list[RuntimeChange]:
    """The changes carried by a message's metadata (malformed entries are ignored)."""
    if not metadata:
        return []
    raw = metadata.get(CHANGES_KEY)
    if not isinstance(raw, list):
        return []
    out: list[RuntimeChange] = []
    for item in raw:
        try:
            out.append(RuntimeChange.decode(item))
        except InvalidInput:
            continue
    return out
