"""Child process of test_compaction_crash: asks for a compaction and blocks inside the summary request
(printing SUMMARY) until the parent SIGKILLs it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import stead
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from tests.fakes.context import fetch


async def main(db: str) -> None:
    async def respond(request: stead.ProviderRequest) -> ScriptedResponse:
        if request.purpose == "compaction":
            sys.stdout.write("SUMMARY\n")
            sys.stdout.flush()
            await asyncio.Event().wait()  # killed here
        return ScriptedResponse(blocks=[stead.Text("unexpected turn")])

    system = await stead.open(f"sqlite:///{db}", providers={"m": ScriptedProvider(respond)}, tools=[fetch])
    agent = await system.get("crashcompact01")
    await agent.compact()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
