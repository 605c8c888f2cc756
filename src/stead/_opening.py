"""`Opening`: what `stead.open(...)` returns — awaitable and an async context manager at once, as aiosqlite's
`connect` is.

Generic over what it opens (anything with an async `close`), so it imports nothing of the system and
`stead.system` can re-export it without an import cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

__all__ = ["Opening", "opening"]


class _Closes(Protocol):
    async def close(self) -> None: ...


T = TypeVar("T", bound=_Closes)
P = ParamSpec("P")


class Opening(Generic[T]):
    """What `stead.open(...)` returns: awaitable (`system = await stead.open(...)`) and an async context
    manager (`async with stead.open(...) as system:`, which closes the system on exit), as aiosqlite's
    `connect` is. `async with await stead.open(...)` works too: the system is its own context manager."""

    __slots__ = ("_coro", "_opened")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._opened: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._coro
        return self._opened

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._opened is not None:
            await self._opened.close()


def opening(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Opening[T]]:
    """Make an `async def` opener return an `Opening` of its result."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Opening[T]:
        return Opening(fn(*args, **kwargs))

    return wrapper
