"""The service process the server benchmarks talk to: `stead.server` over a fresh SQLite file, with an echo
model that answers every message at once (one short text block), on 127.0.0.1 and a free port.

Prints one JSON line `{"port": N, "pid": P}` once listening; runs until SIGTERM. Used by
`bench/server_messages.py` and `bench/server_fanout.py`; not a benchmark by itself.

    python bench/server_proc.py --db /tmp/x.db --sync normal [--agents 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import stead
import stead.server
from stead.server._run import start


class Echo:
    """Answers every request with one text block (no deltas worth measuring, no delay)."""

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        text = f"echo: {request.messages[-1].text[:40]}"
        yield stead.TextDelta(text)
        yield stead.BlockEnd(stead.Text(text))
        yield stead.UsageEvent(stead.Usage(10, 5))
        yield stead.Done("stop")


def baseline_app() -> Any:
    """The floor of the HTTP stack alone: FastAPI + uvicorn answering the same route with a constant."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/agents/{agent_id}/messages", status_code=202)
    async def post(agent_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"message_id": body.get("id"), "created": True}

    return app


class Held:
    """Never answers: each agent's first inference waits forever, so posts measure acceptance alone."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def stream(self, request: stead.ProviderRequest) -> AsyncIterator[Any]:
        await self.release.wait()
        yield stead.Done("stop")


async def main(db: str, sync: str, agents: int, baseline: bool = False, held: bool = False) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if baseline:
        server, task = await start(
            baseline_app(), "127.0.0.1", 0, log_level="error", backlog=4096, timeout_keep_alive=120
        )
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, server.handle_exit, signal.SIGTERM, None
        )
        print(json.dumps({"port": server.bound_port, "agents": [f"a{i}" for i in range(agents)]}), flush=True)
        await task
        return
    model = Held() if held else Echo()
    system = await stead.server.open(f"sqlite:///{db}?synchronous={sync}", providers={"echo": model})
    ids = [
        (await system.create(provider="echo", model="echo", agent_id=f"bench{i:04d}")).id
        for i in range(agents)
    ]
    # the fan-out benchmark opens thousands of streams with one (implicit) token: lift the caps (SEC6)
    app = stead.server.create_app(system, heartbeat=15.0, max_streams=100_000, max_streams_per_token=100_000)
    server, task = await start(app, "127.0.0.1", 0, log_level="error", backlog=4096, timeout_keep_alive=120)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.handle_exit, signal.SIGTERM, None)
    print(json.dumps({"port": server.bound_port, "agents": ids}), flush=True)
    await task
    if isinstance(model, Held):
        model.release.set()  # let the held inferences end, so closing does not wait on them
    await system.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--sync", default="normal", choices=["normal", "full"])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--baseline", action="store_true", help="FastAPI alone, no stead (the HTTP floor)")
    parser.add_argument("--held", action="store_true", help="the model never answers (acceptance alone)")
    args = parser.parse_args()
    asyncio.run(main(args.db, args.sync, args.agents, args.baseline, args.held))
    sys.exit(0)
