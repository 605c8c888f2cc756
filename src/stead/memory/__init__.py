"""Long-term memory for stead agents: notes and examples, scoped hybrid retrieval, injection before runs,
and guarded agent writes that happen exactly once (docs/memory.md).

    system = await stead.open("sqlite:///stead.db", memory=True)
    await system.memory.add("Prefers answers in French.", type="preference", user="u-42")
    notes = await system.memory.search("which language should I answer in?", user="u-42")

A definition enables it per agent (`memory: {notes: 5, examples: 3, strategy: relevant, write: true}`);
an agent without a definition with `extra=AgentMemory(write=True).as_extra()`.
"""

from stead.memory._api import Memory
from stead.memory._config import MEMORY_KEY, AgentMemory, MemoryConfig, RetrievalSource, Retrieved
from stead.memory._embedders import Embedder, HashEmbedder, OpenAIEmbedder, cosine
from stead.memory._minilm import MiniLMEmbedder, ModelUnavailable
from stead.memory._model import NOTE_TYPES, Event, Example, Note, Scope
from stead.memory._plugin import SCOPE_KEY, MemoryPlugin
from stead.memory._render import PRECEDENCE
from stead.memory._retrieval import RRF_K, rrf
from stead.memory._sql import fts_query, lexical_tokens

__all__ = [
    "MEMORY_KEY",
    "NOTE_TYPES",
    "PRECEDENCE",
    "RRF_K",
    "SCOPE_KEY",
    "AgentMemory",
    "Embedder",
    "Event",
    "Example",
    "HashEmbedder",
    "Memory",
    "MemoryConfig",
    "MemoryPlugin",
    "MiniLMEmbedder",
    "ModelUnavailable",
    "Note",
    "OpenAIEmbedder",
    "RetrievalSource",
    "Retrieved",
    "Scope",
    "cosine",
    "fts_query",
    "lexical_tokens",
    "rrf",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or (callable(_obj) and hasattr(_obj, "__module__")):
        try:
            _obj.__module__ = "stead.memory"
        except (AttributeError, TypeError):
            pass
del _name, _obj
