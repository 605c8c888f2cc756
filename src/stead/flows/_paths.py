"""Payload paths: addressing values in a run's JSON payload, and the read/write patterns that restrict them.

A *path* is dotted object keys: `order.status`. An output target may end in `[]` to append to a list
(`notes[]`). A *pattern* (in `payload.read` / `payload.write`) is a path whose segments may be `*` (any one
key) or `**` (any number of keys, also none); a pattern allows the paths it matches and everything below
them. A write pattern may name the operations it allows: `order.status:update`, `notes:add,update`
(default: `add,update,delete`).

- Reading: `filter_payload(payload, patterns)` keeps exactly the allowed subtrees (and the objects on the way
  to them). No patterns (`None`) means everything is readable.
- Writing: a change is `(path, op, value)`, `op` one of `add` (the path did not exist), `update`, `delete`.
  `apply_changes` applies the allowed ones and returns the refused ones as *violations* — recorded by the
  caller, never applied. No patterns means every change is allowed.
- `diff(before, after)` lists the changes that turn one payload into the other (how a sub-agent's changes are
  merged back: only along the paths it may write).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OPERATIONS",
    "Change",
    "PathError",
    "Pattern",
    "Target",
    "apply_changes",
    "diff",
    "filter_payload",
    "get_path",
    "parse_pattern",
    "parse_target",
]

OPERATIONS = ("add", "update", "delete")
_MISSING = object()


class PathError(ValueError):
    """A malformed path or pattern."""


def _segments(text: str, *, wildcards: bool) -> tuple[str, ...]:
    if not isinstance(text, str) or not text.strip():
        raise PathError("a payload path must be a non-empty string such as 'order.status'")
    parts = tuple(text.strip().split("."))
    for part in parts:
        if not part:
            raise PathError(f"{text!r} has an empty segment (two dots, or a dot at an end)")
        if not wildcards and "*" in part:
            raise PathError(f"{text!r}: '*' is allowed in patterns (payload.read / payload.write) only")
        if wildcards and "*" in part and part not in ("*", "**"):
            raise PathError(f"{text!r}: a wildcard must be a whole segment ('*' or '**'), not {part!r}")
        if "[" in part or "]" in part:
            raise PathError(f"{text!r}: brackets are not allowed in a path (only a trailing '[]' to append)")
    return parts


@dataclass(frozen=True)
class Target:
    """Where an output mapping writes: a path, appending to a list there when `append`."""

    path: tuple[str, ...]
    append: bool = False

    def __str__(self) -> str:
        return ".".join(self.path) + ("[]" if self.append else "")


def parse_target(text: str) -> Target:
    append = isinstance(text, str) and text.strip().endswith("[]")
    raw = text.strip()[:-2] if append else text
    return Target(_segments(raw, wildcards=False), append)


@dataclass(frozen=True)
class Pattern:
    """One read or write pattern (see the module docstring)."""

    segments: tuple[str, ...]
    ops: frozenset[str] = frozenset(OPERATIONS)
    source: str = ""

    def covers(self, path: tuple[str, ...]) -> bool:
        """Whether the pattern allows `path` (it matches the path or one of its ancestors)."""
        return any(_match(self.segments, path[:n]) for n in range(len(path) + 1))

    def reaches(self, path: tuple[str, ...]) -> bool:
        """Whether the pattern may allow something at or below `path`."""
        return _prefix(self.segments, path)


def parse_pattern(text: str, *, write: bool = False) -> Pattern:
    raw, sep, ops_text = text.partition(":") if isinstance(text, str) else (text, "", "")
    ops = frozenset(OPERATIONS)
    if sep:
        if not write:
            raise PathError(f"{text!r}: operations (':add,update,delete') apply to payload.write only")
        ops = frozenset(o.strip() for o in ops_text.split(",") if o.strip())
        unknown = sorted(ops - set(OPERATIONS))
        if unknown or not ops:
            raise PathError(f"{text!r}: operations must be some of add, update, delete (got {ops_text!r})")
    return Pattern(_segments(raw, wildcards=True), ops, text)


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether `pattern` matches `path` exactly (`**` matching any number of segments)."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    if not path:
        return False
    return (head == "*" or head == path[0]) and _match(rest, path[1:])


def _prefix(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether some path that starts with `path` (or an ancestor of it) is matched by `pattern`."""
    if not path or not pattern:
        return True
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return True
    return (head == "*" or head == path[0]) and _prefix(rest, path[1:])


# ------------------------------------------------------------------------------------------------ reading
def get_path(value: Any, path: tuple[str, ...], default: Any = None) -> Any:
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def filter_payload(payload: dict[str, Any] | None, patterns: list[Pattern] | None) -> dict[str, Any] | None:
    """The part of `payload` the patterns allow to read (a copy); everything when `patterns` is None."""
    if payload is None:
        return None
    if patterns is None:
        return copy.deepcopy(payload)
    out = _filter(payload, (), patterns)
    return out if isinstance(out, dict) else {}


def _filter(value: dict[str, Any], path: tuple[str, ...], patterns: list[Pattern]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = (*path, key)
        if any(p.covers(sub) for p in patterns):
            out[key] = copy.deepcopy(item)
        elif isinstance(item, dict) and any(p.reaches(sub) for p in patterns):
            kept = _filter(item, sub, patterns)
            if kept:
                out[key] = kept
    return out


# ------------------------------------------------------------------------------------------------ writing
@dataclass(frozen=True)
class Change:
    """One change to a payload. `value` is the new value (unused for `delete`)."""

    path: tuple[str, ...]
    op: str
    value: Any = None

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": ".".join(self.path), "op": self.op}
        if self.op != "delete":
            out["value"] = self.value
        return out


def allowed(change: Change, patterns: list[Pattern] | None) -> bool:
    if patterns is None:
        return True
    return any(p.covers(change.path) and change.op in p.ops for p in patterns)


def change_for(payload: dict[str, Any], target: Target, value: Any) -> Change:
    """The change an output mapping makes by writing `value` to `target`."""
    current = get_path(payload, target.path, _MISSING)
    if target.append:
        items = current if isinstance(current, list) else []
        return Change(target.path, "add" if current is _MISSING else "update", [*items, value])
    return Change(target.path, "add" if current is _MISSING else "update", value)


def apply_changes(
    payload: dict[str, Any] | None, changes: list[Change], patterns: list[Pattern] | None
) -> tuple[dict[str, Any], list[Change], list[dict[str, Any]]]:
    """Apply the allowed `changes` to `payload`, returning (new payload, applied, violations); a violation
    is `{"path", "op", "reason"}`. Copy-on-write: the objects along each changed path are copied, nothing is
    changed in place, so `payload` (and values shared with it) stay as they were — without copying the
    whole payload for every change (a for-each appending to a list would otherwise be quadratic)."""
    out: dict[str, Any] = dict(payload) if payload is not None else {}
    applied: list[Change] = []
    violations: list[dict[str, Any]] = []
    for change in changes:
        if not allowed(change, patterns):
            shown = ", ".join(p.source for p in patterns or []) or "nothing"
            violations.append(
                {
                    "path": ".".join(change.path),
                    "op": change.op,
                    "reason": f"not writable by this agent (payload.write allows: {shown})",
                }
            )
            continue
        try:
            out = _apply(out, change)
        except PathError as e:
            violations.append({"path": ".".join(change.path), "op": change.op, "reason": str(e)})
            continue
        applied.append(change)
    return out, applied, violations


def _apply(payload: dict[str, Any], change: Change) -> dict[str, Any]:
    """`payload` with `change` applied, copying the objects along its path (never mutating them)."""
    root = dict(payload)
    node = root
    for i, part in enumerate(change.path[:-1]):
        nxt = node.get(part)
        if nxt is None:
            if change.op == "delete":
                return root
            nxt = {}
        elif not isinstance(nxt, dict):
            where = ".".join(change.path[: i + 1])
            raise PathError(f"cannot write below {where!r}: it holds a {type(nxt).__name__}, not an object")
        else:
            nxt = dict(nxt)
        node[part] = nxt
        node = nxt
    last = change.path[-1]
    if change.op == "delete":
        node.pop(last, None)
    else:
        node[last] = change.value
    return root


def diff(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Change]:
    """The changes that turn `before` into `after` (objects compared key by key, anything else whole)."""
    out: list[Change] = []
    _diff(before or {}, after or {}, (), out)
    return out


def _diff(before: dict[str, Any], after: dict[str, Any], path: tuple[str, ...], out: list[Change]) -> None:
    for key, new in after.items():
        sub = (*path, key)
        if key not in before:
            out.append(Change(sub, "add", new))
            continue
        old = before[key]
        if isinstance(old, dict) and isinstance(new, dict):
            _diff(old, new, sub, out)
        elif old != new or type(old) is not type(new):
            out.append(Change(sub, "update", new))
    for key in before:
        if key not in after:
            out.append(Change((*path, key), "delete"))
