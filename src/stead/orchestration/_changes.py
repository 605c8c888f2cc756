"""Runtime changes in a delegation tree (docs/orchestration.md): which changes apply to an agent by scope,
what a child inherits, and the tools and sub-agents in effect. The change itself (`stead.RuntimeChange`) rides
in the metadata of the message that starts the run (`stead.extend.CHANGES_KEY`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stead.extend import RuntimeChange

__all__ = ["applicable", "effective", "propagate"]


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
