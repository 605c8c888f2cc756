"""Shared fixtures: a fresh store URL per test (SQLite, and PostgreSQL where the suite runs on both) and a
scripted tool-loop model.

`db_url` is parametrized `[sqlite, postgresql]` for the tests under `PG_SUITES` (the kernel, store and
crash-point suites and the plugin suites that pass on both): one fixture, not a copy of the tests. A test
about SQLite itself (its file, lock, WAL readers) is marked `@pytest.mark.sqlite_only("why")` and gets only
the SQLite parametrization. PostgreSQL URLs name a fresh schema in a session database
(`tests/fakes/postgres.py`); with no server the PostgreSQL parametrizations skip, saying why."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stead
from tests.fakes.postgres import PgTestServer

TESTS = Path(__file__).parent
PG_SUITES = tuple(
    TESTS / d
    for d in (
        "",
        "chaos",
        "cli",
        "context",
        "core",
        "definitions",
        "fleet",
        "flows",
        "mcp",
        "memory",
        "observability",
        "orchestration",
        "policy",
        "outside",
        "providers",
        "realtime",
        "server",
        "store",
        "tools",
    )
)
"""Directories whose `db_url` tests run on both stores (top level: the plugin seam and the public API)."""

# Fake model servers (`oai`, `ant`) and an environment without real keys or proxies for every test.
pytest_plugins = ["tests.fakes.fixtures"]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "stead.db"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_kind" not in metafunc.fixturenames:
        return
    kinds = ["sqlite"]
    if Path(metafunc.definition.path).parent in PG_SUITES and not metafunc.definition.get_closest_marker(
        "sqlite_only"
    ):
        kinds.append("postgresql")
    metafunc.parametrize("store_kind", kinds, scope="function")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgTestServer]:
    server = PgTestServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store_kind() -> str:
    return "sqlite"  # parametrized by pytest_generate_tests


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty PostgreSQL schema's URL (skips when no server answers)."""
    server: PgTestServer = request.getfixturevalue("pg_server")
    if server.url is None:
        pytest.skip(server.error or "no PostgreSQL server")
    url = server.schema_url()
    yield url
    server.drop_schema(url)


@pytest.fixture
def db_target(db_path: Path, db_url: str, store_kind: str) -> Path | str:
    """What `tests.fakes.postgres.raw_rows` opens to look at the database from outside the store: the
    SQLite file, or the PostgreSQL URL."""
    return db_url if store_kind == "postgresql" else db_path


@pytest.fixture
def db_url(db_path: Path, store_kind: str, request: pytest.FixtureRequest) -> str:
    if store_kind == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{db_path}?synchronous=normal"


def url_of(path: Path) -> str:
    """The URL of a SQLite store file, without waiting for fsync (the tests that name their own files)."""
    return f"sqlite:///{path}?synchronous=off"


def tool_results_since_last_user(request: stead.ProviderRequest) -> int:
    """How many tool results follow the last user message (a deterministic responder's position)."""
    n = 0
    for m in reversed(request.messages):
        if m.role == "user":
            break
        if m.role == "tool":
            n += len(m.content)
    return n


def tool_loop(tool: str = "add", k: int = 5) -> Callable[[stead.ProviderRequest], list[stead.Block]]:
    """A responder that calls `tool` k times (one call per response), then answers with text."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        n = tool_results_since_last_user(request)
        if n < k:
            return [stead.ToolCall(name=tool, arguments={"a": n, "b": 1})]
        return [stead.Text(f"done after {n} calls")]

    return respond


async def conversation_records(system: stead.AgentSystem, agent_id: str) -> list[dict[str, Any]]:
    """The agent's stored history records that make up the conversation: every record except the
    end-of-run records (`{"k": "e"}`, the kernel's run → outcome link, which no reader shows)."""
    async with system.store.transaction() as tx:
        raw = await tx.load(agent_id)
    return [rec for rec in map(json.loads, raw) if rec["k"] != "e"]
