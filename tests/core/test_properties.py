"""Property-based checks of the stored formats (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stead.core import records as R
from stead.messages import Reasoning, Text, ToolCall, ToolResult, decode_block, dumps, encode_block

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
blocks = st.one_of(
    st.builds(Text, st.text()),
    st.builds(Reasoning, st.text(), st.none() | st.text(min_size=1), st.booleans()),
    st.builds(
        ToolCall,
        st.text(min_size=1, max_size=20),
        st.dictionaries(st.text(max_size=8), json_values, max_size=4) | st.text(),
        st.none() | st.text(min_size=1, max_size=24),
    ),
    st.builds(ToolResult, st.text(min_size=1, max_size=24), st.text(), st.booleans()),
)


@given(blocks)
def test_a_stored_block_reads_back_equal(block: Any) -> None:
    assert decode_block(json.loads(dumps(encode_block(block)))) == block


@given(st.lists(st.tuples(st.integers(0, 10**13), st.integers(0, 999_999)), min_size=2, max_size=30))
def test_queue_keys_sort_like_their_slot_and_sequence(pairs: list[tuple[int, int]]) -> None:
    keys = [R.queue_key(R.SEND, slot, seq) for slot, seq in pairs]
    assert sorted(keys) == [R.queue_key(R.SEND, s, q) for s, q in sorted(pairs)]


@given(st.lists(st.sampled_from(["u", "b1", "b2", "t", "s"]), max_size=25))
def test_rebuilt_history_keeps_every_record_once_in_order(kinds: list[str]) -> None:
    """build_messages never drops, duplicates or reorders a record, whatever the interleaving."""
    records: list[dict[str, Any]] = []
    for n, kind in enumerate(kinds):
        if kind == "u":
            records.append({"k": "u", "id": f"m{n}", "r": "user", "c": [encode_block(Text(f"x{n}"))]})
        elif kind in ("b1", "b2"):
            records.append({"k": "b", "i": kind, "b": encode_block(Text(f"x{n}"))})
        elif kind == "t":
            records.append(R.result_record(ToolResult(f"c{n}", f"x{n}")))
        else:
            records.append({"k": "s", "x": f"x{n}"})
    texts = [
        b.text if isinstance(b, Text) else b.output
        for m in R.build_messages(records)
        for b in m.content
        if isinstance(b, Text | ToolResult)
    ]
    assert texts == [f"x{n}" for n in range(len(kinds))]
