"""An SDK client bound to the event loop that uses it (shared by the OpenAI and Anthropic drivers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["LoopBoundClient"]


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


C = TypeVar("C", bound=_Closable)


class LoopBoundClient(Generic[C]):
    """The client a driver uses: the caller's own (`given`, never closed here), or one made by `factory`
    for the running loop — a connection pool belongs to the loop that opened it, so a new loop gets a new
    client."""

    def __init__(self, factory: Callable[[], C], given: C | None = None) -> None:
        self._factory = factory
        self._given = given
        self._client: C | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> C:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._factory()
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the client this object made (a given one is left open)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
