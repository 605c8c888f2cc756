"""MCP over streamable HTTP: a real SDK server (`tests/mcp/http_server.py`, uvicorn in a subprocess on a
free loopback port) whose tools an agent calls through stead, with the declaration's `headers` (and
`${NAME}` expansion) reaching it; and a call past its server's `timeout`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stead
from stead.mcp import McpPlugin, McpServer
from stead.mcp._connection import Connection
from tests.mcp.test_mcp import calls, tool_results

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

import mcp.client.streamable_http  # noqa: F401  (imported here, not inside the first connect's timeout)

HTTP_SERVER = Path(__file__).resolve().parent / "http_server.py"
TOKEN = "s3cret-token"
TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(tmp_path: Path, *args: str) -> Iterator[str]:
    """Start `http_server.py` on a free port; yield its URL once it accepts connections."""
    port = free_port()
    log = tmp_path / "http_server.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, str(HTTP_SERVER), str(port), *args], stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 20.0
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the MCP server did not listen on {port}: {log.read_text()}")
            try:  # the poll's interval; ends at once if the server exited
                code = proc.wait(timeout=0.02)
                raise AssertionError(f"the MCP server exited ({code}): {log.read_text()}")
            except subprocess.TimeoutExpired:
                pass
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def guarded_url(tmp_path: Path) -> Iterator[str]:
    """A server that refuses every request without `Authorization: Bearer TOKEN`."""
    yield from serve(tmp_path, f"Bearer {TOKEN}")


@pytest.fixture
def open_url(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path)


async def test_a_streamable_http_server_s_tools_run_with_its_headers(
    guarded_url: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEAD_TEST_MCP_TOKEN", TOKEN)
    spec = {
        "name": "web",
        "url": guarded_url,
        "headers": {"Authorization": "Bearer ${STEAD_TEST_MCP_TOKEN}"},  # expanded from the environment
        "timeout": 10,
    }
    provider = calls(("web__echo", {"text": "hello", "n": 3}), ("web__authorization", {}))
    async with stead.open(db_url, mcp=[spec], providers={"scripted": provider}) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        assert plugin.connections["web"].up, plugin.connections["web"].last_error
        assert plugin.tool_names("web") == ["web__echo", "web__authorization", "web__slow", "web__stall"]
        agent = await system.create(provider="scripted", model="m", tools=["web__echo", "web__authorization"])
        await agent.send("echo, then say who you are")
        await agent.wait_idle(timeout=TIMEOUT)
        history = await agent.history()
    echoed, auth = tool_results(history)
    assert not echoed.is_error and echoed.output == '{"n": 3, "text": "hello"}'
    # the tool's own request carried the declared header, with `${STEAD_TEST_MCP_TOKEN}` replaced
    assert not auth.is_error and auth.output == f"Bearer {TOKEN}"
    # the results are in the conversation the model saw: its final answer is the last one
    assert history[-1].role == "assistant" and history[-1].content == [stead.Text(f"Bearer {TOKEN}")]


async def test_a_streamable_http_server_refuses_a_declaration_without_its_headers(
    guarded_url: str, db_url: str
) -> None:
    """The other side of the header test: the guard is real (without the header nothing connects), and
    the connection's error names the cause."""
    spec = {"name": "web", "url": guarded_url, "timeout": 5}
    async with stead.open(db_url, mcp=[spec]) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        conn = plugin.connections["web"]
        assert not conn.up
        # the SDK's error (it drops the status code), not the task group that carried it
        assert conn.last_error == "MCPError: Server returned an error response"
        assert plugin.tool_names("web") == []


async def test_a_call_past_its_timeout_is_an_error_result_and_the_server_stays_usable(
    open_url: str, db_url: str
) -> None:
    spec = {"name": "web", "url": open_url, "timeout": 1.0}
    provider = calls(("web__stall", {}), ("web__echo", {"text": "after"}))
    async with stead.open(db_url, mcp=[spec], providers={"scripted": provider}) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        conn = plugin.connections["web"]
        assert conn.up and conn.generation == 1, conn.last_error
        agent = await system.create(provider="scripted", model="m", tools=["web__stall", "web__echo"])
        started = time.monotonic()
        await agent.send("stall, then echo")
        await agent.wait_idle(timeout=TIMEOUT)
        elapsed = time.monotonic() - started
        history = await agent.history()
        # the timeout ended the call, not the connection: the same connection served the next call
        assert conn.up and conn.generation == 1
    stalled, echoed = tool_results(history)
    assert stalled.is_error and "did not answer within 1 seconds" in stalled.output
    assert not echoed.is_error and echoed.output == '{"n": 1, "text": "after"}'
    assert history[-1].role == "assistant" and history[-1].content == [stead.Text(echoed.output)]
    assert agent.state == "idle"
    assert elapsed < 10  # the stalled call ended after its timeout, not by the test's own limit


async def test_an_http_call_longer_than_httpx_s_default_read_timeout_is_answered(open_url: str) -> None:
    """A call's response stream is silent until the tool answers: the HTTP client's read timeout must not
    end it (httpx's default, 5 s, ended the whole connection: "stopped during the call")."""
    conn = Connection(McpServer(name="web", url=open_url, timeout=20))
    try:
        assert await conn.start(), conn.last_error
        result = await conn.call("slow", {"seconds": 5.5})
        assert not result.is_error and result.content[0].text == "slept 5.5"
        assert conn.up and conn.generation == 1, conn.last_error
    finally:
        await conn.close()
