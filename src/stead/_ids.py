"""Identifiers: every id stead generates or accepts is a cuid2 string."""

from __future__ import annotations

import random

from cuid2 import Cuid, is_cuid

__all__ = ["is_valid_id", "new_id"]

# A seeded `random.Random` halves the cost of each id compared with SystemRandom; uniqueness still comes
# from cuid2's hash of time, a per-process counter, a host fingerprint and the random stream.
_generator = Cuid(random_generator=random.Random)


def new_id() -> str:
    """Return a fresh cuid2 id (24 lowercase base-36 characters, starting with a letter)."""
    return _generator.generate()


def is_valid_id(value: object) -> bool:
    """Whether `value` is a string in cuid2 form (2 to 32 characters, `[a-z][0-9a-z]+`)."""
    return isinstance(value, str) and 2 <= len(value) <= 32 and bool(is_cuid(value))
