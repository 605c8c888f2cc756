"""The token estimate's memo (stead._tokens): the same answer as the estimate itself, and bounded in
entries and entry size whatever texts arrive (tool outputs are hostile input)."""

from __future__ import annotations

import math

from stead import _tokens


def test_the_remembered_estimate_equals_the_computed_one() -> None:
    texts = ["", "hello world", "The answer is 5.", '{"a": 1, "b": 2}', "x" * 4096, "word " * 900]
    for text in texts:
        expected = 0 if not text else math.ceil(_tokens._exact(text))
        assert _tokens.estimate_text(text) == expected
        assert _tokens.estimate_text(text) == expected  # the second answer comes from the memo


def test_the_memo_is_bounded_in_entries_and_in_entry_size() -> None:
    _tokens._short.cache_clear()
    for i in range(_tokens._CACHED * 3):
        _tokens.estimate_text(f"tool output number {i}")
    assert _tokens._short.cache_info().currsize == _tokens._CACHED
    _tokens._short.cache_clear()
    long = "y" * (_tokens._CACHED_SIZE + 1)
    _tokens.estimate_text(long)
    assert _tokens._short.cache_info().currsize == 0  # longer texts are computed, never kept
