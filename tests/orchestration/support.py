"""Shared pieces of the orchestration tests: a team of definitions on placeholder scripted models, Python
responders in their place, and what a responder reads of its request."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stead
from stead.providers.scripted import ScriptedProvider

Responder = Callable[[stead.ProviderRequest], Any]


def write_team(directory: Path, members: dict[str, dict[str, Any]]) -> Path:
    """One YAML definition per member (`sub_agents`, `tools`, `limits`, `description`), all on a placeholder
    scripted model; tests replace the models with Python responders (`providers={"scripted/NAME": ...}`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.yaml").write_text(
        "scripted: true\nrules:\n  - responses:\n      - text: placeholder\n"
    )
    for name, spec in members.items():
        doc: dict[str, Any] = {"name": name, "model": "scripted:model.yaml"}
        doc.update(spec)
        (directory / f"{name}.yaml").write_text(json.dumps(doc))  # JSON is YAML
    return directory


def models(**responders: Responder) -> dict[str, stead.Provider]:
    return {f"scripted/{name}": ScriptedProvider(r) for name, r in responders.items()}


def last_user(request: stead.ProviderRequest) -> str:
    return next(m.text for m in reversed(request.messages) if m.role == "user")


def results_since_user(request: stead.ProviderRequest) -> list[stead.ToolResult]:
    out: list[stead.ToolResult] = []
    for m in reversed(request.messages):
        if m.role == "user":
            break
        if m.role == "tool":
            out = [b for b in m.content if isinstance(b, stead.ToolResult)] + out
    return out


async def run(agent: stead.Agent, text: str, **kw: Any) -> stead.Message:
    await agent.send(text, **kw)
    await agent.wait_idle(timeout=20)
    return (await agent.history())[-1]
