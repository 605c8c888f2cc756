"""Memory test helpers: a system with the memory plugin and the deterministic hash embedder, and a scripted
model that calls `remember` as told."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import stead
from stead.memory import AgentMemory, HashEmbedder, MemoryConfig
from stead.testing import ScriptedProvider
from tests.conftest import tool_results_since_last_user

Responder = Callable[[stead.ProviderRequest], list[stead.Block]]


def remember_then_answer(*writes: dict[str, Any], answer: str = "noted") -> Responder:
    """A responder that makes the given `remember` calls, one per response, then answers."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = tool_results_since_last_user(request)
        if done < len(writes):
            return [stead.ToolCall("remember", dict(writes[done]))]
        return [stead.Text(answer)]

    return respond


def open_memory(
    url: str,
    respond: Responder | None = None,
    *,
    embedder: Any = None,
    tools: list[Any] | None = None,
    **config: Any,
) -> stead.system.Opening:
    provider = ScriptedProvider(respond or (lambda r: [stead.Text("ok")]))
    return stead.open(
        url,
        providers={"scripted": provider},
        tools=tools or [],
        memory=MemoryConfig(embedder=embedder if embedder is not None else HashEmbedder(), **config),
    )


WORDS = ["cat", "dog", "train", "seat", "window", "coffee", "tea", "invoice", "euro", "plan", "hours"]
"""The vocabulary of the mixed-scope notes (`scoped`)."""


def scoped(pick: int, rng: random.Random) -> dict[str, object]:
    """Where a mixed-scope test note lives, by `pick`: 0 the caller's, 1 another user's, 2 another tenant's,
    3 another primary scope's, 4 a secondary scope (a random region)."""
    if pick == 1:
        return {"user": "other"}
    if pick == 2:
        return {"tenant": "t2"}
    if pick == 3:
        return {"primary": "account:7"}
    if pick == 4:
        return {"secondary": {"region": rng.choice(["eu", "us"])}}
    return {}


async def writer_agent(system: stead.AgentSystem, **settings: Any) -> stead.Agent:
    return await system.create(
        provider="scripted",
        model="m",
        instructions="You are a helpful assistant.",
        extra=AgentMemory(**{"write": True, **settings}).as_extra(),
    )


@pytest.fixture
async def mem(db_url: str) -> AsyncIterator[stead.AgentSystem]:
    async with open_memory(db_url) as system:
        yield system
