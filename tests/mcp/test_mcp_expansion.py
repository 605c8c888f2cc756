"""SEC7k2: MCP `env` and `headers` values expand `${NAME}` from the environment and no other form: a real
HTTP MCP server echoes the header it received."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import stead
from stead.errors import ConfigurationError
from stead.mcp import McpPlugin, McpServer
from tests.mcp.test_mcp import calls, tool_results
from tests.mcp.test_mcp_http import TIMEOUT, serve

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

WRITTEN = "Bearer $TOKEN_A ${TOKEN_A} ${TOKEN_A:-fallback} $(id) ${NESTED} ~ $$"
SENT = "Bearer $TOKEN_A alpha ${TOKEN_A:-fallback} $(id) ${TOKEN_A} ~ $$"


@pytest.fixture
def open_url(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path)


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_A", "alpha")
    monkeypatch.setenv("NESTED", "${TOKEN_A}")  # a value is not expanded again
    monkeypatch.delenv("STEAD_TEST_UNSET", raising=False)


async def test_SEC7k2_mcp_headers_expand_only_braced_names_over_http(
    open_url: str, db_url: str, environ: None
) -> None:
    spec = {"name": "web", "url": open_url, "headers": {"Authorization": WRITTEN}, "timeout": 10}
    provider = calls(("web__authorization", {}))
    async with stead.open(db_url, mcp=[spec], providers={"scripted": provider}) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        assert plugin.connections["web"].up, plugin.connections["web"].last_error
        agent = await system.create(provider="scripted", model="m", tools=["web__authorization"])
        await agent.send("who am I?")
        await agent.wait_idle(timeout=TIMEOUT)
        (auth,) = tool_results(await agent.history())
    assert not auth.is_error and auth.output == SENT


async def test_SEC7k2_an_unset_name_in_mcp_headers_is_an_error_naming_it_and_nothing_is_sent(
    open_url: str, db_url: str, environ: None
) -> None:
    spec = {"name": "web", "url": open_url, "headers": {"Authorization": "Bearer ${STEAD_TEST_UNSET}"}}
    async with stead.open(db_url, mcp=[{**spec, "timeout": 5}]) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        conn = plugin.connections["web"]
        assert not conn.up
        assert "STEAD_TEST_UNSET" in (conn.last_error or ""), conn.last_error


def test_SEC7k2_mcp_env_of_a_command_server_expands_only_braced_names(environ: None) -> None:
    spec = McpServer(name="local", command="true", env={"A": WRITTEN, "B": "plain $HOME"})
    assert spec.expanded_env() == {"A": SENT, "B": "plain $HOME"}
    with pytest.raises(ConfigurationError, match=r"env C uses \$\{STEAD_TEST_UNSET\}"):
        McpServer(name="local", command="true", env={"C": "${STEAD_TEST_UNSET}"}).expanded_env()
