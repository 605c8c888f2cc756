"""One MCP server connection: a lifetime task that owns it, cached tool listings, calls with timeouts,
restarts with backoff.

The official SDK's `Client` is an async context manager whose cancel scopes must be entered and exited in
one task ("Attempted to exit cancel scope in a different task", python-sdk #79, #577, #922). So each
connection has exactly one *lifetime task* that enters the client, lists the tools, listens for
`list_changed`, and exits it — on `close()` from any task, or when the server dies. Calls are sent from the
callers' own tasks over the open session (which the SDK allows) and raced against the connection's end, so
a call in flight when the server dies ends at once instead of hanging.

The tool listing is cached until the server says its tools changed (`subscriptions/listen` on 2026-07-28
connections, `notifications/tools/list_changed` on earlier ones) or the connection is re-established. A
server that dies (EOF, crash, a broken HTTP stream) is restarted with exponential backoff; a call that was
in flight gets `ServerGone` — its tool decides, by the ledger's rules, whether it may be sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

from stead.mcp._config import McpServer

__all__ = ["Connection", "ServerGone"]

log = logging.getLogger("stead.mcp")


class ServerGone(Exception):
    """The server's connection ended while a call was in flight (or before it could be sent)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def resolve_command(command: str) -> str:
    """`command` on PATH, or next to this Python (a venv's console scripts work without activating it)."""
    if "/" in command:
        return command
    found = shutil.which(command) or shutil.which(command, path=str(Path(sys.executable).parent))
    return found or command


def _reason(e: BaseException) -> str:
    """What went wrong, for logs and error results: the SDK's transports raise from task groups, so the
    cause is inside (nested) exception groups ("unhandled errors in a TaskGroup" says nothing)."""
    leaves: list[str] = []

    def walk(x: BaseException) -> None:
        if isinstance(x, BaseExceptionGroup):
            for sub in x.exceptions:
                walk(sub)
        elif (text := f"{type(x).__name__}: {x}") not in leaves:
            leaves.append(text)

    walk(e)
    return "; ".join(leaves) or f"{type(e).__name__}: {e}"


def _relay(fd: int, name: str) -> None:
    """Copy a server's stderr to ours, a prefixed line at a time (a thread: the reads block)."""
    with contextlib.suppress(OSError, ValueError), os.fdopen(fd, "r", errors="replace") as lines:
        for line in lines:
            text = line.rstrip()
            if text:
                sys.stderr.write(f"mcp {name}: {text[:500]}\n")
                sys.stderr.flush()


class Connection:
    """One server. `await start()`, then `tools`, `call(...)`, `close()` (from any task)."""

    def __init__(
        self,
        spec: McpServer,
        *,
        server: Any = None,
        on_tools: Callable[[Connection], None] | None = None,
        backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._server = server  # an in-process `MCPServer` / `Server` (tests), instead of command/url
        self.on_tools = on_tools
        self.backoff = backoff
        self.tools: list[Any] = []
        """The server's tools (`mcp.types.Tool`), as last listed."""
        self.generation = 0
        """How many times the connection was established (1 after the first start)."""
        self._client: Any = None
        self._up = asyncio.Event()
        self._down = asyncio.Event()  # set when the current connection ends
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._tried = asyncio.Event()  # the first attempt to connect ended (either way)
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self._err: TextIO | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self, wait: float | None = None) -> bool:
        """Start the lifetime task; wait up to `wait` seconds (default: the spec's timeout) for the first
        attempt to connect and list. False when the server is not up (it keeps retrying in the background,
        with backoff)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._life(), name=f"stead-mcp-{self.name}")
        try:
            await asyncio.wait_for(self._tried.wait(), self.spec.timeout if wait is None else wait)
        except TimeoutError:
            return False
        return self.up

    async def close(self) -> None:
        """End the connection (from any task): the lifetime task exits the client in its own task."""
        self._stop.set()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait([task])
        err, self._err = self._err, None
        if err is not None:
            with contextlib.suppress(OSError):
                err.close()  # the relay ends when the server's copies are closed too

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def _transport(self) -> Any:
        from mcp import Client, StdioServerParameters

        spec = self.spec
        if self._server is not None:
            return Client(self._server, message_handler=self._notification)
        if spec.command is not None:
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=resolve_command(spec.command),
                args=list(spec.args),
                env=spec.expanded_env(),
                cwd=spec.cwd,
            )
            return Client(
                stdio_client(params, errlog=self._errlog()),
                read_timeout_seconds=spec.timeout,
                message_handler=self._notification,
            )
        raise AssertionError("url servers are opened by _http_client")

    def _errlog(self) -> TextIO:
        """Where the server process writes its stderr: a pipe whose lines this process writes to its own
        stderr prefixed `mcp NAME: ` (cut at 500 characters), so that a server's logs never pass for
        stead's own lines."""
        if self._err is None:
            read_end, write_end = os.pipe()
            self._err = os.fdopen(write_end, "w")
            relay = threading.Thread(
                target=_relay, args=(read_end, self.name), name=f"stead-mcp-{self.name}-stderr", daemon=True
            )
            relay.start()
        return self._err

    async def _open(self, stack: AsyncExitStack) -> Any:
        spec = self.spec
        if spec.url is not None and self._server is None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            from mcp import Client

            headers = spec.expanded_headers()  # `${TOKEN}` from the env (SEC7k2: only that form)
            # Not httpx's default 5 s read timeout: a call's response stream is silent until the tool
            # answers, and a read timeout there ends the whole connection (the call: "stopped during the
            # call"). The SDK's own defaults (30 s, 300 s for reading streams), and reads outlast a call.
            timeout = httpx2.Timeout(30.0, read=max(300.0, spec.timeout + 30.0))
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout))
            client = Client(
                streamable_http_client(spec.url, http_client=http),
                read_timeout_seconds=spec.timeout,
                message_handler=self._notification,
            )
        else:
            client = self._transport()
        return await stack.enter_async_context(client)

    async def _life(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._down = asyncio.Event()
            listener: asyncio.Task[None] | None = None
            try:
                async with AsyncExitStack() as stack:
                    async with asyncio.timeout(self.spec.timeout):  # in this task: no wait_for sub-task
                        client = await self._open(stack)
                    self._client = client
                    await self._list(client)
                    self.generation += 1
                    attempt = 0
                    self.last_error = None
                    self._up.set()
                    self._tried.set()
                    listener = asyncio.get_running_loop().create_task(self._listen(client))
                    await self._until_down_or_stop()
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                self.last_error = _reason(e)
                log.warning("MCP server %r: connection ended: %s", self.name, self.last_error)
            finally:
                if listener is not None:
                    listener.cancel()
                    with contextlib.suppress(BaseException):
                        await listener
                self._client = None
                self._up.clear()
                self._down.set()
                self._tried.set()
            if self._stop.is_set():
                break
            delay = min(self.backoff[1], self.backoff[0] * (2**attempt))
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def _until_down_or_stop(self) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        down = asyncio.ensure_future(self._down.wait())
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            while True:
                done, _ = await asyncio.wait({stop, down, changed}, return_when=asyncio.FIRST_COMPLETED)
                if stop in done or down in done:
                    return
                self._changed.clear()
                changed = asyncio.ensure_future(self._changed.wait())
                if self._client is not None:
                    await self._list(self._client)
        finally:
            for f in (stop, down, changed):
                f.cancel()

    async def _list(self, client: Any) -> None:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        self.tools = tools
        if self.on_tools is not None:
            self.on_tools(self)

    async def _listen(self, client: Any) -> None:
        """`subscriptions/listen` for tool changes (2026-07-28 connections; earlier ones notify through the
        message handler)."""
        from mcp.client.subscriptions import ListenNotSupportedError

        try:
            async with client.listen(tools_list_changed=True) as sub:
                async for _event in sub:
                    self._changed.set()
        except ListenNotSupportedError:
            return
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.debug("MCP server %r: listen ended: %s", self.name, e)

    async def _notification(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._changed.set()

    # ------------------------------------------------------------------ calls
    async def call(self, tool: str, arguments: dict[str, Any], timeout: float | None = None) -> Any:
        """Call `tool`; returns the `CallToolResult`. Raises `ServerGone` if the connection is down (not
        sent) or ends during the call (sent), `TimeoutError` after `timeout` seconds."""
        from mcp_types import CONNECTION_CLOSED

        from mcp import MCPError

        limit = self.spec.timeout if timeout is None else timeout
        try:
            await asyncio.wait_for(self._up.wait(), limit)
        except TimeoutError:
            raise ServerGone(
                f"the MCP server {self.name!r} is not running ({self.last_error or 'starting'})", sent=False
            ) from None
        client, down = self._client, self._down
        if client is None:
            raise ServerGone(f"the MCP server {self.name!r} is not running", sent=False)
        request = asyncio.ensure_future(client.call_tool(tool, arguments, read_timeout_seconds=limit))
        ended = asyncio.ensure_future(down.wait())
        try:
            done, _ = await asyncio.wait({request, ended}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if request not in done:
            request.cancel()
            with contextlib.suppress(BaseException):
                await request
            if ended in done:
                raise ServerGone(f"the MCP server {self.name!r} stopped during the call", sent=True)
            raise TimeoutError(f"the MCP server {self.name!r} did not answer within {limit:g} seconds")
        try:
            return request.result()
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                if self._down is down:  # this connection is over: the lifetime task restarts the server
                    self._up.clear()
                    down.set()
                raise ServerGone(f"the MCP server {self.name!r} stopped during the call", sent=True) from None
            raise
