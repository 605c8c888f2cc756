"""Child process of test_kill.py: opens a realtime session, hands a task to the team and is SIGKILLed while
the child run's tool works.

    python tests/realtime/kill_worker.py DBPATH TEAMDIR

Marker lines (flushed): `SESSION <id>`, `STARTED <delegation id>`, `WORKING <task>` (from the tool)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import stead
from stead.realtime import RealtimePlugin


async def main(db: str, team: str) -> None:
    from tests.realtime import support

    support.BLOCK_ALL = True  # the child's `work` tool prints WORKING and never returns
    system = await stead.open(f"sqlite:///{db}", definitions=team, plugins=[RealtimePlugin()])
    session = await system.realtime(definition="voice")
    print(f"SESSION {session.id}", flush=True)
    await session.send_text("do the task")
    async for ev in session.events():
        if ev.type == "delegation_started":
            print(f"STARTED {ev.delegation_id}", flush=True)
            break
    await asyncio.Event().wait()  # killed here


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
