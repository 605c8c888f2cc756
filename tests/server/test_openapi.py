"""OpenAPI: the schema is complete, and property-based fuzzing against it (schemathesis) finds no 5xx, no
undocumented status or content type and no answer off its schema, for each tenant's token (H9).

The service runs in its own thread and event loop on 127.0.0.1:0 (schemathesis calls it synchronously);
generated path ids are swapped for real ones of the caller's tenant half of the time, so the fuzzing also
reaches agents, runs and approvals that exist. Fixed seed and a bounded budget: `STEAD_FUZZ_EXAMPLES`
(default 100) positive and as many negative cases per operation for tenant A, half that for tenant B — 300
cases per operation in all (about 2.5 min on the 2-core CI machine; generation, not the service, is the
cost)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from stead.server._run import start, stop  # noqa: E402
from tests.server.support import A, B, bearer, close_env, open_env  # noqa: E402

EXAMPLES = int(os.environ.get("STEAD_FUZZ_EXAMPLES", "100"))
SEED = 20261201
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


class LiveService:
    """The service in a thread of its own, with real agents and runs of both tenants."""

    def __init__(self, db: Path) -> None:
        self.url = f"sqlite:///{db}?synchronous=normal"
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.base = ""
        self.ids: dict[str, dict[str, str]] = {}
        self.error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:  # pragma: no cover - surfaced by the fixture
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        env = await open_env(self.url)
        server, task = await start(env.app, port=0)
        self.base = f"http://127.0.0.1:{server.bound_port}"
        env.model.calls = 1
        for tenant, secret in (("acme", A), ("globex", B)):
            agent = await env.agent(secret, tools=["add"])
            await env.http.post(
                f"/v1/agents/{agent['id']}/messages", json={"content": "go"}, headers=bearer(secret)
            )
            await env.idle(agent["id"])
            runs = (await env.http.get("/v1/runs", headers=bearer(secret))).json()["items"]
            self.ids[tenant] = {"agent_id": agent["id"], "run_id": runs[0]["id"]}
        env.model.tool = "transfer"  # and a pending approval per tenant, so decisions reach real ones
        for tenant, secret in (("acme", A), ("globex", B)):
            agent = await env.agent(secret, tools=["transfer"])
            await env.http.post(
                f"/v1/agents/{agent['id']}/messages", json={"content": "pay"}, headers=bearer(secret)
            )
            await env.idle(agent["id"])
            (approval,) = (await env.http.get("/v1/approvals", headers=bearer(secret))).json()["items"]
            self.ids[tenant]["approval_id"] = approval["id"]
        self.ready.set()
        await self._stop.wait()
        await stop(server, task)
        await close_env(env)

    def __enter__(self) -> LiveService:
        self.thread.start()
        self.ready.wait(60)
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(60)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    with LiveService(tmp_path_factory.mktemp("fuzz") / "stead.db") as service:
        yield service


STREAMS = ["streamAgentEvents", "streamRunEvents"]  # streams are tested in test_events.py


def fuzz_tenant(live: LiveService, tenant: str, secret: str, examples: int) -> int:
    """`examples` positive and as many negative cases for every operation; returns how many were sent."""
    config = schemathesis.Config.from_dict({"seed": SEED, "generation": {"max-examples": examples}})
    api = schemathesis.openapi.from_url(f"{live.base}/openapi.json", config=config)
    sent = 0
    for result in api.exclude(operation_id=STREAMS).get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                nonlocal sent
                if case.path_parameters and hash(repr(sorted(case.path_parameters.items()))) % 2 == 0:
                    for name in list(case.path_parameters):
                        if name in live.ids[tenant]:  # reach real resources of this tenant too
                            case.path_parameters[name] = live.ids[tenant][name]
                case.call_and_validate(base_url=live.base, headers=bearer(secret), checks=CHECKS)
                sent += 1

            try:
                check()
            except Unsatisfiable:
                continue  # nothing to make negative (an operation without parameters or body)
            except Exception as e:
                raise AssertionError(f"{operation.label} ({mode.value}): {e}") from e
    return sent


def test_H9_generated_requests_of_tenant_a_never_get_a_5xx_or_an_undocumented_answer(
    live: LiveService,
) -> None:
    assert fuzz_tenant(live, "acme", A, EXAMPLES) > 0


def test_H9_generated_requests_of_tenant_b_never_get_a_5xx_or_an_undocumented_answer(
    live: LiveService,
) -> None:
    assert fuzz_tenant(live, "globex", B, max(1, EXAMPLES // 2)) > 0


def test_H9_the_schema_documents_every_operation_and_its_errors(live: LiveService) -> None:
    import httpx

    doc = httpx.get(f"{live.base}/openapi.json").json()
    ids = []
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            ids.append(op["operationId"])
            responses = op["responses"]
            assert any(code.startswith("2") for code in responses), f"{method} {path}"
            if path.startswith("/v1/") and path not in (
                "/v1/healthz",
                "/v1/readyz",
                "/v1/sessions",
                "/v1/session",
            ):
                for code in ("401", "403", "422", "429"):
                    assert code in responses, f"{method} {path} does not document {code}"
            for code, response in responses.items():
                if int(code) >= 400:
                    assert list(response["content"]) == ["application/problem+json"], (
                        f"{method} {path} {code}"
                    )
    assert len(ids) == len(set(ids))
    for stream in STREAMS:
        op = next(o for ops in doc["paths"].values() for o in ops.values() if o["operationId"] == stream)
        assert "text/event-stream" in op["responses"]["200"]["content"]
    events = doc["components"]["schemas"]["AgentEvent"]
    assert len(events["oneOf"]) == 14
