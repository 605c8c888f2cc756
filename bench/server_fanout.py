"""SSE fan-out: N concurrent subscribers on one agent; delivery latency p50/p99; memory per idle stream.

The service runs in its own process (`bench/server_proc.py`). The subscribers are raw asyncio connections
in this process (an HTTP client per stream would cost more than the stream): each sends one GET for the
agent's live stream and reads lines. Once all are subscribed (each got its `retry:` line), the server's
resident memory is read from /proc — against the same process before the streams opened — for the memory
per idle stream. Then M messages are posted one after another; every durable event carries `at` (when it
was written, just before its commit), so a subscriber's delivery latency is its receive time minus `at`
(same machine, same clock). Event ids are checked: every subscriber gets every event once, in order.

    python bench/server_fanout.py --subscribers 1000 --messages 20 [--floor]     (one JSON line)

`--floor` then runs the same subscribers against `bench/sse_floor.py` (encode each event once, write the
same bytes to every socket), replaying the events subscriber 0 received on stead's own schedule, and
reports stead's p50/p99 as multiples of the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from server_messages import HERE, pct, start_server  # type: ignore[import-not-found]

from stead.client import Client


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Subscriber:
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.latencies: list[float] = []
        self.seqs: list[int] = []
        self.events: list[dict[str, Any]] = []
        self.writer: asyncio.StreamWriter | None = None

    async def run(self, port: int, path: str, last_id: str) -> None:
        """Read until the `settled` that follows the consumption of message `last_id`."""
        seen_last = False
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer = writer
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"retry:"):
                self.ready.set()
            elif line.startswith(b"data: "):
                now = time.time()
                data = json.loads(line[6:])
                self.latencies.append(now - data["at"])
                self.seqs.append(data["seq"])
                self.events.append(data)
                if data["type"] == "message_consumed" and data["message"]["id"] == last_id:
                    seen_last = True
                if seen_last and data["type"] == "settled":
                    writer.close()
                    return


async def floor_run(subs_n: int, events: list[dict[str, Any]], last_id: str) -> dict[str, Any]:
    """The same subscribers on `bench/sse_floor.py`, replaying `events` on stead's schedule."""
    floor = [sys.executable, str(HERE / "sse_floor.py")]
    proc = subprocess.Popen(floor, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 - before the clock
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        subs = [Subscriber() for _ in range(subs_n)]
        tasks = [asyncio.create_task(s.run(port, "/events", last_id)) for s in subs]
        for s in subs:
            await s.ready.wait()
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            await http.post("/emit", json={"events": events})
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
            wall = time.perf_counter() - t0
            writes = (await http.get("/stats")).json()["write_times"]
    finally:
        proc.terminate()
        proc.wait(30)
    expected = [e["seq"] for e in events]
    latencies = [x for s in subs for x in s.latencies]
    return {
        "complete_and_in_order": sum(1 for s in subs if s.seqs == expected),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "deliveries_per_s": round(len(latencies) / wall, 1),
        "encode_and_write_p50_ms": round(pct(writes, 0.50) * 1000, 2),
        "encode_and_write_p99_ms": round(pct(writes, 0.99) * 1000, 2),
    }


async def run(subscribers: int, messages: int, sync: str, floor: bool = False) -> dict[str, Any]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        proc, info = start_server(Path(tmp) / "fanout.db", sync, 1)
        try:
            port = info["port"]
            agent = info["agents"][0]
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base, timeout=60) as http, Client(base) as client:
                # one message first, so the code paths are warm and the agent's events are known
                await client.send(agent, "warm", id="warm")
                async for ev in client.events(agent, after=0):
                    if ev.event == "settled":
                        break
                head = (await http.get(f"/v1/agents/{agent}")).json()["event_seq"]
                rss0 = rss_kib(proc.pid)
                subs = [Subscriber() for _ in range(subscribers)]
                tasks = [
                    asyncio.create_task(s.run(port, f"/v1/agents/{agent}/events", f"m{messages - 1}"))
                    for s in subs
                ]
                for s in subs:
                    await s.ready.wait()
                await asyncio.sleep(1.0)  # let the server settle its allocations before reading its memory
                rss1 = rss_kib(proc.pid)
                t0 = time.perf_counter()
                for n in range(messages):  # queued one after another; the agent answers them in order
                    await http.post(f"/v1/agents/{agent}/messages", json={"content": f"m{n}", "id": f"m{n}"})
                await asyncio.wait_for(asyncio.gather(*tasks), 300)
                wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(30)
    expected = list(range(head + 1, head + 1 + len(subs[0].seqs)))
    complete = sum(1 for s in subs if s.seqs == expected)  # every event once, in order, no gap
    latencies = [x for s in subs for x in s.latencies]
    floor_result = await floor_run(subscribers, subs[0].events, f"m{messages - 1}") if floor else None
    result: dict[str, Any] = {
        "bench": "server_sse_fanout",
        "subscribers": subscribers,
        "messages": messages,
        "events_per_subscriber": len(expected),
        "deliveries": len(latencies),
        "complete_and_in_order": complete,
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "deliveries_per_s": round(len(latencies) / wall, 1),
        "rss_before_kib": rss0,
        "rss_with_streams_kib": rss1,
        "kib_per_idle_stream": round((rss1 - rss0) / subscribers, 1),
        "sync": sync,
        "cpus": os.cpu_count(),
    }
    if floor_result is not None:
        result["floor"] = floor_result
        result["p99_x_floor"] = round(result["p99_ms"] / floor_result["p99_ms"], 2)
        result["p50_x_floor"] = round(result["p50_ms"] / floor_result["p50_ms"], 2)
        result["p99_x_encode_and_write"] = round(
            result["p99_ms"] / floor_result["encode_and_write_p99_ms"], 2
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--sync", default="normal", choices=["normal", "full"])
    parser.add_argument(
        "--floor", action="store_true", help="then the same subscribers on bench/sse_floor.py (same run)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.subscribers, args.messages, args.sync, args.floor))), flush=True)


if __name__ == "__main__":
    main()
