"""Support for the flow tests (tests/flows/): tools that count their executions, gates that hold a tool
until the test releases it, and writing a directory of definitions.

Definitions import the tools as `tests.fakes.flows:NAME`. Counters and gates are module state: every test
that uses them calls `reset()` first (the `flow_state` fixture in tests/flows/conftest.py does).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import stead
import stead.testing

__all__ = [
    "EXECUTIONS",
    "GATES",
    "ORDER",
    "PLACEHOLDER_MODEL",
    "Gate",
    "prompt_model",
    "reset",
    "write",
    "write_flow",
]

EXECUTIONS: Counter[str] = Counter()
"""`tool:argument` → how many times the tool ran with it (what the outside world would have seen)."""
ORDER: list[str] = []
"""The order in which the tools finished."""


class Gate:
    """Holds the tools waiting on it until `release()`; `reached` is set when the first one arrives,
    `passed` when one went through (its tool then returns without waiting again)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.released = asyncio.Event()
        self.passed = asyncio.Event()
        self.waiting = 0

    async def wait(self) -> None:
        self.waiting += 1
        self.reached.set()
        await self.released.wait()
        self.passed.set()

    def release(self) -> None:
        self.released.set()


GATES: dict[str, Gate] = {}
"""Gate name → gate: `hold(name)` waits on it (a missing gate lets the tool through)."""


def reset() -> None:
    EXECUTIONS.clear()
    ORDER.clear()
    GATES.clear()


async def _pass(name: str) -> None:
    gate = GATES.get(name)
    if gate is not None:
        await gate.wait()


@stead.tool
async def lookup(order: int) -> dict[str, Any]:
    """Look an order up (at most once)."""
    EXECUTIONS[f"lookup:{order}"] += 1
    await _pass(f"lookup:{order}")
    ORDER.append(f"lookup:{order}")
    return {"order": order, "amount": 30 if order < 100 else 300, "status": "delivered"}


@stead.tool
async def refund(order: int, amount: float) -> str:
    """Refund an order (at most once)."""
    EXECUTIONS[f"refund:{order}"] += 1
    await _pass(f"refund:{order}")
    ORDER.append(f"refund:{order}")
    return f"refunded {amount:g} for order {order}"


@stead.tool(durable=True)
async def work(item: Any, ctx: stead.ToolContext) -> dict[str, Any]:
    """Durable work on one item (may run again after a crash, with the same call id)."""
    key = json.dumps(item, sort_keys=True)
    EXECUTIONS[f"work:{key}"] += 1
    await _pass(f"work:{key}")
    ORDER.append(f"work:{key}")
    return {"item": item, "done": True}


@stead.tool
async def charge(item: Any) -> dict[str, Any]:
    """A charge that must happen at most once."""
    key = json.dumps(item, sort_keys=True)
    EXECUTIONS[f"charge:{key}"] += 1
    await _pass(f"charge:{key}")
    ORDER.append(f"charge:{key}")
    return {"charged": item}


@stead.tool
async def fail(reason: str = "it broke") -> str:
    """Always fails."""
    EXECUTIONS[f"fail:{reason}"] += 1
    raise RuntimeError(reason)


@stead.tool
async def hold(name: str) -> str:
    """Waits at the gate `name` (at most once)."""
    EXECUTIONS[f"hold:{name}"] += 1
    await _pass(name)
    return f"passed {name}"


@stead.tool(durable=True)
async def count(value: int) -> int:
    """Returns value + 1 (durable)."""
    EXECUTIONS[f"count:{value}"] += 1
    return value + 1


@stead.tool(transactional=True)
async def poke(key: str, value: Any, ctx: stead.ToolContext) -> str:
    """Sets a top-level payload key by writing the run's payload directly (no payload rules apply)."""
    assert ctx.tx is not None
    raw = await ctx.tx.get(ctx.agent_id, "kv.r.payload")
    payload = json.loads(raw) if raw else {}
    payload[key] = value
    await ctx.tx.write(ctx.agent_id, "kv.r.payload", json.dumps(payload))
    return f"set {key}"


@stead.tool
async def echo(text: str) -> str:
    """Returns its text."""
    EXECUTIONS[f"echo:{text}"] += 1
    return text


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def write_flow(
    directory: Path, name: str, body: str, *, model: str | None = None, tools: list[str] | None = None
) -> Path:
    """A flow definition named `name` (`body`: the rest of its YAML); `tools`: names of this module's tools.
    The file's lines: 1 name, 2 type, then model and tools when given, then the body."""
    head = f"name: {name}\ntype: flow\n"
    if model is not None:
        head += f"model: {model}\n"
    if tools:
        head += f"tools: [{', '.join('tests.fakes.flows:' + t for t in tools)}]\n"
    return write(directory, f"{name}.yaml", head + textwrap.dedent(body).lstrip("\n"))


PLACEHOLDER_MODEL = "scripted: true\nrules:\n  - responses:\n      - text: placeholder\n"
"""A scripted model file for flows whose prompt model a test replaces (`providers={"scripted/NAME": ...}`)."""


def prompt_model(answer: Any) -> stead.ScriptedProvider:
    """A model for prompt steps: `answer(request)` gives the text (a str, or a dict sent as JSON); a dict
    `answer` maps a word of the step's instructions to its answer."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if callable(answer):
            value = answer(request)
        else:
            value = next((v for k, v in answer.items() if k in request.instructions), "no answer")
        return [stead.Text(value if isinstance(value, str) else json.dumps(value))]

    return stead.testing.ScriptedProvider(respond)
