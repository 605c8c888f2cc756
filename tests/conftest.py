"""Shared fixtures: a fresh SQLite URL per test and a scripted tool-loop model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stead

# Fake model servers (`oai`, `ant`) and an environment without real keys or proxies for every test.
pytest_plugins = ["tests.fakes.fixtures"]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "stead.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return f"sqlite:///{db_path}?synchronous=normal"


def tool_results_since_last_user(request: stead.ProviderRequest) -> int:
    """How many tool results follow the last user message (a deterministic responder's position)."""
    n = 0
    for m in reversed(request.messages):
        if m.role == "user":
            break
        if m.role == "tool":
            n += len(m.content)
    return n


def tool_loop(tool: str = "add", k: int = 5) -> Callable[[stead.ProviderRequest], list[stead.Block]]:
    """A responder that calls `tool` k times (one call per response), then answers with text."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        n = tool_results_since_last_user(request)
        if n < k:
            return [stead.ToolCall(name=tool, arguments={"a": n, "b": 1})]
        return [stead.Text(f"done after {n} calls")]

    return respond


async def conversation_records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    """The agent's stored history records that make up the conversation: every record except the
    end-of-run records (`{"k": "e"}`, the kernel's run → outcome link, which no reader shows)."""
    async with system.store.transaction() as tx:
        raw = await tx.load(agent_id)
    return [rec for rec in map(json.loads, raw) if rec["k"] != "e"]
