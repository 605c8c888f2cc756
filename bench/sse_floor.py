"""The floor of SSE fan-out: encode each event once and write the same bytes to every subscriber's socket.

A raw asyncio HTTP/1.1 server (no framework, no store, no queues, no task per stream): `GET` any path opens a
stream (the same status line, headers and chunked encoding as the service's `text/event-stream` answer,
then `retry:`); `POST /emit` with a JSON body `{"events": [...]}` — the payloads one stead subscriber
received, each with its `at` — replays them on stead's own schedule (event i is sent at the emit time plus
its `at` offset from the first event), each with a fresh `at`: one `json.dumps`, one frame and one encode
per event, and one `transport.write` per subscriber for all the events that are due. `GET /stats`: per event,
the seconds from its `at` until its bytes were handed to every socket (the encode-and-write floor).
`bench/server_fanout.py --floor` runs it after stead in the same run, with the same subscribers.

    python bench/sse_floor.py        (prints one JSON line {"port": N, "pid": P}; runs until SIGTERM)
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import time
from typing import Any

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Floor:
    def __init__(self) -> None:
        self.streams: list[asyncio.StreamWriter] = []
        self.write_times: list[float] = []
        """Per event: seconds from its `at` until its bytes were handed to the last subscriber's socket."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /stats"):
            body = json.dumps({"write_times": self.write_times}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()
            return
        if head.startswith(b"GET"):
            writer.write(HEAD + chunk(b"retry: 2000\n\n"))
            self.streams.append(writer)
            await reader.read()  # until the client closes
            self.streams.remove(writer)
            writer.close()
            return
        size = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = json.loads(await reader.readexactly(size))
        writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()
        await self.replay(body["events"])

    async def replay(self, events: list[dict[str, Any]]) -> None:
        """Events fall due on stead's schedule; all that are due go out in one write per subscriber (as
        the service writes what one commit published in one write)."""
        start, first = time.time(), events[0]["at"]
        i = 0
        while i < len(events):
            delay = start + (events[i]["at"] - first) - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.time()
            frames: list[bytes] = []
            stamps: list[float] = []
            while i < len(events) and start + (events[i]["at"] - first) <= now:
                data = {**events[i], "at": time.time()}
                stamps.append(data["at"])
                frames.append(
                    f"id: {data['seq']}\nevent: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()
                )
                i += 1
            out = chunk(b"".join(frames))
            for writer in self.streams:
                writer.write(out)
            done = time.time()
            self.write_times += [done - at for at in stamps]


async def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    floor = Floor()
    server = await asyncio.start_server(floor.handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
