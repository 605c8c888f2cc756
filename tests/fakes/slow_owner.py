"""A real store owner for inspection tests: `python -m tests.fakes.slow_owner URL`.

It creates agent `slow-agent` (name `slowpoke`) whose scripted model calls the tool `slow`, which blocks
until a line arrives on stdin; then the model answers `all done`. It prints, one line each, flushed:
`agent slow-agent` once the message is accepted, `tool-started` when the tool runs, `idle` when the turn
has settled, and exits (closing the store) on the next stdin line. The test drives it line by line, so no
sleep stands in for synchronization.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import stead
from stead.providers.scripted import ScriptedProvider

AGENT_ID = "slow-agent"
MESSAGE_ID = "order-1"
QUESTION = "please be slow"
ANSWER = "all done"


def _respond(request: stead.ProviderRequest) -> list[stead.Block]:
    if not any(m.role == "tool" for m in request.messages):
        return [stead.ToolCall(name="slow", arguments={"x": 7})]
    return [stead.Text(ANSWER)]


async def main(url: str) -> None:
    @stead.tool
    async def slow(x: int) -> str:
        "Wait until the test says go on."
        print("tool-started", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        return f"slow result {x}"

    providers: dict[str, stead.Provider] = {"scripted": ScriptedProvider(_respond)}
    async with stead.open(url, providers=providers, tools=[slow]) as system:
        agent = await system.create(
            provider="scripted", model="m", name="slowpoke", tools=["slow"], agent_id=AGENT_ID
        )
        await agent.send(QUESTION, id=MESSAGE_ID)
        print(f"agent {agent.id}", flush=True)
        await agent.wait_idle()
        print("idle", flush=True)
        await asyncio.to_thread(sys.stdin.readline)


ROOT = Path(__file__).resolve().parents[2]


class SlowOwner:
    """The owner process, driven from a test: `with SlowOwner(url) as owner: owner.wait_for(...)`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SlowOwner:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.slow_owner", self.url],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def wait_for(self, line: str) -> None:
        """Read the owner's output until `line` (the owner reached that point)."""
        assert self.proc is not None and self.proc.stdout is not None
        for got in self.proc.stdout:
            if got.strip() == line:
                return
        raise AssertionError(f"the owner exited before printing {line!r} (exit {self.proc.wait()})")

    def go_on(self) -> None:
        """One line on the owner's stdin: the slow tool returns (or, once idle, the owner exits)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
