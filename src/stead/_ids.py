"""Identifiers: the ids stead generates are cuid2 strings; ids a caller chooses follow one simple rule.

Generated ids (`new_id`) are in cuid2 form: 24 lowercase base-36 characters starting with a letter. They are
drawn from the operating system's random source (`os.urandom`): 23 base-36 digits and a leading letter carry
about 123 random bits, so ids of any number of processes and machines do not collide, and they reveal
nothing (no time, counter or host). That takes ~1.5 µs an id, where the `cuid2` package's generator (a
SHA3 hash of time, counter, fingerprint and random input, then base-36 encoding in Python) took 13-28 µs —
about 2.3 ids are made per model response of a tool loop, so it showed in the hot path's profile.

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

import os
import re

from cuid2 import is_cuid

__all__ = ["ID_RULE", "MAX_ID_LENGTH", "is_valid_id", "is_valid_user_id", "new_id"]

_DIGITS = b"0123456789abcdefghijklmnopqrstuvwxyz"
# byte -> character tables for `bytes.translate`: 256 is not a multiple of 36 (or 26), so the first 4 (22)
# characters are 1/7 (1/11) likelier than the others: ~5.16 of the 5.17 bits a uniform digit would carry
_BASE36 = bytes(_DIGITS[b % 36] for b in range(256))
_LETTER = bytes(_DIGITS[10 + b % 26] for b in range(256))
_urandom = os.urandom

MAX_ID_LENGTH = 128
_USER_ID = re.compile(rf"[A-Za-z0-9._:@-]{{1,{MAX_ID_LENGTH}}}")
ID_RULE = f"1-{MAX_ID_LENGTH} characters from A-Z a-z 0-9 . _ : @ -"
"""The caller-chosen id rule, as error messages state it."""


def new_id() -> str:
    """Return a fresh cuid2 id (24 lowercase base-36 characters, starting with a letter)."""
    raw = _urandom(24)
    return (raw[:1].translate(_LETTER) + raw[1:].translate(_BASE36)).decode("ascii")


def is_valid_id(value: object) -> bool:
    """Whether `value` is a string in cuid2 form (2 to 32 characters, `[a-z][0-9a-z]+`): the form of every
    id stead generates."""
    return isinstance(value, str) and 2 <= len(value) <= 32 and bool(is_cuid(value))


def is_valid_user_id(value: object) -> bool:
    """Whether `value` is an id a caller may choose: 1-128 characters from `[A-Za-z0-9._:@-]`."""
    return isinstance(value, str) and _USER_ID.fullmatch(value) is not None
