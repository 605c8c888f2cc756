"""Child process for tests/memory/test_crash.py: an agent that calls `remember` once; SIGKILLs itself at a
chosen point of that call.

    python tests/memory/kill_worker.py DBPATH MODE

MODE `in-tx`: killed right after the tool body ran, inside the transaction that would commit the note and
the result (nothing of it is durable). MODE `after-commit`: killed right after that transaction committed.
The parent reopens the file and finishes the run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import stead
from stead.extend import ToolResultInfo
from stead.memory import AgentMemory, HashEmbedder, MemoryConfig
from stead.testing import ScriptedProvider
from tests.memory.conftest import remember_then_answer

AGENT_ID = "memkill0001"
MESSAGE_ID = "memkillmsg1"
NOTE = "Prefers the window seat on trains."
respond = remember_then_answer({"type": "preference", "note": NOTE})


class KillAt(stead.Hooks):
    def __init__(self, mode: str | None) -> None:
        self.mode = mode

    async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
        if info.call.name != "remember" or self.mode is None:
            return
        assert ctx.tx is not None
        if self.mode == "in-tx":
            _die()
        else:
            ctx.tx.after_commit(_die)


def _die() -> None:
    sys.stdout.write("KILL\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def open_system(db: Path, mode: str | None = None) -> stead.system.Opening:
    return stead.open(
        f"sqlite:///{db}",
        providers={"scripted": ScriptedProvider(respond)},
        hooks=KillAt(mode),
        memory=MemoryConfig(embedder=HashEmbedder()),
    )


async def main(db: Path, mode: str) -> None:
    system = await open_system(db, mode)
    agent = await system.create(
        provider="scripted", model="m", agent_id=AGENT_ID, extra=AgentMemory(write=True).as_extra()
    )
    await agent.send("remember my seat", id=MESSAGE_ID, user="u1")
    await agent.wait_idle()
    sys.stdout.write("NOT KILLED\n")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
