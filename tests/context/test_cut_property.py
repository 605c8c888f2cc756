"""K1: the cut never orphans a tool result — a property over histories with parallel calls, failed calls,
steering between results and responses, and reasoning blocks before calls."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stead.core.compaction import choose_cut, safe_cuts

Rec = dict[str, Any]


@st.composite
def histories(draw: st.DrawFn) -> list[Rec]:
    recs: list[Rec] = []
    n_inf = 0
    n_call = 0
    for turn in range(draw(st.integers(1, 5))):
        recs.append(
            {
                "k": "u",
                "id": f"m{turn}",
                "r": "user",
                "c": [{"t": "x", "x": "hello " * draw(st.integers(1, 40))}],
            }
        )
        for _ in range(draw(st.integers(0, 4))):
            n_inf += 1
            inf = f"i{n_inf}"
            if draw(st.booleans()):
                recs.append(
                    {"k": "b", "i": inf, "b": {"t": "z", "x": "thinking " * draw(st.integers(1, 20))}}
                )
            if draw(st.booleans()):
                recs.append({"k": "b", "i": inf, "b": {"t": "x", "x": "let me look"}})
            calls = []
            for _ in range(draw(st.integers(1, 4))):  # parallel calls of one response
                n_call += 1
                cid = f"c{n_call}"
                calls.append(cid)
                recs.append({"k": "b", "i": inf, "b": {"t": "c", "n": "fetch", "a": {"n": n_call}, "i": cid}})
            for cid in calls:
                r: Rec = {"k": "t", "b": {"t": "r", "i": cid, "o": "result " * draw(st.integers(0, 60))}}
                if draw(st.integers(0, 4)) == 0:
                    r["b"]["e"] = 1  # a failed call
                recs.append(r)
            if draw(st.integers(0, 3)) == 0:  # steering consumed before the continuation
                recs.append({"k": "u", "id": f"s{n_inf}", "r": "user", "c": [{"t": "x", "x": "also this"}]})
        n_inf += 1
        recs.append({"k": "b", "i": f"i{n_inf}", "b": {"t": "x", "x": "answer"}})
        if draw(st.booleans()):
            recs.append({"k": "e", "run": f"r{turn}", "o": "completed"})
    return recs


def _orphans(tail: list[Rec]) -> list[str]:
    calls = {r["b"]["i"] for r in tail if r["k"] == "b" and r["b"]["t"] == "c"}
    results = {r["b"]["i"] for r in tail if r["k"] == "t"}
    return sorted((results - calls) | (calls - results))


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 3000))
def test_K1_cut_never_orphans_a_tool_result(recs: list[Rec], keep: int) -> None:
    for cut in [*safe_cuts(recs), choose_cut(recs, keep)]:
        if cut >= len(recs):
            continue
        tail = recs[cut:]
        assert _orphans(tail) == []
        first = tail[0]
        assert first["k"] in ("u", "s", "b")
        if first["k"] == "b":
            # a response starts here: its reasoning is never split from the call it precedes
            assert cut == 0 or not (recs[cut - 1]["k"] == "b" and recs[cut - 1]["i"] == first["i"])
        evicted = recs[:cut]
        assert _orphans([r for r in evicted if r["k"] in ("b", "t")]) == []
