"""The small dataclass codec of typed records (`stead.core.codec`, issue 22 item 6): every field under its
short key, written when it holds something, decoded back to the same object; a stored object that lacks a
required key is refused, not half-decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from stead.core.codec import Stored, decode_fields, encode_fields, stored
from stead.core.gate import Gate
from stead.core.outcome import Outcome
from stead.core.records import CompactionRecord, EndRecord, InputRecord


@dataclass(frozen=True, slots=True)
class Sample(Stored):
    name: str = stored("n")
    count: int = stored("c", default=1, always=True, decode=int)
    note: str | None = stored("x", default=None)
    tags: list[str] | None = stored("t", default=None, omit_empty=True)
    level: float = stored("l", default=0.0, encode=lambda v: round(v * 100), decode=lambda v: v / 100)


def test_a_stored_object_round_trips_through_its_short_keys() -> None:
    full = Sample("a", 3, "hi", ["x"], 0.25)
    assert full.encode() == {"n": "a", "c": 3, "x": "hi", "t": ["x"], "l": 25}
    assert Sample.decode(full.encode()) == full
    assert decode_fields(Sample, encode_fields(full)) == full


def test_unset_fields_are_left_out_unless_always_written() -> None:
    assert Sample("a").encode() == {"n": "a", "c": 1, "l": 0}  # `always`, and 0.0 is not None
    assert Sample("a", tags=[]).encode() == {"n": "a", "c": 1, "l": 0}  # `omit_empty`
    assert Sample.decode({"n": "a"}) == Sample("a")


def test_a_missing_required_key_is_refused() -> None:
    with pytest.raises(ValueError, match="Sample lacks its 'n'"):
        Sample.decode({"c": 2})
    with pytest.raises(ValueError, match="lacks its 'run'"):
        EndRecord.decode({"k": "e", "o": "completed"})


@pytest.mark.parametrize(
    "raw",
    [
        {"k": "u", "id": "m1", "r": "user", "c": [{"t": "x", "x": "hi"}], "run": "r1", "us": "u1"},
        {"k": "e", "run": "r1", "o": "failed", "x": "boom"},
        {"k": "c", "id": "c1", "n": 3, "x": "summary", "tb": 900, "ta": 120},
    ],
)
def test_the_kernels_records_are_this_codec(raw: dict[str, Any]) -> None:
    cls = {"u": InputRecord, "e": EndRecord, "c": CompactionRecord}[raw["k"]]
    assert cls.decode(raw).encode() == raw
    assert EndRecord("r1", Outcome.COMPLETED).encode() == {"k": "e", "run": "r1", "o": "completed"}


def test_a_gate_keeps_its_stored_form() -> None:
    assert Gate.ask("why", "ap1").encode() == {"s": "ask", "x": "why", "r": "ap1"}
    assert Gate("go").encode() == {"s": "go"}
    assert Gate.decode({"s": "run", "n": "edited"}) == Gate("run", "", None, "edited")
    assert Gate.decode({"s": "nonsense"}) is None
