"""What memory holds: notes and examples, their scope, and the words used for them.

A **note** is a short statement about a user, an agent's work or its world (`preference`, `context`,
`constraint`, `issue`), with who wrote it (`author`), where it came from (`provenance`), whether it may be
trusted (`trust`: a note written after an external tool's output is `tainted` and never injected until a
human promotes it), a `status` (`active`, `provisional` — an agent's write, labelled as such and expiring —
or `archived`), a priority, an expiry and its source run and call.

An **example** is an input → output pair with an optional rating, shown to agents as a worked example.

Both are **scoped** by tenant, agent and user, and optionally by a primary scope (one record, e.g.
`account:42`) and secondary dimensions (`{"region": "eu"}`). A field left empty on an item matches every
value: a note with no agent applies to every agent of its user, and a note with no tenant, agent, user or
primary scope is global and matches everyone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

__all__ = [
    "AUTHORS",
    "NOTE_STATUSES",
    "NOTE_TYPES",
    "Example",
    "Note",
    "NoteType",
    "Scope",
    "normalize",
    "text_hash",
]

NoteType: TypeAlias = Literal["preference", "context", "constraint", "issue"]
NOTE_TYPES: tuple[str, ...] = ("preference", "context", "constraint", "issue")
NOTE_STATUSES: tuple[str, ...] = ("active", "provisional", "archived")
AUTHORS: tuple[str, ...] = ("human", "agent", "system")
TRUST: tuple[str, ...] = ("trusted", "tainted")
EVENTS: tuple[str, ...] = (
    "written",
    "superseded",
    "deduped",
    "rejected",
    "skipped",
    "expired",
    "promoted",
    "archived",
    "deleted",
)

_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """The form two notes are compared in: trimmed, lowercased, whitespace collapsed."""
    return _SPACE.sub(" ", text.strip().lower())


def text_hash(text: str) -> str:
    """The hash of the normalized text (duplicate detection within a run and against stored notes)."""
    return hashlib.sha256(normalize(text).encode()).hexdigest()[:32]


Secondary: TypeAlias = Mapping[str, "str | list[str]"]


@dataclass(frozen=True)
class Scope:
    """Who a search is for (or whom an item belongs to).

    `mode` decides how an item's secondary dimensions match: `cascading` (an item dimension matches when the
    caller does not name that dimension, or names an equal value) or `strict` (the caller must name it with
    an equal value). Lists mean any-of."""

    tenant: str | None = None
    agent: str | None = None
    user: str | None = None
    primary: str | None = None
    secondary: Secondary | None = None
    mode: Literal["cascading", "strict"] = "cascading"

    def admits(self, item_secondary: Mapping[str, Any] | None) -> bool:
        """Whether an item with these secondary dimensions is in this scope (the SQL filter has already
        matched tenant, agent, user and primary scope)."""
        if not item_secondary:
            return True
        mine = self.secondary or {}
        for dim, value in item_secondary.items():
            wanted = mine.get(dim)
            if wanted is None:
                if self.mode == "strict":
                    return False
                continue
            have = set(value) if isinstance(value, list) else {value}
            asked = set(wanted) if isinstance(wanted, list) else {wanted}
            if not have & asked:
                return False
        return True


@dataclass(frozen=True)
class Note:
    """One stored note. `score` is set on search results (higher is better)."""

    id: str
    text: str
    type: str
    status: str
    author: str
    provenance: str
    trust: str
    priority: int
    tenant: str | None
    agent: str | None
    user: str | None
    scope_primary: str | None
    scope_secondary: dict[str, Any] | None
    created_at: float
    updated_at: float
    expires_at: float | None = None
    source_agent: str | None = None
    source_run: str | None = None
    source_call: str | None = None
    superseded_by: str | None = None
    access_count: int = 0
    score: float | None = None

    @property
    def provisional(self) -> bool:
        return self.status == "provisional"

    @property
    def tainted(self) -> bool:
        return self.trust == "tainted"

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Example:
    """One stored input → output example. `score` is set on search results."""

    id: str
    input: str
    output: str
    rating: float | None
    status: str
    tenant: str | None
    agent: str | None
    user: str | None
    scope_primary: str | None
    scope_secondary: dict[str, Any] | None
    created_at: float
    score: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Event:
    """One row of the memory audit trail (every write, supersede, dedupe, rejection, skip, expiry,
    promotion, archival and deletion)."""

    id: str
    item_id: str | None
    kind: str
    event: str
    old_text: str | None
    new_text: str | None
    agent: str | None
    user: str | None
    run_id: str | None
    call_id: str | None
    reason: str | None
    actor: str
    created_at: float
