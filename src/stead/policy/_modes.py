"""The permission-mode policy: which tool calls run, which ask a human, which are refused (pure functions).

The default table (docs/approvals.md), applied at batch dispatch with the mode that was durable when the
message was consumed (C3/P1). The column is the tool's `effects` (`read`, `write`, `external`), or
`destructive` when it declares `destructive=True`; a tool with `approval="always"` takes the worse of its
column and the `always` column:

| mode              | read | write | external | destructive | approval="always" |
|-------------------|------|-------|----------|-------------|-------------------|
| `read_only`       | run  | deny  | deny     | deny        | deny              |
| `workspace_write` | run  | run   | ask      | ask         | ask               |
| `auto`            | run  | run   | run      | ask         | ask               |
| `full_access`     | run  | run   | run      | run         | ask               |

`approval="never"` turns an `ask` into `run` (a deny stays a deny: the mode is a boundary, not a prompt).
A callable `approval(arguments)` answers True (like "always") or False (like "never"); one that raises, or
arguments that do not validate, count as True (fail closed).

Rules by tool name (per agent — `AgentConfig.extra["stead.permissions"]`, a definition's `permissions:` —
and per system — `PolicyPlugin(rules=...)`) override the table: `deny` wins over `ask`, which wins over
`allow`. Patterns are shell-style (`git__*`, `*`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stead.extend import Tool, ToolArgumentError

__all__ = ["COLUMNS", "DEFAULT_TABLE", "Rules", "Verdict", "decide", "rules_from"]

Cell = Literal["run", "ask", "deny"]
COLUMNS = ("read", "write", "external", "destructive", "always")
DEFAULT_TABLE: dict[str, dict[str, Cell]] = {
    "read_only": {
        "read": "run",
        "write": "deny",
        "external": "deny",
        "destructive": "deny",
        "always": "deny",
    },
    "workspace_write": {
        "read": "run",
        "write": "run",
        "external": "ask",
        "destructive": "ask",
        "always": "ask",
    },
    "auto": {"read": "run", "write": "run", "external": "run", "destructive": "ask", "always": "ask"},
    "full_access": {"read": "run", "write": "run", "external": "run", "destructive": "run", "always": "ask"},
}
_RANK: dict[Cell, int] = {"run": 0, "ask": 1, "deny": 2}
_WHAT = {
    "read": "reads",
    "write": "writes",
    "external": "reaches outside the workspace",
    "destructive": "is destructive",
    "always": "always needs approval",
}


@dataclass(frozen=True)
class Rules:
    """Allow / ask / deny patterns of tool names. Deny wins, then ask, then allow."""

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __add__(self, other: Rules) -> Rules:
        return Rules(self.allow + other.allow, self.ask + other.ask, self.deny + other.deny)

    def match(self, tool: str) -> Cell | None:
        for cell, patterns in (("deny", self.deny), ("ask", self.ask), ("allow", self.allow)):
            if any(fnmatch.fnmatchcase(tool, p) for p in patterns):
                return "run" if cell == "allow" else cell  # type: ignore[return-value]
        return None

    def encode(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in (("allow", self.allow), ("ask", self.ask), ("deny", self.deny)) if v}


def rules_from(value: Any) -> Rules:
    """Rules from their stored form (`{"allow": [...], "ask": [...], "deny": [...]}`); anything else: none."""
    if isinstance(value, Rules):
        return value
    if not isinstance(value, Mapping):
        return Rules()

    def names(key: str) -> tuple[str, ...]:
        v = value.get(key) or ()
        return tuple(str(x) for x in v) if isinstance(v, Iterable) and not isinstance(v, str) else ()

    return Rules(names("allow"), names("ask"), names("deny"))


@dataclass(frozen=True)
class Verdict:
    """What the policy says of one call: `run`, `ask` (with why) or `deny` (with the error result)."""

    cell: Cell
    reason: str = ""
    column: str = field(default="external")


def _wants_approval(tool: Tool, arguments: Any) -> bool | None:
    """The tool's own `approval` answer: True (ask), False (never ask) or None (the table decides)."""
    rule = tool.approval
    if rule == "always":
        return True
    if rule == "never":
        return False
    if callable(rule):
        try:
            args = tool.validate(arguments)
        except ToolArgumentError:
            return True  # invalid arguments: ask (fail closed)
        try:
            return bool(rule(args))
        except Exception:
            return True  # a callable that raises: ask (fail closed)
    return None


def decide(
    mode: str,
    tool: Tool,
    arguments: Any,
    rules: Rules = Rules(),
    table: Mapping[str, Mapping[str, Cell]] = DEFAULT_TABLE,
) -> Verdict:
    """The verdict for one call of `tool` with `arguments` under permission mode `mode`."""
    column = "destructive" if tool.destructive else tool.effects
    what = _WHAT.get(column, column)
    ruled = rules.match(tool.name)
    if ruled == "deny":
        return Verdict("deny", f"refused: {tool.name} is denied by this agent's permission rules", column)
    if ruled is not None:
        return Verdict(ruled, f"{tool.name} is listed under 'ask' in this agent's permission rules", column)
    row: Mapping[str, Cell] = table.get(mode) or table.get("auto") or DEFAULT_TABLE["auto"]
    cell: Cell = row.get(column, "ask")
    wants = _wants_approval(tool, arguments)
    if wants is True:
        always = row.get("always", "ask")
        if _RANK[always] > _RANK[cell]:
            cell, column, what = always, "always", _WHAT["always"]
    elif wants is False and cell == "ask":
        cell = "run"
    if cell == "deny":
        return Verdict("deny", f"refused: {tool.name} {what}; the agent is in {mode} mode", column)
    if cell == "ask":
        return Verdict("ask", f"{tool.name} {what} (the agent is in {mode} mode)", column)
    return Verdict("run", "", column)


def check_table(table: Mapping[str, Mapping[str, str]], modes: Sequence[str]) -> None:
    """Refuse a policy table that leaves a mode or a column out, or names an unknown cell."""
    for mode in modes:
        row = table.get(mode)
        if row is None:
            raise ValueError(f"the policy table has no row for mode {mode!r}")
        for col in COLUMNS:
            if row.get(col) not in ("run", "ask", "deny"):
                raise ValueError(f"the policy table's cell {mode}/{col} must be run, ask or deny")
