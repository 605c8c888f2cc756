"""Child process for tests/core/test_kill.py: runs one agent until the parent kills it with SIGKILL.

    python tests/core/kill_worker.py DBPATH MODE

MODE is `accept` (delivers batches of messages forever), `stream` (a slow streamed answer), `plain` (blocks
inside a default, at-most-once tool), `durable` (blocks inside a durable tool) or `run` (`agent.run` of a
message whose run blocks inside the durable tool). The child prints marker
lines (flushed) that the parent synchronizes on, and logs every tool execution to `DBPATH.effects` (append,
flush, fsync per execution) so that the parent can count side effects after the kill.

The parent reuses `respond`, the tools and the constants from this module to finish the work in-process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `stead` and `tests` importable the same way
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import stead
from stead.providers.scripted import ScriptedProvider, ScriptedResponse

AGENT_ID = "killagent0001"
BATCH = 5
LONG_TEXT = "This answer streams slowly, one small chunk at a time, so that it can be killed midway. " * 4

RUN_ID = "runmsg"
RUN_TEXT = "call durable_op"

BLOCK_IN_TOOLS = False  # the child blocks inside tools; the parent does not
EFFECTS: Path | None = None


def marker(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def log_effect(call_id: str, name: str) -> None:
    assert EFFECTS is not None
    with EFFECTS.open("a") as f:
        f.write(f"{os.getpid()} {name} {call_id}\n")
        f.flush()
        os.fsync(f.fileno())


def read_effects(path: Path) -> list[tuple[str, str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines() if line.strip()]  # type: ignore[misc]


async def _run(ctx: stead.ToolContext, name: str) -> str:
    log_effect(ctx.call_id, name)
    if BLOCK_IN_TOOLS:
        marker(f"TOOL {name} {ctx.call_id}")
        await asyncio.Event().wait()  # never fires: the parent kills the process here
    return f"{name} done"


@stead.tool
async def plain_op(ctx: stead.ToolContext) -> str:
    "An at-most-once effect."
    return await _run(ctx, "plain_op")


@stead.tool(durable=True)
async def durable_op(ctx: stead.ToolContext) -> str:
    "A repeatable effect."
    return await _run(ctx, "durable_op")


TOOLS = [plain_op, durable_op]


def respond(request: stead.ProviderRequest) -> ScriptedResponse | list[stead.Block]:
    """Deterministic: the answer depends only on the request."""
    last_user = next(m for m in reversed(request.messages) if m.role == "user")
    text = last_user.text
    tool_name = text.removeprefix("call ")
    if tool_name in ("plain_op", "durable_op"):
        if request.messages[-1].role == "tool":
            return [stead.Text(f"{tool_name} finished")]
        return [stead.ToolCall(tool_name, {})]
    if text == "stream":
        return ScriptedResponse(blocks=[stead.Text(LONG_TEXT)], chunk=4, delay_between=0.01)
    return [stead.Text(f"answer to {text}")]


async def open_system(db: Path, provider: ScriptedProvider) -> stead.AgentSystem:
    return await stead.open(f"sqlite:///{db}", providers={"scripted": provider}, tools=TOOLS)


async def child(db: Path, mode: str) -> None:
    global BLOCK_IN_TOOLS, EFFECTS
    BLOCK_IN_TOOLS = True
    EFFECTS = Path(str(db) + ".effects")

    async def hold(request: stead.ProviderRequest) -> ScriptedResponse | list[stead.Block]:
        if mode == "accept":
            await asyncio.Event().wait()  # queued messages stay queued while batches keep arriving
        return respond(request)

    system = await open_system(db, ScriptedProvider(hold))
    agent = await system.create(
        provider="scripted", model="m", tools=["plain_op", "durable_op"], agent_id=AGENT_ID
    )
    events = agent.events()
    marker("READY")
    if mode == "accept":
        k = 0
        while True:
            inputs = [stead.Input(f"batch {k} message {j}", id=f"batch{k}msg{j}") for j in range(BATCH)]
            marker(f"BATCH {k}")
            await agent.deliver(inputs)
            k += 1
    if mode == "stream":
        await agent.send("stream", id="streammsg")
        async for ev in events:
            if isinstance(ev, stead.TextDelta):
                marker("DELTA")
                break
    elif mode in ("plain", "durable"):
        await agent.send(f"call {mode}_op", id="toolmsg")
    elif mode == "run":
        await agent.run(RUN_TEXT, id=RUN_ID)  # never returns: the run blocks in the tool until the kill
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(child(Path(sys.argv[1]), sys.argv[2]))
