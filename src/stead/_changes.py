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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stead.errors import InvalidInput

__all__ = ["CHANGES_KEY", "RuntimeChange", "applicable", "decode_changes", "effective", "propagate"]

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


def applicable(change: RuntimeChange, depth: int, name: str | None) -> bool:
    """Whether `change` applies to an agent at `depth` named `name`."""
    if change.scope == "global":
        return True
    if change.scope == "root":
        return depth == 0
    if change.scope == "all-subagents":
        return depth > 0
    return name is not None and name in change.agents


def propagate(changes: Iterable[RuntimeChange]) -> list[RuntimeChange]:
    """The changes a child inherits: root dropped, all-subagents → global, global and specific kept."""
    out: list[RuntimeChange] = []
    for c in changes:
        if c.scope == "root":
            continue
        if c.scope == "all-subagents":
            c = RuntimeChange(c.action, c.kind, c.name, "global", c.agents)
        out.append(c)
    return out


def effective(
    tools: Sequence[str],
    sub_agents: Sequence[str],
    changes: Iterable[RuntimeChange],
    depth: int,
    name: str | None,
) -> tuple[list[str], list[str]]:
    """Apply the applicable changes in order to a copy of (tools, sub_agents); adds skip duplicates."""
    t, s = list(tools), list(sub_agents)
    for c in changes:
        if not applicable(c, depth, name):
            continue
        target = t if c.kind == "tool" else s
        if c.action == "add":
            if c.name not in target:
                target.append(c.name)
        elif c.name in target:
            target.remove(c.name)
    return t, s
