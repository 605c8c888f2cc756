"""pytest fixtures shared by the provider tests: an environment without real keys (or with test keys only),
and running fake servers.

Registered for the whole suite by `pytest_plugins` in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.openai_server import OpenAIFakeServer

__all__ = ["ENV_TO_CLEAR", "ant", "fake_api_keys", "isolated_env", "oai"]

ENV_TO_CLEAR = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "STEAD_CATALOG",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real key, base URL, catalog or proxy from the developer's environment reaches a test."""
    for name in ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_api_keys(isolated_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Test keys for both vendors, for modules whose models are reached through the catalog (no real key
    is left after `isolated_env`): `pytestmark = pytest.mark.usefixtures("fake_api_keys")`."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


@pytest.fixture
async def oai() -> AsyncIterator[OpenAIFakeServer]:
    server = OpenAIFakeServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def ant() -> AsyncIterator[AnthropicFakeServer]:
    server = AnthropicFakeServer()
    await server.start()
    yield server
    await server.close()
