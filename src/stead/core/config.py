"""Agent configuration (what an agent is, as stored) and the environment a kernel runtime runs in."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stead.core.hooks import HookSet
from stead.providers.base import Provider
from stead.store.base import Store
from stead.tools._tool import Tool

__all__ = ["PERMISSION_MODES", "AgentConfig", "ContextPolicy", "Env", "RetryPolicy"]

PERMISSION_MODES = ("read_only", "workspace_write", "auto", "full_access")
QueueMode = Literal["one-at-a-time", "all"]
SETTING_NAMES = ("provider", "model", "effort", "permission_mode", "profile")


@dataclass
class ContextPolicy:
    """How an agent keeps its conversation inside the model's window (K1, docs/context.md).

    Every field is optional; what is unset is derived: `window` from the model catalog
    (`context_window`); `reserve` = min(max output 20,000 + 13,000 margin, window / 4); `keep_recent_tokens`
    = window / 4. `compaction_model` is the resolved `{"provider", "model"}` that writes summaries (default:
    the agent's own model). `expire_tool_results_after_turns` = N replaces tool results older than N
    responses by a stub in the provider context (the model can expand one again with the built-in
    `recall_tool_result(call_id)` tool). `auto=False` turns the automatic trigger off (`agent.compact()` and
    overflow recovery still work). `max_output_tokens` caps each of the agent's own responses (default: the
    catalog's output limit for its model); every request is also capped at the window minus its own
    estimated size (docs/context.md, "Output caps")."""

    window: int | None = None
    reserve: int | None = None
    keep_recent_tokens: int | None = None
    compaction_model: dict[str, Any] | None = None
    expire_tool_results_after_turns: int | None = None
    auto: bool = True
    max_output_tokens: int | None = None

    @staticmethod
    def decode(raw: Any) -> ContextPolicy:
        if isinstance(raw, ContextPolicy):
            return raw
        return ContextPolicy(**(raw or {}))


@dataclass
class AgentConfig:
    """What an agent is, as stored in the `agents` table."""

    provider: str
    model: str | list[str]
    instructions: str = ""
    tools: list[str] = field(default_factory=list)
    name: str | None = None
    steering_mode: QueueMode = "one-at-a-time"
    send_mode: QueueMode = "one-at-a-time"
    permission_mode: str = "auto"
    max_tool_concurrency: int = 8
    extra: dict[str, Any] = field(default_factory=dict)
    max_tool_result_chars: int = 100_000
    """Tool results longer than this are cut in the conversation (a tool's own `max_result_chars` wins)."""
    context: ContextPolicy = field(default_factory=ContextPolicy)
    """Context window management: compaction and expiration (`ContextPolicy`)."""
    model_options: dict[str, Any] = field(default_factory=dict)
    """Checked `stead.ModelOptions` fields (tool_choice, temperature, ...), sent with every request."""
    output_schema: dict[str, Any] | None = None
    """A JSON schema every run's final answer must satisfy (typed results; a run's own wins)."""

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def decode(raw: str) -> AgentConfig:
        data = json.loads(raw)
        data["context"] = ContextPolicy.decode(data.get("context"))
        return AgentConfig(**data)

    def initial_settings(self) -> dict[str, Any]:
        return {"provider": self.provider, "model": self.model, "permission_mode": self.permission_mode}


@dataclass
class RetryPolicy:
    """Bounded exponential backoff with full jitter for retryable provider errors.

    A streak of failures of one request is retried `max_attempts` times in all (the first try included) —
    or, with `max_elapsed` set, for that many seconds since the streak's first failure, however many
    attempts that takes (`max_attempts` then does not limit): the delays grow the same way, the last one is
    shortened so that a last attempt lands at the deadline, and once it has passed the turn fails as it
    would after the last attempt. A complete response ends the streak."""

    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_elapsed: float | None = None

    def __post_init__(self) -> None:
        if self.max_elapsed is not None and not self.max_elapsed >= 0:
            raise ValueError(f"RetryPolicy max_elapsed must be seconds >= 0, not {self.max_elapsed!r}")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        cap = min(self.max_delay, self.base_delay * (2 ** min(max(attempt - 1, 0), 60)))  # no float overflow
        return random.uniform(cap / 2, cap)

    def next_delay(self, attempt: int, elapsed: float, retry_after: float | None = None) -> float | None:
        """The seconds to wait before retry number `attempt` (1 for the first retry) of a streak whose first
        failure was `elapsed` seconds ago; None when the budget is spent (the request fails)."""
        if self.max_elapsed is None:
            return self.delay(attempt, retry_after) if attempt < self.max_attempts else None
        remaining = self.max_elapsed - elapsed
        if remaining <= 0:
            return None
        return min(self.delay(attempt, retry_after), remaining)


def default_compatible(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a settings change keeps the conversation (K2): same provider and same profile."""
    return old.get("provider") == new.get("provider") and old.get("profile") == new.get("profile")


@dataclass
class Env:
    """Everything a runtime needs from its system."""

    store: Store
    providers: dict[str, Provider]
    tools: dict[str, Tool]
    hooks: HookSet
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    store_retry_delay: float = 0.05
    max_payload_bytes: int = 1_000_000
    compatible: Callable[[dict[str, Any], dict[str, Any]], bool] = default_compatible
    resolve_provider: Callable[[dict[str, Any]], Provider | None] | None = None
    context_window: Callable[[dict[str, Any]], int | None] | None = None
    """The window of the model some settings name (the catalog's `context_window`), or None if unknown."""
    output_limit: Callable[[dict[str, Any]], int | None] | None = None
    """The output limit of the model some settings name (the catalog's `max_output`), or None if unknown."""
    lease_lost: Callable[[str], None] | None = None
    """Called with the agent id when a transaction of its loop raised `LeaseLost` (`stead.core.fleet`)."""
    remote_abort: Callable[[str], Awaitable[None]] | None = None
    """Aborts an agent this process does not run (PostgreSQL: asks its owner, `stead.core.fleet`)."""
    pin_lease: Callable[[str], None] | None = None
    """Called with the agent id as its loop starts, inside the loop's task: that loop (and its tools) may
    commit only under the lease this process holds now (W6, `PostgresStore.pin`)."""
