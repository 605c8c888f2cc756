"""What the memory plugin's parts share: its settings, the system's store, the SQL of its dialect and the
retriever with its embedder (resolved when the system starts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stead.extend import AgentSystem, ReadOnly, Store
from stead.memory._config import AgentMemory, MemoryConfig
from stead.memory._embedders import Embedder, auto_embedder
from stead.memory._retrieval import Retriever, Weights
from stead.memory._sql import MemorySql

__all__ = ["MemoryCore"]


class MemoryCore:
    """One system's memory state (created by `MemoryPlugin`, bound when the system starts)."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self._system: AgentSystem | None = None
        self._retriever: Retriever | None = None
        self._rows: MemorySql | None = None

    def bind(self, system: AgentSystem) -> None:
        """Resolve the embedder (`"auto"`: the local model when its packages are installed, else lexical
        search with a one-line hint) and the dialect's SQL."""
        self._system = system
        cfg = self.config
        embedder: Embedder | None
        hint: str | None = None
        if cfg.embedder == "auto":
            embedder, hint = auto_embedder()
        else:
            embedder = cfg.embedder
        if embedder is not None:
            try:
                import numpy  # noqa: F401
            except ImportError:
                embedder, hint = None, "stead memory: vector search needs numpy: pip install 'stead[memory]'"
        self._rows = MemorySql(system.store.dialect)
        self._retriever = Retriever(
            system.store,
            embedder,
            weights=Weights(cfg.lexical_weight, cfg.vector_weight, cfg.min_similarity),
            reranker=cfg.reranker,
            hint=hint,
            writable=not system.readonly,
        )

    def _started(self) -> None:
        if self._system is None:
            raise RuntimeError("the memory plugin has not started (open the system with stead.open)")

    @property
    def system(self) -> AgentSystem:
        self._started()
        assert self._system is not None
        return self._system

    @property
    def store(self) -> Store:
        return self.system.store

    @property
    def retriever(self) -> Retriever:
        self._started()
        assert self._retriever is not None
        return self._retriever

    @property
    def rows(self) -> MemorySql:
        self._started()
        assert self._rows is not None
        return self._rows

    def check_writable(self) -> None:
        if self.system.readonly:
            raise ReadOnly(
                f"{self.system.store.url} was opened with readonly=True: memory can be read, not changed"
            )

    def settings_for(self, extra: Mapping[str, Any]) -> AgentMemory | None:
        """An agent's memory settings: its own (definition `memory:` / `AgentMemory.as_extra()`), else the
        system's defaults."""
        return AgentMemory.from_extra(extra) or self.config.defaults
