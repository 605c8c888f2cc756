"""`stead.client.Client`: a small async client of the stead HTTP service, with the service's verbs.

    async with stead.client.Client("http://127.0.0.1:8000", token) as c:
        agent = await c.create_agent(definition="orchestrator")
        accepted = await c.send(agent["id"], "Write a brief", id="m1")      # retry-safe with an id
        async for event in c.events(agent["id"], after=accepted["events_after"]):
            if event.event == "settled":
                break

Answers are the service's JSON (dicts). Errors raise `ServiceError` with the problem's `status`, `code`
and `detail`. `events()` follows a stream and, if the connection drops, reconnects with the last event id
it saw (`Last-Event-ID`), so no event is lost or repeated. Needs `httpx` (`pip install 'stead[server]'`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

__all__ = ["Client", "ServerEvent", "ServiceError"]


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): the optional parts of a request body or query."""
    return {k: v for k, v in fields.items() if v is not None}


class ServiceError(Exception):
    """An error answer of the service (an RFC 9457 problem)."""

    def __init__(self, status: int, code: str, detail: str, problem: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.problem = problem or {}


@dataclass(frozen=True)
class ServerEvent:
    """One Server-Sent Event: `id` (a seq, `SEQ.K` for a delta, or None), `event` (the type) and `data`
    (the decoded JSON payload)."""

    id: str | None
    event: str
    data: Any

    @property
    def seq(self) -> int | None:
        if self.id is None or "." in self.id:
            return None
        return int(self.id)


async def parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str, str]]:
    """(id, event, data) of each event of a `text/event-stream` (WHATWG rules; comments skipped; an
    event without `id:` has None)."""
    event_id: str | None = None
    event = "message"
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield event_id, event, "\n".join(data)
            event_id, event, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            event_id = value


class Client:
    """An async client of one stead service. `token`: a bearer token (None for an unauthenticated
    loopback service)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ plumbing
    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; an error status raises `ServiceError`."""
        response = await self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _error(response)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.request(method, path, **kwargs)
        return response.json() if response.content else None

    # ------------------------------------------------------------------ agents
    async def create_agent(
        self,
        *,
        definition: str | None = None,
        data: dict[str, Any] | None = None,
        id: str | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        """`POST /v1/agents`: from a definition, or from settings (`model`, `instructions`, `tools`, …)."""
        body = _given(**settings, definition=definition, data=data, id=id)
        result: dict[str, Any] = await self._json("POST", "/v1/agents", json=body)
        return result

    async def list_agents(self, *, after: str | None = None, limit: int = 50) -> dict[str, Any]:
        params = {"limit": limit, **_given(after=after)}
        result: dict[str, Any] = await self._json("GET", "/v1/agents", params=params)
        return result

    async def agents(self) -> list[dict[str, Any]]:
        """Every agent of the tenant (all pages)."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.list_agents(after=cursor, limit=100)
            out.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", f"/v1/agents/{agent_id}")
        return result

    async def delete_agent(self, agent_id: str, *, abort: bool = False) -> None:
        await self.request("DELETE", f"/v1/agents/{agent_id}", params={"abort": "true"} if abort else None)

    # ------------------------------------------------------------------ messages
    async def send(
        self,
        agent_id: str,
        content: str | list[dict[str, Any]],
        *,
        id: str | None = None,
        mode: str = "send",
        role: str = "user",
        metadata: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        if_busy: str = "queue",
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """`POST /v1/agents/{id}/messages`; returns `{message_id, created, mode, agent_state,
        events_after}`."""
        body = {
            "content": content,
            "mode": mode,
            "role": role,
            "if_busy": if_busy,
            **_given(id=id, metadata=metadata, settings=settings),
        }
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        result: dict[str, Any] = await self._json(
            "POST", f"/v1/agents/{agent_id}/messages", json=body, headers=headers
        )
        return result

    async def steer(
        self, agent_id: str, content: str | list[dict[str, Any]], **kwargs: Any
    ) -> dict[str, Any]:
        return await self.send(agent_id, content, mode="steer", **kwargs)

    async def deliver(
        self, agent_id: str, messages: Sequence[dict[str, Any]], *, if_busy: str = "queue"
    ) -> dict[str, Any]:
        """`POST /v1/agents/{id}/messages:batch`: all of them or none."""
        result: dict[str, Any] = await self._json(
            "POST",
            f"/v1/agents/{agent_id}/messages:batch",
            json={"messages": list(messages), "if_busy": if_busy},
        )
        return result

    async def history(self, agent_id: str, *, after: int | None = None, limit: int = 100) -> dict[str, Any]:
        params = {"limit": limit, **_given(after=after)}
        result: dict[str, Any] = await self._json("GET", f"/v1/agents/{agent_id}/messages", params=params)
        return result

    async def queue(self, agent_id: str) -> list[dict[str, Any]]:
        result: dict[str, Any] = await self._json("GET", f"/v1/agents/{agent_id}/queue")
        return list(result["items"])

    async def abort(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("POST", f"/v1/agents/{agent_id}/abort")
        return result

    # ------------------------------------------------------------------ runs
    async def runs(self, **filters: Any) -> dict[str, Any]:
        """`GET /v1/runs` (`agent_id`, `status`, `parent_run_id`, `roots`, `after`, `limit`)."""
        params = {k: v for k, v in filters.items() if v is not None}
        result: dict[str, Any] = await self._json("GET", "/v1/runs", params=params)
        return result

    async def run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", f"/v1/runs/{run_id}")
        return result

    async def run_steps(self, run_id: str) -> list[dict[str, Any]]:
        result: dict[str, Any] = await self._json("GET", f"/v1/runs/{run_id}/steps")
        return list(result["items"])

    async def run_tree(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", f"/v1/runs/{run_id}/tree")
        return result

    # ------------------------------------------------------------------ approvals
    async def list_approvals(
        self,
        *,
        status: str = "pending",
        agent_id: str | None = None,
        root_run_id: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """`GET /v1/approvals`: one page (`items`, `next_cursor`)."""
        params = {
            "status": status,
            "limit": limit,
            **_given(agent_id=agent_id, root_run_id=root_run_id, after=after),
        }
        result: dict[str, Any] = await self._json("GET", "/v1/approvals", params=params)
        return result

    async def approvals(
        self, status: str = "pending", agent_id: str | None = None, root_run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every approval of the tenant with that status (`pending`, `decided`, `all`), oldest first (all
        pages); `agent_id` or `root_run_id` narrow it."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.list_approvals(
                status=status, agent_id=agent_id, root_run_id=root_run_id, after=cursor, limit=100
            )
            out.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    async def approval(self, approval_id: str) -> dict[str, Any]:
        """`GET /v1/approvals/{id}`."""
        result: dict[str, Any] = await self._json("GET", f"/v1/approvals/{approval_id}")
        return result

    async def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        reason: str | None = None,
        edited_arguments: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`POST /v1/approvals/{id}/decision` with `approve` or `deny`; returns `{approval, decided}`
        (`decided: false`: the same decision had been made before). Another decision made first raises
        `ServiceError` 409 `approval_decided`."""
        body = {"decision": decision, **_given(reason=reason, edited_arguments=edited_arguments)}
        result: dict[str, Any] = await self._json("POST", f"/v1/approvals/{approval_id}/decision", json=body)
        return result

    # ------------------------------------------------------------------ events
    async def events(
        self,
        agent_id: str,
        *,
        after: int | None = None,
        last_event_id: str | None = None,
        deltas: bool = False,
        reconnect: bool = True,
        max_reconnects: int = 5,
    ) -> AsyncIterator[ServerEvent]:
        """Follow an agent's event stream (`after=0`: everything retained; neither cursor: live only).
        A dropped connection is resumed from the last id seen."""
        async for ev in self._follow(
            f"/v1/agents/{agent_id}/events", after, last_event_id, deltas, reconnect, max_reconnects
        ):
            yield ev

    async def run_events(
        self, run_id: str, *, after: int | None = None, deltas: bool = False
    ) -> AsyncIterator[ServerEvent]:
        """One run's events from its start (or `after`); the iteration ends with the `done` event."""
        async for ev in self._follow(f"/v1/runs/{run_id}/events", after, None, deltas, True, 5):
            yield ev
            if ev.event == "done":
                return

    async def _follow(
        self,
        path: str,
        after: int | None,
        last_event_id: str | None,
        deltas: bool,
        reconnect: bool,
        max_reconnects: int,
    ) -> AsyncIterator[ServerEvent]:
        last = last_event_id
        attempts = 0
        retry = 2.0
        while True:
            headers = {"Accept": "text/event-stream"}
            params: dict[str, Any] = {}
            if deltas:
                params["deltas"] = "true"
            if last is not None:
                headers["Last-Event-ID"] = last
            elif after is not None:
                params["after"] = after
            try:
                async with self._http.stream(
                    "GET", path, headers=headers, params=params, timeout=httpx.Timeout(None, connect=10.0)
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise _error(response)
                    attempts = 0
                    async for event_id, event, data in parse_sse(response.aiter_lines()):
                        if event_id is not None:
                            last = event_id
                        yield ServerEvent(event_id, event, json.loads(data) if data else None)
            except (httpx.TransportError, httpx.RemoteProtocolError):
                if not reconnect or attempts >= max_reconnects:
                    raise
                attempts += 1
                await asyncio.sleep(min(retry, 0.2 * attempts))
                continue
            if not reconnect:
                return
            # the service ended the stream (shutdown, overflow): resume where it stopped
            attempts += 1
            if attempts > max_reconnects:
                return
            await asyncio.sleep(min(retry, 0.2 * attempts))

    # ------------------------------------------------------------------ ops
    async def healthz(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", "/v1/healthz")
        return result

    async def readyz(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", "/v1/readyz")
        return result


def _error(response: httpx.Response) -> ServiceError:
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if isinstance(problem, dict):
        return ServiceError(
            response.status_code, str(problem.get("code", "error")), str(problem.get("detail", "")), problem
        )
    return ServiceError(response.status_code, "error", response.text[:200])
