"""Child process for tests/orchestration/test_delegation_kill.py: runs a team (a lead that delegates two tasks
to `worker` sub-agents in one response) until the parent test kills it with SIGKILL at a chosen point.

    python tests/orchestration/delegation_kill_worker.py DBPATH TEAMDIR MODE

MODE (the kill point): `child_inference` (a worker's model request is in flight), `child_tool` (a worker's
tool is running) or `parent_commit` (a worker settled and the lead is committing that delegation's result).
The process prints marker lines (flushed) the parent synchronizes on. The parent reuses the responders and
tools of this module (with BLOCK off) to finish the work in-process.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `stead` and `tests` importable the same way
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import stead
from stead.extend import ToolResultInfo
from stead.providers.scripted import ScriptedProvider
from tests.orchestration import support

BLOCK = False  # the child process blocks at the kill point; the parent test does not
MODE = ""
TASKS = ["task A", "task B"]


def marker(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _stop_here(line: str) -> None:
    marker(line)
    await asyncio.Event().wait()  # never fires: the parent kills the process here


@stead.tool(durable=True)
async def slow(ctx: stead.ToolContext, task: str) -> str:
    """Works on a task for a while."""
    if BLOCK and MODE == "child_tool":
        await _stop_here(f"CHILD_TOOL {ctx.agent_id}")
    return f"slow work on {task}"


def lead(request: stead.ProviderRequest) -> list[stead.Block]:
    results = support.results_since_user(request)
    if not results:
        return [stead.ToolCall("worker", {"request": t}) for t in TASKS]
    return [stead.Text("FINAL: " + " | ".join(("ERR " if r.is_error else "") + r.output for r in results))]


async def worker(request: stead.ProviderRequest) -> list[stead.Block]:
    task = support.last_user(request)
    results = support.results_since_user(request)
    if BLOCK and MODE == "child_inference":
        await _stop_here(f"CHILD_INFERENCE {request.agent_id}")
    if not results:
        return [stead.ToolCall("slow", {"task": task})]
    return [stead.Text(f"done: {task} ({results[-1].output})")]


def providers() -> dict[str, stead.Provider]:
    return {"scripted/lead": ScriptedProvider(lead), "scripted/worker": ScriptedProvider(worker)}


def write_team(directory: Path) -> None:
    me = "tests.orchestration.delegation_kill_worker"
    support.write_team(directory, {"lead": {"sub_agents": ["worker"]}, "worker": {"tools": [f"{me}:slow"]}})


class StopBeforeParentCommit(stead.Hooks):
    """Blocks inside the transaction that commits the lead's first delegation result (it never commits)."""

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        if BLOCK and MODE == "parent_commit" and info.call.name == "worker":
            await _stop_here(f"PARENT_COMMIT {ctx.agent_id}")


async def main(db: str, team: str) -> None:
    system = await stead.open(
        f"sqlite:///{db}", definitions=team, providers=providers(), hooks=[StopBeforeParentCommit()]
    )
    agent = await system.create(definition="lead")
    marker(f"LEAD {agent.id}")
    await agent.send("go")
    await agent.wait_idle()
    marker("FINISHED")  # the kill point was never reached
    await system.close()


if __name__ == "__main__":
    from tests.orchestration import (
        delegation_kill_worker as W,  # the module the definitions import the tools from
    )

    W.BLOCK = True
    W.MODE = sys.argv[3]
    asyncio.run(W.main(sys.argv[1], sys.argv[2]))
