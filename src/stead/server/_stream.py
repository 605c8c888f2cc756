"""Resumable Server-Sent Event streams of an agent's events (or of one run's).

A stream starts from a cursor: `Last-Event-ID` (sent by `EventSource` on its own reconnects) or
`?after=SEQ`; none means live only. It reads the agent's last `seq` and subscribes to the hub with no await
in between (on SQLite the commit callbacks that feed the hub run before another transaction can start), so
every event is either replayed from the store (`after < seq <= head`) or delivered live (`seq > head`):
none is lost and none repeated. A cursor from before the retained range, or past the last event, gets
`event: reset` (reload with REST) and then live events.

Token deltas (opt-in, `?deltas=true`) are never stored. Their ids are `SEQ.K` — the K-th delta after event
SEQ — so a client that reconnects mid-block is recognized and gets `block_reset` first; the block it saw in
part then arrives whole in its `block_end`. Every stream sends `retry:` first and a `: ping` comment after
`heartbeat` seconds of silence, and ends when the service shuts down, the agent is deleted, or the
subscriber falls more than its queue bound behind (the client resumes by id).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from stead.server._errors import ApiError
from stead.server._hub import CLOSE, OVERFLOW, Live, StoredEvent
from stead.server._service import Service
from stead.server._wire import dumps

__all__ = ["event_stream", "parse_cursor"]

PAGE = 500


def parse_cursor(last_event_id: str | None, after: int | None) -> tuple[int | None, bool]:
    """(after, mid_block) from `Last-Event-ID` (preferred: it is the browser's own reconnect) or `?after=`."""
    if last_event_id is not None and last_event_id.strip():
        head, _, frac = last_event_id.strip().partition(".")
        if not head.isdigit() or (frac and not frac.isdigit()):
            raise ApiError(422, "invalid_cursor", f"Last-Event-ID {last_event_id!r} is not an event id")
        return int(head), bool(frac)
    return after, False


def _frame(seq: int | str | None, event: str, data: str) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n"


async def event_stream(
    service: Service,
    agent_id: str,
    *,
    after: int | None,
    mid_block: bool = False,
    deltas: bool = False,
    run_id: str | None = None,
    run_settled: bool = False,
    heartbeat: float = 15.0,
    retry_ms: int = 2000,
) -> AsyncIterator[str]:
    """The frames of one stream. With `run_id`, only that run's events, ending with `event: done` after
    its `settled` (at once if the run had settled and its events are gone)."""
    hub = service.plugin.hub
    head, pruned = await service.head(agent_id)
    sub = hub.subscribe(agent_id, deltas=deltas)  # no await since the head was read: nothing slips between
    try:
        yield f"retry: {retry_ms}\n\n"
        if after is not None and (after < pruned or after > head):
            yield _frame(
                head,
                "reset",
                dumps(
                    {
                        "type": "reset",
                        "agent_id": agent_id,
                        "after": after,
                        "head": head,
                        "oldest": pruned + 1,
                    }
                ),
            )
            if run_id is not None and run_settled:
                yield _frame(None, "done", dumps({"type": "done", "run_id": run_id}))
                return
        elif after is not None:
            if mid_block:
                yield _frame(None, "block_reset", dumps({"type": "block_reset", "agent_id": agent_id}))
            cursor = after
            while cursor < head:
                rows = await service.replay(agent_id, cursor, head, PAGE)
                if not rows:
                    break
                for seq, run, kind, data in rows:
                    if run_id is None or run == run_id:
                        yield _frame(seq, kind, data)
                        if run_id is not None and kind == "settled":
                            yield _frame(None, "done", dumps({"type": "done", "run_id": run_id}))
                            return
                cursor = rows[-1][0]
            if run_id is not None and run_settled:
                # the run ended before these events were recorded (or they are gone): nothing more comes
                yield _frame(None, "done", dumps({"type": "done", "run_id": run_id}))
                return
        last, k = head, 0
        queue = sub.queue
        while True:
            try:
                async with asyncio.timeout(heartbeat):
                    items = [await queue.get()]
            except TimeoutError:
                yield ": ping\n\n"
                continue
            while not queue.empty():  # what one commit published goes out in one write
                items.append(queue.get_nowait())
            out: list[str] = []
            end = False
            for item in items:
                if item is CLOSE:
                    end = True
                    break
                if item is OVERFLOW:
                    out.append(": this stream fell too far behind; reconnect with Last-Event-ID\n\n")
                    end = True
                    break
                if isinstance(item, StoredEvent):
                    if item.seq <= last:
                        continue
                    last, k = item.seq, 0
                    if run_id is not None and item.run_id != run_id:
                        continue
                    out.append(item.frame())
                    if run_id is not None and item.type == "settled":
                        out.append(_frame(None, "done", dumps({"type": "done", "run_id": run_id})))
                        end = True
                        break
                elif isinstance(item, Live):
                    if item.delta:
                        k += 1
                        out.append(_frame(f"{last}.{k}", item.type, item.data))
                    else:
                        out.append(_frame(None, item.type, item.data))
            if out:
                yield "".join(out)
            if end:
                return
    finally:
        hub.unsubscribe(sub)
