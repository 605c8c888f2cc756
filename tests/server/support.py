"""Fixtures of the HTTP service tests: a system with the server plugin and a controllable scripted model,
its app behind an in-process client (REST), and the same app behind a real uvicorn on 127.0.0.1:0 (streams:
an ASGI transport buffers whole responses, so a stream test through it would hang)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx

import stead
import stead.server
from stead.client import Client
from stead.server import ServerPlugin, Token, create_app
from stead.server._run import Server, start, stop
from tests.conftest import tool_results_since_last_user

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "examples" / "team"

A = "secret-tenant-a"
A_READ = "secret-tenant-a-read-only"
B = "secret-tenant-b"
TOKENS = [
    Token.from_secret(A, "acme", name="a-all"),
    Token.from_secret(A_READ, "acme", ["agents:read", "runs:read"], name="a-read"),
    Token.from_secret(B, "globex", name="b-all"),
]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@stead.tool
async def add(a: int, b: int) -> int:
    "Add two integers."
    return a + b


@stead.tool(effects="write", approval="always")
async def transfer(a: int, b: int) -> int:
    "Move a units to account b (a human approves every call)."
    TRANSFERS.append((a, b))
    return a + b


TRANSFERS: list[tuple[int, int]] = []
"""Every call `transfer` ran, in order (tests clear it)."""


class Model:
    """A scripted model (a `stead.Provider`) the test steers. Each response calls `tool` (`add`) once while
    fewer than `calls` results follow the user's message, then answers `text` in deltas of `chunk` characters.
    `gate` (when set) holds every response until it opens; `holds[n]` holds the n-th response (0-based);
    `mid` pauses the text answer after its first delta (`mid_reached` is set there)."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.holds: dict[int, asyncio.Event] = {}
        self.mid: asyncio.Event | None = None
        self.mid_reached = asyncio.Event()
        self.started = asyncio.Event()
        self._reached: dict[int, asyncio.Event] = {}
        self.count = 0
        self.calls = 0
        self.tool = "add"
        self.text = "Hello from the scripted model."
        self.chunk = 6

    def release(self) -> None:
        """Open every gate (so a failed test's teardown never waits on a held response)."""
        for event in (self.gate, self.mid, *self.holds.values()):
            if event is not None:
                event.set()

    def reached(self, n: int) -> asyncio.Event:
        """Set when the n-th response (0-based) is requested."""
        return self._reached.setdefault(n, asyncio.Event())

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        n = self.count
        self.count += 1
        self.started.set()
        self.reached(n).set()
        if self.gate is not None:
            await self.gate.wait()
        if n in self.holds:
            await self.holds[n].wait()
        done = tool_results_since_last_user(request)
        if done < self.calls:
            yield stead.BlockEnd(stead.ToolCall(self.tool, {"a": done, "b": 1}))
            yield stead.UsageEvent(stead.Usage(10, 5))
            yield stead.Done("tool_call")
            return
        text = self.text
        for i in range(0, len(text), self.chunk):
            yield stead.TextDelta(text[i : i + self.chunk])
            if i == 0 and self.mid is not None:
                self.mid_reached.set()
                await self.mid.wait()
        yield stead.BlockEnd(stead.Text(text))
        yield stead.UsageEvent(stead.Usage(10, len(text)))
        yield stead.Done("stop")


@dataclass
class Env:
    system: stead.AgentSystem
    plugin: ServerPlugin
    model: Model
    app: Any
    http: httpx.AsyncClient
    url: str
    servers: list[tuple[Server, asyncio.Task[None]]] = field(default_factory=list)

    async def agent(self, secret: str = A, **body: Any) -> dict[str, Any]:
        r = await self.http.post(
            "/v1/agents", json={"provider": "s", "model": "m", **body}, headers=bearer(secret)
        )
        assert r.status_code == 201, r.text
        result: dict[str, Any] = r.json()
        return result

    async def live(self) -> str:
        """Serve the app on a real loopback port; return its base URL."""
        server, task = await start(self.app, port=0)
        self.servers.append((server, task))
        return f"http://127.0.0.1:{server.bound_port}"

    def client(self, base: str, secret: str | None = A) -> Client:
        return Client(base, secret)

    async def idle(self, agent_id: str) -> None:
        await (await self.system.get(agent_id)).wait_idle(10)


async def open_env(
    url: str,
    *,
    tokens: list[Token] | None = TOKENS,
    definitions: Path | None = None,
    plugin: ServerPlugin | None = None,
    approvals: bool = True,
    open_kwargs: dict[str, Any] | None = None,
    **app_kwargs: Any,
) -> Env:
    """`open_kwargs`: more keywords for `stead.server.open` (e.g. `memory=True`, `plugins=[...]`)."""
    model = Model()
    plugin = plugin or ServerPlugin(prune_interval=None)
    system = await stead.server.open(
        url,
        providers={"s": model},
        tools=[add, transfer],
        server=plugin,
        definitions=definitions,
        approvals=approvals,
        **(open_kwargs or {}),
    )
    app = create_app(system, tokens=tokens, **app_kwargs)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    return Env(system, plugin, model, app, http, url)


async def close_env(env: Env) -> None:
    env.model.release()
    for server, task in env.servers:
        await stop(server, task)
    await env.http.aclose()
    await env.system.close()


@pytest.fixture
async def env(db_url: str) -> AsyncIterator[Env]:
    e = await open_env(db_url, heartbeat=0.5)
    try:
        yield e
    finally:
        await close_env(e)


@pytest.fixture
async def make_env(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Open an env with other options (closed at the end of the test)."""
    opened: list[Env] = []

    async def make(**kwargs: Any) -> Env:
        e = await open_env(db_url, **kwargs)
        opened.append(e)
        return e

    try:
        yield make
    finally:
        for e in opened:
            await close_env(e)


async def collect(events: AsyncIterator[Any], until: Callable[[Any], bool], limit: int = 500) -> list[Any]:
    """Read events until `until(event)` is true (that event included)."""
    out = []
    async for ev in events:
        out.append(ev)
        if until(ev) or len(out) >= limit:
            break
    return out


STEAD = [str(Path(sys.executable).parent / "stead")]


@dataclass
class Served:
    """A `stead serve` process: its base URL and what it wrote to stderr so far."""

    base: str
    proc: asyncio.subprocess.Process
    log: list[str]


@contextlib.asynccontextmanager
async def stead_serve(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Served]:
    """Run `stead serve ARGS --port 0` as a real process (its stderr drained, so it never blocks on a full
    pipe); yields once it listens; stops it with SIGTERM."""
    proc = await asyncio.create_subprocess_exec(
        *STEAD,
        "serve",
        *args,
        "--port",
        "0",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert proc.stderr is not None
    log: list[str] = []
    port = None
    try:
        async with asyncio.timeout(60):
            while port is None:
                line = (await proc.stderr.readline()).decode()
                if not line:
                    raise AssertionError("stead serve ended before listening:\n" + "".join(log))
                log.append(line)
                m = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
                port = int(m.group(1)) if m else None

        async def drain() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                log.append(raw.decode())

        drainer = asyncio.get_running_loop().create_task(drain())
        try:
            yield Served(f"http://127.0.0.1:{port}", proc, log)
        finally:
            proc.terminate()
            await proc.wait()
            await drainer
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class Capture:
    """A loopback listener that records every connection and every byte sent to it (and answers none):
    proof that nothing was sent its way."""

    def __init__(self) -> None:
        self.connections = 0
        self.received = b""
        self._server: asyncio.Server | None = None

    async def start(self) -> Capture:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError):
            self.received += await reader.read(65536)
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
