"""Every exception stead raises, in one hierarchy rooted at `SteadError`.

SteadError
  InvalidInput            bad argument given by the caller; nothing was written
    InvalidId
  NotFound
    AgentNotFound
    RunNotFound
  Closed                  the agent or system no longer accepts work
  StoreError              the store failed; the operation had no durable effect
    StoreLocked           another process owns the database
    ReadOnly              a write through a store opened with readonly=True
    StoreCrashed          (tests) the store was made to fail permanently
    SchemaTooNew
    LeaseLost             (PostgreSQL) another worker took the agent over: never retried
  ProviderError           a model provider failed (`retryable` tells whether retrying may help)
  RunFailed               `agent.run(..., check=True)`: the run failed (carries its result)
  ConfigurationError      a definition, tool or provider setting is wrong
    DefinitionError       carries file and line
  CloseFromInside         an agent's own loop asked to close what it runs in
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CONTEXT_TOO_LONG",
    "AgentNotFound",
    "CloseFromInside",
    "Closed",
    "CompactionFailed",
    "ConfigurationError",
    "DefinitionError",
    "InvalidId",
    "InvalidInput",
    "LeaseLost",
    "NotFound",
    "ProviderError",
    "ReadOnly",
    "RunFailed",
    "RunNotFound",
    "SchemaTooNew",
    "SteadError",
    "StoreCrashed",
    "StoreError",
    "StoreLocked",
    "context_overflow",
]


class SteadError(Exception):
    """Base class of every error stead raises."""


class InvalidInput(SteadError, ValueError):
    """The caller passed something stead refuses; nothing was written."""


class InvalidId(InvalidInput):
    """An id is malformed (caller-chosen ids: 1-128 characters from `[A-Za-z0-9._:@-]`)."""


class NotFound(SteadError, LookupError):
    """A named thing does not exist."""


class AgentNotFound(NotFound):
    """No agent has this id."""


class RunNotFound(NotFound):
    """No run has this id."""


class Closed(SteadError):
    """The agent or system is closed (or closing) and accepts no more work."""


class CloseFromInside(SteadError):
    """Code running inside an agent's own loop asked to close it, which would wait on itself."""


class StoreError(SteadError):
    """The store failed; the operation that raised it left no durable effect."""


class StoreLocked(StoreError):
    """Another process (or another open store in this process) owns the database."""


class ReadOnly(StoreError):
    """A write was attempted through a store (or agent system) opened with `readonly=True`."""


class StoreCrashed(StoreError):
    """The store was made to fail permanently (crash-point injection in tests)."""


class SchemaTooNew(StoreError):
    """The database was written by a newer stead; this version refuses to open it."""


class LeaseLost(StoreError):
    """A PostgreSQL transaction touched an agent whose lease this process no longer holds: another worker
    took it over (its epoch moved). The transaction was rolled back by the database (the fence), so it had no
    durable effect, like every `StoreError`; unlike the others it is not transient: retrying can never
    succeed. The agent's loop in this process must stop and drop its memory; `agent_id` names it."""

    def __init__(self, message: str, agent_id: str | None = None, *, retaken: bool = False) -> None:
        super().__init__(message)
        self.agent_id = agent_id
        self.retaken = retaken
        """This process holds a newer lease on the agent: only the loop that ran under the old one (W6)
        must stop; the agent itself stays with this process."""


class ProviderError(SteadError):
    """A model provider failed. `retryable` is true for 429, 5xx, overload, timeouts and dropped streams."""

    def __init__(self, message: str, *, retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class CompactionFailed(SteadError):
    """`agent.compact()` did not carry out the compaction: it was attempted and failed (the summary request
    failed; the history is unchanged), or — `rejected` — nobody will run it (the agent was aborted, closed,
    drained or is blocked here)."""

    def __init__(self, message: str, *, rejected: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected


class RunFailed(SteadError):
    """`agent.run(..., check=True)` found that the run failed. `result` is its `stead.RunResult` (the
    messages, the usage, `outcome`, `error`); `run_id` and `error` are copied from it."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result
        self.run_id: str | None = getattr(result, "run_id", None)
        self.error: str | None = getattr(result, "error", None)


class ConfigurationError(SteadError):
    """A setting, tool, provider or model reference is wrong."""


class DefinitionError(ConfigurationError):
    """An agent definition file is invalid; the message starts with `file:line:`."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path is not None and line is not None else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


CONTEXT_TOO_LONG = re.compile(
    r"context[_ ]length|context window|prompt is too long|maximum context|too many tokens|"
    r"input is too long|exceeds? the (?:model'?s? )?(?:maximum )?context",
    re.IGNORECASE,
)
"""What a provider's "the context does not fit" error says (OpenAI, Anthropic, llama.cpp, vLLM)."""


def context_overflow(error: BaseException) -> int | bool:
    """Whether a provider error says the request does not fit the model's context window (OpenAI
    `context_length_exceeded`, Anthropic "prompt is too long", llama.cpp "exceeds the available context
    size"): False when it does not; the window it names when the message gives one (`maximum context length
    is 8192 tokens`, `> 200000 maximum`, `context size (4096 tokens)`); else True. Used by the kernel's
    overflow recovery (K1)."""
    if not isinstance(error, ProviderError) or error.retryable:
        return False
    text = str(error)
    if not (CONTEXT_TOO_LONG.search(text) or "context too long" in text or "context size" in text):
        return False
    for pattern in _WINDOW_RES:
        m = pattern.search(text)
        if m:
            return int(m.group(1).replace(",", ""))
    return True


_WINDOW_RES = (
    re.compile(r"maximum context length is ([\d,]+)", re.IGNORECASE),
    re.compile(r"> ?([\d,]+) maximum", re.IGNORECASE),
    re.compile(r"context (?:size|window|length)[^\d]{0,20}\(?([\d,]+) tokens", re.IGNORECASE),
)
