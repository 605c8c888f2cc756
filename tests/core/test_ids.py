"""stead's cuid2 ids: the form the cuid2 package validates, and no collisions."""

from __future__ import annotations

from cuid2 import is_cuid

from stead._ids import is_valid_id, new_id


def test_new_ids_are_cuid2_and_unique() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 24 and i[0].isalpha() and is_cuid(i) and is_valid_id(i) for i in ids)
    # every base-36 digit appears in every position after the first (the hash digits are not biased away)
    for position in range(1, 24):
        assert len({i[position] for i in ids}) == 36


def test_invalid_ids_are_refused() -> None:
    for bad in ["", "a", "A" * 24, "1abc", "abc-def", "x" * 33, 5, None]:
        assert not is_valid_id(bad)
