"""Child process for tests/policy/test_approval_kill.py: an agent whose call waits for approval, killed with
SIGKILL by the parent.

    python tests/policy/approval_worker.py DBPATH MODE

MODE `wait`: the agent's destructive call is held; the child prints `WAITING <approval id>` and waits to be
killed. MODE `approve`: the same, then the child approves the call itself; the call's body logs its
execution and blocks, and the child prints `RUNNING <call id>` for the kill. Every execution of the tool
body is logged to `DBPATH.effects` (append, flush, fsync) before anything else happens.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import stead
from stead.providers.scripted import ScriptedProvider

AGENT_ID = "approvalagent01"
BLOCK = False
EFFECTS: Path | None = None


def marker(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@stead.tool(effects="write", destructive=True)
async def remove(path: str, ctx: stead.ToolContext) -> str:
    "Remove a file."
    assert EFFECTS is not None
    with EFFECTS.open("a") as f:
        f.write(f"{os.getpid()} {ctx.call_id}\n")
        f.flush()
        os.fsync(f.fileno())
    if BLOCK:
        marker(f"RUNNING {ctx.call_id}")
        await asyncio.Event().wait()  # the parent kills the process here
    return f"removed {path}"


def respond(request: stead.ProviderRequest) -> list[stead.Block]:
    last = request.messages[-1]
    if last.role == "tool":
        outputs = [b.output for b in last.content if isinstance(b, stead.ToolResult)]
        return [stead.Text("finished: " + " ".join(outputs))]
    return [stead.ToolCall("remove", {"path": "old.txt"})]


def effects(db: Path) -> list[str]:
    path = Path(str(db) + ".effects")
    return path.read_text().splitlines() if path.exists() else []


def open_system(db: Path, **kwargs: object) -> stead.system.Opening:
    global EFFECTS
    EFFECTS = Path(str(db) + ".effects")
    return stead.open(
        f"sqlite:///{db}",
        providers={"scripted": ScriptedProvider(respond)},
        tools=[remove],
        approvals=True,
        **kwargs,  # type: ignore[arg-type]
    )


async def child(db: Path, mode: str) -> None:
    global BLOCK
    BLOCK = True
    system = await open_system(db)
    agent = await system.create(provider="scripted", model="m", tools=["remove"], agent_id=AGENT_ID)
    await agent.send("remove old.txt", id="removemsg")
    await agent.wait_idle()
    (approval,) = await system.approvals()
    marker(f"WAITING {approval.id}")
    if mode == "approve":
        await system.approve(approval.id, note="go ahead")
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(child(Path(sys.argv[1]), sys.argv[2]))
