"""Fixtures of the HTTP service tests: a system with the server plugin and a controllable scripted model,
its app behind an in-process client (REST), and the same app behind a real uvicorn on 127.0.0.1:0 (streams:
an ASGI transport buffers whole responses, so a stream test through it would hang)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402

import stead  # noqa: E402
import stead.server  # noqa: E402
from stead.client import Client  # noqa: E402
from stead.providers.scripted import ScriptedProvider, ScriptedResponse  # noqa: E402
from stead.server import ServerPlugin, Token, create_app  # noqa: E402
from stead.server._run import Server, start, stop  # noqa: E402

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


class Model:
    """A scripted model the test steers: `gate` (when set) holds every response until it opens; each
    response calls `add` `calls` times, one call per response, then answers `text` in deltas of `chunk`."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.calls = 0
        self.text = "Hello from the scripted model."
        self.chunk = 6
        self.half_block: str | None = None

    async def __call__(self, request: stead.ProviderRequest) -> ScriptedResponse:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        done = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            if m.role == "tool":
                done += len(m.content)
        if done < self.calls:
            return ScriptedResponse([stead.ToolCall("add", {"a": done, "b": 1})])
        return ScriptedResponse([stead.Text(self.text)], chunk=self.chunk)


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
        r = await self.http.post("/v1/agents", json={"provider": "s", "model": "m", **body}, headers=bearer(secret))
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
    **app_kwargs: Any,
) -> Env:
    model = Model()
    plugin = plugin or ServerPlugin(prune_interval=None)
    system = await stead.server.open(
        url,
        providers={"s": ScriptedProvider(model)},
        tools=[add],
        server=plugin,
        definitions=definitions,
    )
    app = create_app(system, tokens=tokens, **app_kwargs)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return Env(system, plugin, model, app, http, url)


async def close_env(env: Env) -> None:
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
