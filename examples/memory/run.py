"""Two sessions with one agent: the first remembers a preference, the second (a new process, as far as
stead can tell) uses it.

    python examples/memory/run.py [DB]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import stead
from stead.testing import ScriptedProvider

HERE = Path(__file__).resolve().parent


def demo_model(request: stead.ProviderRequest) -> list[stead.Block]:
    """A scripted stand-in for an LLM: saves what the user asks it to remember; when booking, reads the
    memory block the system put after its instructions."""
    user = next(m.text for m in reversed(request.messages) if m.role == "user")
    answered = request.messages[-1].role == "tool"
    if "remember" in user.lower():
        if answered:
            return [stead.Text("Noted — I will remember that.")]
        note = user.split("remember that", 1)[-1].strip(" .").replace("I prefer", "Prefers", 1)
        return [stead.ToolCall("remember", {"type": "preference", "note": f"{note}."})]
    memory = request.messages[0].text if request.messages[0].role == "system" else ""
    if "window seat" in memory:
        return [stead.Text("Booked Lisbon → Porto at 9:00, window seat as you prefer.")]
    return [stead.Text("Booked Lisbon → Porto at 9:00.")]


async def session(db: str, message: str) -> str:
    async with stead.open(
        f"sqlite:///{db}", definitions=HERE, providers={"demo": ScriptedProvider(demo_model)}, memory=True
    ) as system:
        try:
            agent = await system.get("travel-1")
        except stead.AgentNotFound:
            agent = await system.create(definition="travel-assistant", agent_id="travel-1")
        result = await agent.run(message, user="sam")
        return result.text


async def main(db: str) -> None:
    print(await session(db, "Please remember that I prefer a window seat on trains."))
    print(await session(db, "Book me a train to Porto tomorrow morning."))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory-demo.db"))
