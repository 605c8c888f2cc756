"""Fake model servers speaking the real wire protocols over real HTTP on 127.0.0.1.

Each server is a small HTTP/1.1 server (asyncio, in the test's own event loop, on an ephemeral port) that
answers with a queue of scripted `Reply`s and records every request it received. A reply is written in
vendor-neutral terms (stead blocks, usage) plus faults; each server renders it in its vendor's exact shape:
SSE chunks, error bodies, status codes and headers.

    server = await OpenAIFakeServer().start()
    server.push(Reply([Text("hello")], chunk=2))
    ... OpenAIProvider(base_url=server.base_url, api_key="sk-test") ...
    server.requests[-1].body["messages"]
    await server.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stead.messages import Block, Text, Usage

__all__ = ["DEFAULT_USAGE", "RUNAWAY_WORD", "FakeServer", "Recorded", "Reply", "cap_of", "split"]

DEFAULT_USAGE = Usage(input_tokens=10, output_tokens=5)


@dataclass
class Reply:
    """One scripted answer (or failure) of a fake server.

    Answer: `blocks` are streamed in order; text, reasoning and tool-call arguments in fragments of `chunk`
    characters (0: one fragment). `usage` is reported the vendor's way (default `DEFAULT_USAGE`). `stop`
    overrides the done reason (stead terms: stop, tool_call, length, or a raw vendor value).
    `interleave` streams the argument fragments of parallel tool calls round-robin (OpenAI only).

    Faults:
    - `status`: answer with this HTTP status and the vendor's JSON error body (`error_type`,
      `error_message`, `error_code` override the vendor defaults) plus `headers` (e.g. retry-after).
    - `cut_after=N`: abort the TCP connection after N stream events (no terminal event, no end of body).
    - `truncate_after=N`: end the HTTP body cleanly after N events, without the terminal event.
    - `stream_error_after=N`: after N events send the vendor's in-stream error event (`error_type`).
    - `first_byte_delay`: seconds before the response head is written.
    - `hold_after=N`: after N stream events, pause (the server's `holding` event is set) until the test sets
      the server's `release` event, then go on.

    `runaway=True` streams until stopped, as a server without a default cap does: one word per event until
    the request's output cap (`cap_of`) is reached, then the vendor's `length` finish; without a cap, until
    `runaway_limit` words.
    """

    blocks: list[Block] = field(default_factory=list)
    usage: Usage | None = None
    chunk: int = 0
    stop: str | None = None
    interleave: bool = False
    status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    truncate_after: int | None = None
    stream_error_after: int | None = None
    first_byte_delay: float = 0.0
    hold_after: int | None = None
    runaway: bool = False
    runaway_limit: int = 20_000


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


def split(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters (0: one piece; empty text: no pieces)."""
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


RUNAWAY_WORD = "blah "
"""What a `runaway` reply streams, one word (about one token) per event."""


def cap_of(body: Any) -> int | None:
    """The output cap a request carries: `max_completion_tokens` (OpenAI) or `max_tokens` (OpenAI-compatible
    servers, Anthropic); None when it carries none."""
    if not isinstance(body, dict):
        return None
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return int(value) if value is not None else None


class FakeServer:
    """The HTTP part shared by the vendor fakes. Subclasses render replies."""

    path = "/"
    vendor = "fake"

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.port = 0
        self.holding = asyncio.Event()
        """Set while a `hold_after` reply is paused."""
        self.release = asyncio.Event()
        """Set it to let a paused `hold_after` reply go on."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._count = 0
        self.responder: Callable[[Any], Reply] | None = None
        """When set, the reply to each request is `responder(request body)` instead of the next queued one
        (a model whose answer is a function of the request, for processes the test cannot script)."""

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, port: int = 0) -> FakeServer:
        """Listen on 127.0.0.1 (an ephemeral port, or `port`: a server started again where it was)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def caps(self) -> list[int | None]:
        """The output cap of every model request received, in order (None: the request carried none)."""
        return [cap_of(r.body) for r in self.requests if r.path == self.path]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give the vendor's SDK as `base_url`."""
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    # -- rendering (vendor specific) -------------------------------------------------------------------------

    def render(self, reply: Reply, request: Any, n: int) -> list[bytes]:
        """The SSE frames of a successful stream, terminal event last."""
        raise NotImplementedError

    def error_body(self, reply: Reply) -> dict[str, Any]:
        raise NotImplementedError

    def stream_error_frame(self, reply: Reply) -> bytes:
        raise NotImplementedError

    def error_headers(self, reply: Reply) -> dict[str, str]:
        return {}

    # -- HTTP ------------------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close() stops handlers; finishing normally keeps asyncio's stream callback quiet
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is finished."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body: Any = json.loads(raw) if raw else None
        self.requests.append(Recorded(method, path.split("?", 1)[0], headers, body))
        self._count += 1

        if path.split("?", 1)[0] != self.path or method != "POST":
            reply = Reply(status=404, error_type="not_found_error", error_message=f"no route {method} {path}")
        elif self.responder is not None:
            reply = self.responder(body)
        elif self.replies:
            reply = self.replies.popleft()
        else:
            reply = Reply(status=500, error_message="fake server: no scripted reply left")

        if reply.runaway:
            words = cap_of(body) or reply.runaway_limit
            reply = dataclasses.replace(
                reply, blocks=[Text(RUNAWAY_WORD * words)], chunk=len(RUNAWAY_WORD), stop="length"
            )
        if reply.first_byte_delay:
            await asyncio.sleep(reply.first_byte_delay)
        if reply.status is not None:
            payload = json.dumps(self.error_body(reply)).encode()
            extra = {**self.error_headers(reply), **reply.headers}
            self._head(writer, reply.status, "application/json", extra, length=len(payload))
            writer.write(payload)
            await writer.drain()
            return True

        frames = self.render(reply, body, self._count)
        self._head(writer, 200, "text/event-stream; charset=utf-8", reply.headers, length=None)
        for index, frame in enumerate(frames):
            if reply.cut_after == index:
                await writer.drain()
                writer.transport.abort()
                return False
            if reply.truncate_after == index:
                break
            if reply.stream_error_after == index:
                self._chunk(writer, self.stream_error_frame(reply))
                break
            if reply.hold_after == index:
                self.holding.set()
                await self.release.wait()
                self.holding.clear()
            self._chunk(writer, frame)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    @staticmethod
    def _head(
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        extra: dict[str, str],
        *,
        length: int | None,
    ) -> None:
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
        reason |= {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
        lines = [f"HTTP/1.1 {status} {reason.get(status, 'Error')}", f"content-type: {content_type}"]
        if length is None:
            lines += ["transfer-encoding: chunked", "cache-control: no-cache"]
        else:
            lines.append(f"content-length: {length}")
        lines += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; `data` is JSON-encoded unless it is already text."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {text}\n\n".encode()
