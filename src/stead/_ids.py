"""Identifiers: the ids stead generates are cuid2 strings; ids a caller chooses follow one simple rule.

Generated ids (`new_id`) are cuid2: 24 lowercase base-36 characters starting with a letter.

Caller-chosen ids (message ids given to `send(id=...)`, agent ids given to `create(agent_id=...)`) are any
string of 1 to 128 characters from `[A-Za-z0-9._:@-]`: order numbers (`order-123`), UUIDs, webhook delivery
ids (`evt_1Nv0...`), `user@example.com`, `tenant:42`. Every cuid2 id is such a string, so one rule checks
both. Everything else is refused with `stead.InvalidId` before anything is written: separators that mean
something elsewhere (`/`, `\\`, whitespace, `#`, `?`, `&`, `=`, `,`, `;`), quotes, `%`, `*`, control
characters, any non-ASCII character, the empty string and anything longer than 128 characters.

Why these ids are safe in keys and queries:
- Ids only ever reach SQL as bound parameters, never spliced into statement text, so quotes could not
  break a query anyway; they are refused so that ids survive shells, URLs and log lines unchanged.
- Stores select key ranges with `key >= prefix AND key < prefix || U+10FFFF`, never with `LIKE`, so `_`
  (allowed) is an ordinary character and `%` (refused) would have been too.
- A message id appears in exactly one key, `msg.<id>`, which is only ever read and written whole (no
  prefix scan touches `msg.`), so `a` and `a.b` are two unrelated ids even though one key is a prefix of
  the other. Agent ids are a column of their own, never part of a key.
- The one key family that is scanned by prefix with an id inside it, `kv.c.<call id>.` (call-bound KV), uses
  tool call ids, which stead always generates (cuid2, no `.`), so one call's prefix never covers another's.
"""

from __future__ import annotations

import random
import re

from cuid2 import Cuid, is_cuid

__all__ = ["ID_RULE", "MAX_ID_LENGTH", "is_valid_id", "is_valid_user_id", "new_id"]

# A seeded `random.Random` halves the cost of each id compared with SystemRandom; uniqueness still comes
# from cuid2's hash of time, a per-process counter, a host fingerprint and the random stream.
_generator = Cuid(random_generator=random.Random)

MAX_ID_LENGTH = 128
_USER_ID = re.compile(rf"[A-Za-z0-9._:@-]{{1,{MAX_ID_LENGTH}}}")
ID_RULE = f"1-{MAX_ID_LENGTH} characters from A-Z a-z 0-9 . _ : @ -"
"""The caller-chosen id rule, as error messages state it."""


def new_id() -> str:
    """Return a fresh cuid2 id (24 lowercase base-36 characters, starting with a letter)."""
    return _generator.generate()


def is_valid_id(value: object) -> bool:
    """Whether `value` is a string in cuid2 form (2 to 32 characters, `[a-z][0-9a-z]+`): the form of every
    id stead generates."""
    return isinstance(value, str) and 2 <= len(value) <= 32 and bool(is_cuid(value))


def is_valid_user_id(value: object) -> bool:
    """Whether `value` is an id a caller may choose: 1-128 characters from `[A-Za-z0-9._:@-]`."""
    return isinstance(value, str) and _USER_ID.fullmatch(value) is not None
