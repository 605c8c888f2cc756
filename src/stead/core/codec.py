"""A small dataclass codec: the fields of a typed record stored as one compact JSON object, each under a
short key, encoded and decoded by one pair of functions instead of by hand in every class.

Declare a field with `stored(key, ...)`; `encode_fields(obj)` and `decode_fields(cls, raw)` (or the mixin
`Stored`: `encode()`, `decode(raw)`) do the rest:

- a field without a default is always written, and a stored object without its key does not decode
  (`ValueError`);
- a field with a default is written only when it holds something: not None (with `omit_empty`: not empty
  either), or always with `always=True`; absent, it decodes to its default;
- `encode`/`decode` convert the value on the way (blocks, usage, enums); without them it is stored as is.

So `type(r).decode(r.encode()) == r`, and `decode(raw).encode() == raw` for every object `encode` wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self, TypeVar

__all__ = ["Stored", "decode_fields", "encode_fields", "stored"]

T = TypeVar("T")

_META = "stead.stored"


@dataclass(frozen=True, slots=True)
class _Key:
    """How one field is stored."""

    key: str
    encode: Callable[[Any], Any] | None
    decode: Callable[[Any], Any] | None
    always: bool
    omit_empty: bool


def stored(
    key: str,
    *,
    default: Any = MISSING,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    always: bool = False,
    omit_empty: bool = False,
) -> Any:
    """A dataclass field stored under `key` (see the module docstring for when it is written)."""
    meta = {_META: _Key(key, encode, decode, always, omit_empty)}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


_Layout = tuple[tuple[str, _Key, bool], ...]  # (attribute, how it is stored, whether it is required)
_layouts: dict[type, _Layout] = {}


def _layout(cls: type) -> _Layout:
    layout = _layouts.get(cls)
    if layout is None:
        layout = tuple(
            (f.name, f.metadata[_META], f.default is MISSING) for f in fields(cls) if _META in f.metadata
        )
        _layouts[cls] = layout
    return layout


def encode_fields(obj: Any) -> dict[str, Any]:
    """The stored JSON object of `obj`, a dataclass whose fields are declared with `stored` (a fresh dict)."""
    out: dict[str, Any] = {}
    for name, k, required in _layout(type(obj)):
        value = getattr(obj, name)
        if not (required or k.always) and (not value if k.omit_empty else value is None):
            continue
        out[k.key] = value if k.encode is None else k.encode(value)
    return out


def decode_fields(cls: type[T], raw: Mapping[str, Any]) -> T:
    """The `cls` stored as `raw`; raises `ValueError` when a required key is missing."""
    kwargs: dict[str, Any] = {}
    for name, k, required in _layout(cls):
        if k.key in raw:
            value = raw[k.key]
            kwargs[name] = value if k.decode is None else k.decode(value)
        elif required:
            raise ValueError(f"a stored {cls.__name__} lacks its {k.key!r}")
    return cls(**kwargs)


class Stored:
    """Mixin of a frozen dataclass whose fields are declared with `stored`: `encode()` and `decode(raw)`."""

    __slots__ = ()

    def encode(self) -> dict[str, Any]:
        """The stored JSON object (a fresh dict)."""
        return encode_fields(self)

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> Self:
        """The object stored as `raw`; raises `ValueError` when a required key is missing."""
        return decode_fields(cls, raw)
