"""Memory settings: the system's (`MemoryConfig`, given to `stead.open(memory=...)`) and each agent's
(`AgentMemory`: a definition's `memory:` section, stored in the agent's configuration extras).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from stead.extend import ConfigurationError
from stead.memory._embedders import Embedder
from stead.memory._model import Note

__all__ = ["MEMORY_KEY", "AgentMemory", "MemoryConfig", "RetrievalSource", "Retrieved"]

MEMORY_KEY = "stead.memory"
"""`AgentConfig.extra` key of an agent's memory settings (`AgentMemory.as_extra()`)."""


@dataclass
class AgentMemory:
    """What memory does for one agent (a definition's `memory:` section).

    Before each run: up to `notes` notes and `examples` examples chosen by `strategy` (`relevant`, `recent`,
    `priority`) for the run's user, plus passages from the named pre-execution `sources`, injected as one
    quoted system message after the instructions. `write: true` offers the agent the guarded `remember`
    tool."""

    notes: int = 5
    examples: int = 3
    strategy: Literal["relevant", "recent", "priority"] = "relevant"
    write: bool = False
    sources: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.notes < 0 or self.examples < 0:
            raise ConfigurationError("memory: notes and examples must be 0 or more")
        if self.strategy not in ("relevant", "recent", "priority"):
            raise ConfigurationError(
                f"memory: strategy must be relevant, recent or priority, not {self.strategy!r}"
            )

    def as_extra(self) -> dict[str, Any]:
        """The `extra=` of `system.create` for an agent without a definition:
        `system.create(..., extra=AgentMemory(write=True).as_extra())`."""
        return {MEMORY_KEY: asdict(self)}

    @staticmethod
    def from_extra(extra: Mapping[str, Any]) -> AgentMemory | None:
        raw = extra.get(MEMORY_KEY)
        if not isinstance(raw, Mapping):
            return None
        known = {k: raw[k] for k in ("notes", "examples", "strategy", "write", "sources") if k in raw}
        try:
            return AgentMemory(**known)
        except (TypeError, ConfigurationError):
            return None


@dataclass(frozen=True)
class Retrieved:
    """One passage a pre-execution source found."""

    text: str
    title: str | None = None
    score: float | None = None
    source: str | None = None
    """Where it came from (a URL, a file, a record id)."""


@runtime_checkable
class RetrievalSource(Protocol):
    """A pre-execution RAG source (MemberJunction's search scopes): searched with the user's message before
    a run of an agent whose `memory.sources` names it. Failures are logged and skipped."""

    async def search(
        self, query: str, *, limit: int, agent: str, user: str | None, tenant: str | None
    ) -> Sequence[Retrieved]: ...


@dataclass
class MemoryConfig:
    """System-wide memory settings (`stead.open(url, memory=MemoryConfig(...))`).

    `embedder`: `"auto"` (the local MiniLM model when `stead[memory]` is installed; else lexical search
    with a one-line hint), an `Embedder`, or None (lexical only). `defaults`: the settings of agents that
    declare none (None: such agents get no memory). `scope_mode`: how secondary scope dimensions match
    (`cascading` or `strict`). Fusion: `lexical_weight`, `vector_weight`, and `min_similarity`, the cosine
    a vector hit must reach (defaults measured on the labeled set: docs/benchmarks.md).
    `reranker(query, notes) -> notes` reorders the fused candidates.
    `sources`: pre-execution RAG sources by name (`rag_limit` passages in all). Agent writes: at most
    `max_writes_per_run` new notes per run, `max_note_chars` each, `near_duplicate` cosine for the
    supersede/dedupe check, provisional notes expiring after `provisional_days`."""

    embedder: Embedder | Literal["auto"] | None = "auto"
    defaults: AgentMemory | None = None
    scope_mode: Literal["cascading", "strict"] = "cascading"
    lexical_weight: float = 0.2
    vector_weight: float = 1.0
    min_similarity: float = 0.2
    reranker: Callable[[str, list[Note]], Awaitable[list[Note]]] | None = None
    sources: Mapping[str, RetrievalSource] = field(default_factory=dict)
    rag_limit: int = 5
    max_writes_per_run: int = 5
    max_note_chars: int = 2000
    near_duplicate: float = 0.85
    provisional_days: float = 7.0
