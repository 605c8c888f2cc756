"""Running the app with uvicorn, with a shutdown that ends event streams first.

uvicorn waits for open connections to finish before it runs the application's shutdown, and an event
stream never finishes by itself; `Server` therefore closes the event hub as soon as shutdown begins, so
every stream ends cleanly (its client reconnects elsewhere with `Last-Event-ID`) and shutdown does not
hang until its grace period."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
from fastapi import FastAPI

__all__ = ["Server", "serve"]


class Server(uvicorn.Server):
    """A uvicorn server for a stead app. `port=0` picks a free port: read it from `bound_port` once
    `started` is true. `signals=False` leaves the process's signal handlers alone (embedded, tests)."""

    def __init__(self, config: uvicorn.Config, *, signals: bool = True) -> None:
        super().__init__(config)
        self.signals = signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if not self.signals:
            yield
            return
        with super().capture_signals():
            yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        app = self.config.loaded_app if self.config.loaded else None
        service = getattr(getattr(_unwrap(app), "state", None), "stead", None)
        if service is not None:
            service.plugin.hub.close()
        await super().shutdown(sockets)

    @property
    def bound_port(self) -> int:
        for server in self.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("the server is not listening yet")


def _unwrap(app: Any) -> Any:
    """The FastAPI app under uvicorn's middleware wrappers."""
    seen = 0
    while app is not None and not isinstance(app, FastAPI) and seen < 10:
        app = getattr(app, "app", None)
        seen += 1
    return app


HEADER_TIMEOUT = 10.0
"""Seconds a connection may take to deliver a request's headers (from connecting, or from the end of its
previous response) before it is closed: a slow or partial request holds nothing for long (SEC6a)."""


def guarded_h11(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on the request head. uvicorn's own `timeout_keep_alive`
    only runs between requests and any byte cancels it, so a client that connects and sends its headers
    one byte at a time (slowloris) would hold the connection forever."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_deadline = self.loop.call_later(header_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _too_slow(self) -> None:
            self._head_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_deadline is not None and self.conn.their_state is not h11.IDLE:
                self._disarm()  # the head arrived: the request runs under the app's own limits

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def config(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    header_timeout: float = HEADER_TIMEOUT,
    **kwargs: Any,
) -> uvicorn.Config:
    """uvicorn's configuration for a stead app: h11 with a request-head deadline (`header_timeout`), 5 s
    idle keep-alive, request heads of at most 16 KiB (SEC6a)."""
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("timeout_graceful_shutdown", 5)
    kwargs.setdefault("timeout_keep_alive", 5)
    kwargs.setdefault("h11_max_incomplete_event_size", 16 * 1024)
    kwargs.setdefault("http", guarded_h11(header_timeout))
    return uvicorn.Config(app, host=host, port=port, lifespan="on", **kwargs)


async def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> None:
    """Serve `app` in the running event loop (the system's) until SIGINT or SIGTERM, then shut down cleanly
    (streams first) and return — the caller closes its system and exits normally."""
    server = Server(config(app, host, port, **kwargs), signals=False)
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, server.handle_exit, sig, None)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    try:
        await server.serve()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def start(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, **kwargs: Any
) -> tuple[Server, asyncio.Task[None]]:
    """Start serving in the background; returns once listening (tests, benchmarks, embedding)."""
    server = Server(config(app, host, port, **kwargs), signals=False)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the server stopped before it started")
        await asyncio.sleep(0.01)
    return server, task


async def stop(server: Server, task: asyncio.Task[None]) -> None:
    """Shut down a server from `start` (streams end first) and wait for it."""
    server.should_exit = True
    await task
