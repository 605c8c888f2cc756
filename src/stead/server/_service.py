"""What the routes do, without HTTP: tenant-scoped lookups, idempotent creation and acceptance, pages.

Every lookup by id is filtered by the caller's tenant and answers "not found" for another tenant's id
(never "forbidden": an id in another tenant is indistinguishable from no id at all). Every write returns
after its durable commit; idempotency decisions (fingerprints) are written in the transaction of the change
they guard.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from stead.extend import (
    Acceptance,
    Agent,
    AgentNotFound,
    AgentScope,
    AgentSystem,
    Approval,
    ApprovalSource,
    ConfigurationError,
    Decision,
    Input,
    InvalidInput,
    NotFound,
    Run,
    RunNotFound,
    RunReader,
    Tx,
    check_storable,
    encode_block,
    new_id,
    run_json,
)
from stead.server._auth import Auth, Principal
from stead.server._errors import ApiError
from stead.server._guard import (
    check_metadata,
    check_model,
    check_permission_mode,
    needs_permission,
)
from stead.server._models import BatchItem, CreateAgent, MessageIn
from stead.server._plugin import ServerPlugin
from stead.server._redact import public_text
from stead.server._wire import blocks_from_json, dumps

__all__ = ["Service", "ServiceConfig", "approvals_offered"]

log = logging.getLogger("stead.server")

_NONE = ""  # a tenant value no tenant can have (names are 1–128 characters)


def approvals_offered(system: AgentSystem) -> bool:
    """Whether the system keeps approvals: a plugin that is an `ApprovalSource` (the policy plugin,
    `stead.open(approvals=True)` or definitions)."""
    return any(isinstance(p, ApprovalSource) for p in system.plugins)


_DECIDED_AS = {"approve": "approved", "deny": "rejected"}


def fingerprint(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def encode_cursor(*parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, n: int) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ApiError(422, "invalid_cursor", "the cursor is not one this service issued") from None
    if not isinstance(parts, list) or len(parts) != n:
        raise ApiError(422, "invalid_cursor", "the cursor is not one this service issued")
    return parts


@dataclass(frozen=True)
class AcceptOutcome:
    acceptances: list[Acceptance]
    events_after: int
    created_any: bool


@dataclass(frozen=True)
class ServiceConfig:
    """Stream timing: a `: ping` after `heartbeat` seconds of silence; `retry:` tells clients how long to
    wait before reconnecting. `max_body_bytes`: larger requests are 413. `allow_models`: the operator's
    patterns of model strings with a base URL or a scripted file callers may use (docs/security.md).
    `max_streams` open event streams per process, `max_streams_per_token` per token: one more is 429."""

    heartbeat: float = 15.0
    retry_ms: int = 2000
    max_body_bytes: int = 2_000_000
    allow_models: tuple[str, ...] = ()
    max_streams: int = 1000
    max_streams_per_token: int = 100


class StreamSlots:
    """Open event streams, per token and in all (SEC6): `take` reserves one or raises 429."""

    def __init__(self, total: int, per_token: int, retry_after: int) -> None:
        self.total, self.per_token, self.retry_after = total, per_token, retry_after
        self.open = 0
        self.by_token: dict[str, int] = {}
        self._released = asyncio.Event()

    async def wait_open(self, at_most: int) -> None:
        """Return once at most `at_most` streams are open (they end as their clients go)."""
        while self.open > at_most:
            self._released.clear()
            await self._released.wait()

    def take(self, principal: Principal) -> Callable[[], None]:
        """Reserve a stream for `principal`; the returned function gives it back (once)."""
        key = principal.token_id
        mine = self.by_token.get(key, 0)
        if self.open >= self.total or mine >= self.per_token:
            which = "this service" if self.open >= self.total else "this token"
            raise ApiError(
                429,
                "rate_limited",
                f"too many open event streams for {which}; close one or retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        self.open += 1
        self.by_token[key] = mine + 1
        given = False

        def give_back() -> None:
            nonlocal given
            if given:
                return
            given = True
            self.open -= 1
            self._released.set()
            left = self.by_token.get(key, 1) - 1
            if left > 0:
                self.by_token[key] = left
            else:
                self.by_token.pop(key, None)

        return give_back


class Service:
    """The system behind the routes, seen through a principal's tenant."""

    def __init__(
        self, system: AgentSystem, plugin: ServerPlugin, auth: Auth, config: ServiceConfig | None = None
    ) -> None:
        self.system = system
        self.plugin = plugin
        self.auth = auth
        self.config = config or ServiceConfig()
        cfg = self.config
        self.streams = StreamSlots(
            cfg.max_streams, cfg.max_streams_per_token, max(1, -(-cfg.retry_ms // 1000))
        )

    def allowed_models(self, principal: Principal) -> list[str]:
        """The model patterns the operator allows this principal's tenant (docs/security.md)."""
        return [*self.config.allow_models, *self.auth.policy(principal.tenant).allowed_models]

    @property
    def store(self) -> Any:
        return self.system.store

    def _default(self) -> str:
        return self.auth.default_tenant if self.auth.default_tenant is not None else _NONE

    def tenant(self, stored: str | None) -> str | None:
        return stored if stored is not None else self.auth.default_tenant

    def tenant_scope(self, principal: Principal) -> AgentScope:
        """The agents of the principal's tenant (an agent the service did not create belongs to the default
        tenant), as the scope of another plugin's listing: approvals and runs are read through their
        plugins' pages (`AgentScope`), never from their tables."""
        return AgentScope(
            "SELECT a.id FROM agents a LEFT JOIN stead_server_agents s ON s.agent_id = a.id "
            "WHERE COALESCE(s.tenant, ?) = ?",
            (self._default(), principal.tenant),
        )

    def _approval_source(self) -> ApprovalSource:
        found = next((p for p in self.system.plugins if isinstance(p, ApprovalSource)), None)
        if found is None:
            raise ApiError(404, "not_found", "approvals are off on this service")
        return found

    def _run_reader(self) -> RunReader:
        found = next((p for p in self.system.plugins if isinstance(p, RunReader)), None)
        if found is None:
            raise ApiError(404, "not_found", "run records are off on this service")
        return found

    # ------------------------------------------------------------------ agents
    async def tenant_of(self, agent_id: str) -> str | None:
        """The agent's tenant; None when it does not exist (or belongs to nobody)."""
        async with self.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT a.id, s.tenant FROM agents a LEFT JOIN stead_server_agents s ON s.agent_id = a.id "
                "WHERE a.id = ?",
                (agent_id,),
            )
        if not rows:
            return None
        return self.tenant(rows[0][1])

    async def agent(self, principal: Principal, agent_id: str) -> Agent:
        """The agent if it is in the principal's tenant; 404 otherwise."""
        if await self.tenant_of(agent_id) != principal.tenant:
            raise ApiError(404, "not_found", f"no agent with id {agent_id!r}")
        try:
            return await self.system.get(agent_id)
        except AgentNotFound:
            raise ApiError(404, "not_found", f"no agent with id {agent_id!r}") from None

    async def head(self, agent_id: str) -> tuple[int, int]:
        """The agent's last event `seq` and the highest pruned one."""
        async with self.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT head_seq, pruned_through FROM stead_server_agents WHERE agent_id = ?", (agent_id,)
            )
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    async def list_agents(
        self, principal: Principal, after: str | None, limit: int
    ) -> tuple[list[tuple[str, str | None, float, bool]], str | None]:
        params: list[Any] = [self._default(), principal.tenant]
        where = ""
        if after is not None:
            created, aid = decode_cursor(after, 2)
            if not isinstance(created, int | float) or not isinstance(aid, str):
                raise ApiError(422, "invalid_cursor", "the cursor is not one this service issued")
            where = " AND (a.created_at > ? OR (a.created_at = ? AND a.id > ?))"
            params += [created, created, aid]
        async with self.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT a.id, a.name, a.created_at FROM agents a "
                "LEFT JOIN stead_server_agents s ON s.agent_id = a.id "
                f"WHERE COALESCE(s.tenant, ?) = ?{where} ORDER BY a.created_at, a.id LIMIT ?",
                (*params, limit + 1),
            )
            owing = {row.id for row, _ in await tx.agents_owing_work()}
        items = [(str(r[0]), r[1], float(r[2]), str(r[0]) in owing) for r in rows[:limit]]
        nxt = encode_cursor(items[-1][2], items[-1][0]) if len(rows) > limit and items else None
        return items, nxt

    async def create_agent(self, principal: Principal, body: CreateAgent) -> tuple[Agent, bool]:
        """Create (201) or, for a repeated id with the same body, return the existing agent (200)."""
        settings_given = any(
            v is not None for v in (body.provider, body.model, body.instructions, body.tools)
        )
        if body.definition is not None and settings_given:
            raise ApiError(
                422,
                "invalid_request",
                "give either a definition (with data) or model settings (provider, model, instructions, "
                "tools), not both",
            )
        if body.definition is None and body.data is not None:
            raise ApiError(422, "invalid_request", "data needs a definition")
        check_model(body.model, body.provider, allowed=self.allowed_models(principal), loc=("model",))
        ceiling = self.auth.policy(principal.tenant).max_permission_mode
        check_permission_mode(
            body.permission_mode, principal, ceilings={"the tenant": ceiling}, field="permission_mode"
        )
        fp = fingerprint(body.model_dump(exclude={"id"}, exclude_none=True))
        agent_id = body.id if body.id is not None else new_id()
        kwargs: dict[str, Any] = {}
        for key in ("steering_mode", "send_mode", "permission_mode"):
            value = getattr(body, key)
            if value is not None:
                kwargs[key] = value
        if "permission_mode" not in kwargs and ceiling in ("read_only", "workspace_write"):
            kwargs["permission_mode"] = ceiling  # the default ("auto") is above the tenant's ceiling
        # One transaction: the existence check, this service's row and the kernel's agent row (the creation
        # joins it), so two racing creations of one id make one agent and the other sees it.
        async with self.store.transaction() as tx:
            if body.id is not None and await tx.get_agent(agent_id) is not None:
                rows = await tx.fetch(
                    "SELECT tenant, fingerprint FROM stead_server_agents WHERE agent_id = ?", (agent_id,)
                )
                tenant = self.tenant(rows[0][0] if rows else None)
                if not (rows and rows[0][1] == fp and tenant == principal.tenant):
                    raise ApiError(409, "agent_exists", f"an agent with id {agent_id!r} already exists")
                existing = True
            else:
                existing = False
                # a fresh row: events or fingerprints left by a deleted agent of the same id go with it
                for table in ("stead_events", "stead_server_messages"):
                    await tx.execute(f"DELETE FROM {table} WHERE agent_id = ?", (agent_id,))
                await tx.execute(
                    "INSERT INTO stead_server_agents(agent_id, tenant, fingerprint, head_seq, "
                    "pruned_through) VALUES (?, ?, ?, 0, 0) ON CONFLICT(agent_id) DO UPDATE SET "
                    "tenant = excluded.tenant, "
                    "fingerprint = excluded.fingerprint, head_seq = 0, pruned_through = 0",
                    (agent_id, principal.tenant, fp),
                )
                with _quiet_model_errors(body.model):
                    if body.definition is not None:
                        agent = await self.system.create(
                            agent_id=agent_id, definition=body.definition, data=body.data, **kwargs
                        )
                    else:
                        agent = await self.system.create(
                            agent_id=agent_id,
                            provider=body.provider,
                            model=body.model,
                            instructions=body.instructions or "",
                            tools=body.tools or (),
                            name=body.name,
                            **kwargs,
                        )
        if existing:
            return await self.system.get(agent_id), False
        return agent, True

    async def delete_agent(self, principal: Principal, agent_id: str, abort: bool) -> None:
        agent = await self.agent(principal, agent_id)
        if agent.active and not abort:
            raise ApiError(
                409, "agent_busy", f"agent {agent_id} owes work; abort it first or delete with ?abort=true"
            )
        await self.system.delete(agent_id)

    # ------------------------------------------------------------------ messages
    def _check_widening(
        self, principal: Principal, agent: Agent, item: MessageIn | BatchItem, loc: tuple[str, ...]
    ) -> None:
        """SEC1 and SEC3 for one message: its model, permission mode and reserved metadata."""
        config = agent.config
        field = ".".join(loc)
        check_metadata(item.metadata, principal, config, f"{field}.metadata" if field else "metadata")
        settings = item.settings
        if settings is None:
            return
        where = (*loc, "settings")
        check_model(
            settings.model, settings.provider, allowed=self.allowed_models(principal), loc=(*where, "model")
        )
        check_permission_mode(
            settings.permission_mode,
            principal,
            ceilings={
                "the agent": config.permission_mode,
                "the tenant": self.auth.policy(principal.tenant).max_permission_mode,
            },
            field=".".join((*where, "permission_mode")),
        )

    def _input(self, item: MessageIn | BatchItem, message_id: str) -> tuple[Input, str]:
        content = blocks_from_json(
            [c.model_dump() for c in item.content] if isinstance(item.content, list) else item.content
        )
        settings = item.settings.model_dump(exclude_none=True) if item.settings is not None else {}
        inp = Input(content, message_id, item.mode, item.role, item.metadata, settings)
        self._check_size(inp)
        check_storable("the message", item.model_dump())  # A7: a 422, not a 500 at the fingerprint
        body = {
            "mode": item.mode,
            "role": item.role,
            "content": item.content
            if isinstance(item.content, str)
            else [c.model_dump() for c in item.content],
            "metadata": item.metadata,
            "settings": settings,
        }
        return inp, fingerprint(body)

    def _check_size(self, inp: Input) -> None:
        """413 for a message over the system's payload limit (measured as the kernel measures it, A7)."""
        from stead.extend import Text

        blocks = [Text(inp.content)] if isinstance(inp.content, str) else list(inp.content)
        try:
            size = len(json.dumps([encode_block(b) for b in blocks])) + len(json.dumps(inp.metadata or {}))
        except (TypeError, ValueError):
            raise InvalidInput("metadata must be JSON-serializable") from None
        limit = self.system.admission.max_payload_bytes
        if size > limit:
            raise ApiError(
                413, "payload_too_large", f"the message is {size} bytes; the limit is {limit} bytes"
            )

    async def deliver(
        self,
        principal: Principal,
        agent: Agent,
        items: Sequence[tuple[MessageIn | BatchItem, str | None]],
        if_busy: str,
    ) -> AcceptOutcome:
        """Deliver messages (all or none) with their fingerprints, in one transaction; a message that would
        widen the agent or name an endpoint or file the operator did not allow is refused first."""
        prepared: list[tuple[Input, str]] = []
        batch = len(items) > 1 or isinstance(items[0][0], BatchItem)
        for i, (item, given) in enumerate(items):
            self._check_widening(principal, agent, item, ("messages", str(i)) if batch else ())
            prepared.append(self._input(item, given if given is not None else new_id()))
        ids = [inp.id for inp, _ in prepared]
        if len(set(ids)) != len(ids):
            raise ApiError(422, "invalid_request", "the same message id appears twice in one batch")
        found: dict[str, Any] = {}

        async def record(tx: Tx) -> None:
            # inside the acceptance's own transaction, group-committed with concurrent senders (A6):
            # the fingerprints commit with the messages or not at all
            found.clear()
            marks = ",".join("?" for _ in ids)
            # one read (one round trip on PostgreSQL): the agent's events head, and the messages seen before
            rows = await tx.fetch(
                "SELECT s.head_seq, m.message_id, m.fingerprint, m.events_after "
                "FROM (SELECT CAST(? AS TEXT) AS agent_id) a "
                "LEFT JOIN stead_server_agents s ON s.agent_id = a.agent_id "
                "LEFT JOIN stead_server_messages m ON m.agent_id = a.agent_id "
                f"AND m.message_id IN ({marks})",
                (agent.id, *ids),
            )
            known = {str(r[1]): (str(r[2]), int(r[3])) for r in rows if r[1] is not None}
            for inp, fp in prepared:
                seen = known.get(str(inp.id))
                if seen is not None and seen[0] != fp:
                    raise ApiError(
                        422, "id_reused", f"message id {inp.id!r} was used before with another body"
                    )
            if len(known) == len(prepared):
                # every message is a retry of one accepted before: the acceptance writes nothing either
                found["head"] = min(v[1] for v in known.values())
                return
            if if_busy == "reject" and agent.active:
                raise ApiError(409, "agent_busy", f"agent {agent.id} is busy (if_busy: reject)")
            head = int(rows[0][0]) if rows and rows[0][0] is not None else 0
            for inp, fp in prepared:
                if str(inp.id) not in known:
                    await tx.write_sql(
                        "INSERT INTO stead_server_messages(agent_id, message_id, fingerprint, events_after) "
                        "VALUES (?, ?, ?, ?)",
                        (agent.id, inp.id, fp, head),
                    )
            found["head"] = head

        models = [inp.settings.get("model") for inp, _ in prepared if inp.settings]
        with _quiet_model_errors(*models):
            accs = await agent.deliver([inp for inp, _ in prepared], before_accept=record)
        head = int(found["head"])
        return AcceptOutcome(accs, head, any(a.created for a in accs))

    # ------------------------------------------------------------------ events
    async def replay(
        self, agent_id: str, after: int, upto: int, limit: int = 500
    ) -> list[tuple[int, str | None, str, str]]:
        async with self.store.transaction() as tx:
            rows = await tx.fetch(
                "SELECT seq, run_id, type, data FROM stead_events "
                "WHERE agent_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                (agent_id, after, upto, limit),
            )
        return [(int(r[0]), r[1], str(r[2]), str(r[3])) for r in rows]

    # ------------------------------------------------------------------ approvals
    async def approval(self, principal: Principal, approval_id: str) -> Approval:
        """The approval if its agent is in the principal's tenant; 404 otherwise."""
        try:
            found = await self.system.approval(approval_id)
        except NotFound:
            raise ApiError(404, "not_found", f"no approval with id {approval_id!r}") from None
        if await self.tenant_of(found.agent_id) != principal.tenant:
            raise ApiError(404, "not_found", f"no approval with id {approval_id!r}")
        return found

    async def list_approvals(
        self,
        principal: Principal,
        *,
        status: str,
        agent_id: str | None,
        root_run_id: str | None = None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Approval], str | None]:
        """The tenant's approvals, oldest first (cursor on creation time and id). `status`: `pending`,
        `decided` (anything else) or `all`. Agents that were deleted take their approvals with them."""
        cursor: tuple[float, str] | None = None
        if after is not None:
            created, aid = decode_cursor(after, 2)
            if not isinstance(created, int | float) or not isinstance(aid, str):
                raise ApiError(422, "invalid_cursor", "the cursor is not one this service issued")
            cursor = (float(created), aid)
        found = await self._approval_source().approvals_page(
            status="pending" if status == "pending" else "decided" if status == "decided" else None,
            agent_id=agent_id,
            root_run_id=root_run_id,
            after=cursor,
            limit=limit + 1,
            scope=self.tenant_scope(principal),
        )
        items = found[:limit]
        nxt = encode_cursor(items[-1].created_at, items[-1].id) if len(found) > limit and items else None
        return items, nxt

    async def decide(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        reason: str | None,
        edited_arguments: dict[str, Any] | None,
    ) -> Decision:
        """Decide once (returns after the decision's commit). The same decision again returns the stored
        one (`decided=False`); another decision after one was made is 409 `approval_decided`."""
        await self.approval(principal, approval_id)
        if edited_arguments is not None and decision != "approve":
            raise ApiError(422, "invalid_request", "edited_arguments go with decision 'approve' only")
        by = principal.name or principal.token_id
        if decision == "approve":
            outcome = await self.system.approve(
                approval_id, note=reason, arguments=edited_arguments, decided_by=by
            )
        else:
            outcome = await self.system.reject(approval_id, note=reason, decided_by=by)
        if not outcome.decided and outcome.status != _DECIDED_AS[decision]:
            stored = outcome.approval
            raise ApiError(
                409,
                "approval_decided",
                f"approval {approval_id} was decided before: {stored.status}"
                + (f" by {stored.decided_by}" if stored.decided_by else "")
                + (f" ({stored.note})" if stored.note else ""),
            )
        return outcome

    # ------------------------------------------------------------------ runs
    @property
    def records(self) -> bool:
        return any(isinstance(p, RunReader) for p in self.system.plugins)

    async def run(self, principal: Principal, run_id: str) -> Run:
        if not self.records:
            raise ApiError(404, "not_found", f"no run with id {run_id!r} (run records are off)")
        try:
            run = await self.system.run(run_id)
        except RunNotFound:
            raise ApiError(404, "not_found", f"no run with id {run_id!r}") from None
        if await self.tenant_of(run.agent_id) != principal.tenant:
            raise ApiError(404, "not_found", f"no run with id {run_id!r}")
        return run

    async def list_runs(
        self,
        principal: Principal,
        *,
        agent_id: str | None,
        status: str | None,
        parent_run_id: str | None,
        roots: bool,
        after: str | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], str | None]:
        if not self.records:
            return [], None
        cursor: tuple[float, str] | None = None
        if after is not None:
            started, rid = decode_cursor(after, 2)
            if not isinstance(started, int | float) or not isinstance(rid, str):
                raise ApiError(422, "invalid_cursor", "the cursor is not one this service issued")
            cursor = (float(started), rid)
        found = await self._run_reader().runs_page(
            agent_id=agent_id,
            status=status,
            parent_run_id=parent_run_id,
            roots=roots,
            before=cursor,
            limit=limit + 1,
            scope=self.tenant_scope(principal),
        )
        out = [{**run_json(run), "error": public_text(run.error)} for run in found[:limit]]
        nxt = encode_cursor(out[-1]["started_at"], out[-1]["id"]) if len(found) > limit and out else None
        return out, nxt


@contextlib.contextmanager
def _quiet_model_errors(*models: Any) -> Iterator[None]:
    """A scripted model file the operator allowed may still be missing or malformed: the caller learns
    that the model cannot be used, never whether the file exists nor what its lines say (SEC1b)."""
    named = [m for v in models for m in ([v] if isinstance(v, str) else list(v or ())) if isinstance(m, str)]
    try:
        yield
    except ConfigurationError as exc:
        if any(needs_permission(m) for m in named):
            log.warning("a caller's model cannot be used: %s", exc)
            raise ApiError(
                422, "configuration", "the model cannot be used here (see the server's log)"
            ) from None
        raise
