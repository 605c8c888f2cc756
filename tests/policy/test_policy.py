"""The permission-mode policy (issue 12): every cell of the table, tools' `approval=` declarations, callable
policies failing closed, and allow / ask / deny rules by tool name (deny wins)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import pytest

import stead
from stead.policy import DEFAULT_TABLE, PolicyPlugin, Rules, decide
from tests.policy.support import ARGS, NAMES, TIMEOUT, TOOLS, open_system, ran, results

# the documented table (docs/approvals.md), by tool of tests/policy/support.py
EXPECTED: dict[str, dict[str, str]] = {
    # read_file, write_file, fetch (external), delete_file (destructive), peek (always), ping (never)
    "read_only": dict(zip(NAMES, ["run", "deny", "deny", "deny", "deny", "deny"], strict=True)),
    "workspace_write": dict(zip(NAMES, ["run", "run", "ask", "ask", "ask", "run"], strict=True)),
    "auto": dict(zip(NAMES, ["run", "run", "run", "ask", "ask", "run"], strict=True)),
    "full_access": dict(zip(NAMES, ["run", "run", "run", "run", "ask", "run"], strict=True)),
}


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


def test_the_default_table_is_the_documented_one() -> None:
    assert DEFAULT_TABLE["read_only"] == dict.fromkeys(
        ["write", "external", "destructive", "always"], "deny"
    ) | {"read": "run"}
    assert DEFAULT_TABLE["full_access"]["always"] == "ask"
    for mode, row in EXPECTED.items():
        for tool in TOOLS:
            assert decide(mode, tool, ARGS[tool.name]).cell == row[tool.name], (mode, tool.name)


@pytest.mark.parametrize("mode", list(EXPECTED))
async def test_P5_mode_matrix(mode: str, db_url: str) -> None:
    """Every cell, through a real batch: `run` runs, `deny` commits an error result naming the mode at once
    (and never runs), `ask` holds the call with a pending approval."""
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=NAMES, permission_mode=mode)
        await agent.send("call " + " ".join(NAMES))
        await agent.wait_idle(timeout=TIMEOUT)
        expected = EXPECTED[mode]
        asked = sorted(n for n, cell in expected.items() if cell == "ask")
        assert sorted(a.tool for a in await system.approvals()) == asked
        assert all(a.mode == mode for a in await system.approvals())
        assert agent.state == ("waiting" if asked else "idle")
        got = results(await agent.history())
        for name, cell in expected.items():
            if cell == "run":
                assert ran[name] == 1 and not got[name][1], name
            elif cell == "deny":
                assert ran[name] == 0 and got[name][1], name
                assert got[name][0].startswith(f"refused: {name} ") and f"in {mode} mode" in got[name][0]
            else:
                assert ran[name] == 0 and name not in got, name
        for a in await system.approvals():
            await system.approve(a.id)
        await agent.wait_idle(timeout=TIMEOUT)
        assert agent.state == "idle"
        assert all(ran[n] == 1 for n, cell in expected.items() if cell != "deny")


async def test_the_mode_is_the_one_durable_when_the_message_was_consumed(db_url: str) -> None:
    async with open_system(db_url) as system:
        agent = await system.create(provider="scripted", model="m", tools=["write_file"])
        await agent.send("call write_file", permission_mode="read_only")
        await agent.wait_idle(timeout=TIMEOUT)
        assert results(await agent.history())["write_file"][1] and ran["write_file"] == 0
        await agent.send("call write_file")  # no mode: the durable one (read_only) still applies
        await agent.wait_idle(timeout=TIMEOUT)
        assert ran["write_file"] == 0
        await agent.send("call write_file", permission_mode="workspace_write")
        await agent.wait_idle(timeout=TIMEOUT)
        assert ran["write_file"] == 1


def _calls(flag: list[Any]) -> stead.Tool:
    def policy(arguments: dict[str, Any]) -> bool:
        flag.append(arguments)
        if arguments["path"] == "boom":
            raise RuntimeError("policy bug")
        return bool(arguments["path"].startswith("/etc"))

    @stead.tool(effects="write", approval=policy)
    async def edit(path: str) -> str:
        "Edit a file."
        return f"edited {path}"

    return edit


@pytest.mark.parametrize(
    "arguments,expected",
    [
        ({"path": "/etc/passwd"}, "ask"),
        ({"path": "notes.txt"}, "run"),
        ({"path": "boom"}, "ask"),
        ({}, "ask"),
    ],
    ids=["says-ask", "says-run", "raises", "invalid-arguments"],
)
def test_P6_callable_policy_fails_closed(arguments: dict[str, Any], expected: str) -> None:
    seen: list[Any] = []
    edit = _calls(seen)
    assert decide("auto", edit, arguments).cell == expected
    assert decide("read_only", edit, arguments).cell == "deny"  # asking never lifts a mode's deny
    if arguments:
        assert seen and seen[0] == arguments  # the callable saw the validated arguments
    else:
        assert not seen  # invalid arguments never reach it


async def test_P6_a_callable_that_raises_holds_the_call(db_url: str) -> None:
    edit = _calls([])

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if request.messages[-1].role == "tool":
            return [stead.Text("done")]
        return [stead.ToolCall("edit", {"path": "boom"})]

    from stead.providers.scripted import ScriptedProvider

    async with stead.open(
        db_url, approvals=True, providers={"scripted": ScriptedProvider(respond)}, tools=[edit]
    ) as system:
        agent = await system.create(provider="scripted", model="m", tools=["edit"])
        await agent.send("edit it")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()
        assert a.tool == "edit" and agent.state == "waiting"


def test_rules_override_the_table_and_deny_wins() -> None:
    read_file, write_file, fetch, delete_file, _, ping = TOOLS
    rules = Rules(allow=("delete_*", "fetch"), ask=("read_file", "fetch"), deny=("fetch", "ping"))
    assert decide("auto", delete_file, ARGS["delete_file"], rules).cell == "run"  # allowed
    assert decide("auto", read_file, ARGS["read_file"], rules).cell == "ask"
    assert decide("full_access", fetch, ARGS["fetch"], rules).cell == "deny"  # deny wins over allow and ask
    assert decide("auto", ping, ARGS["ping"], rules).reason.startswith("refused: ping is denied")
    assert decide("read_only", write_file, ARGS["write_file"], Rules(allow=("write_file",))).cell == "run"


async def test_per_agent_rules_add_to_the_systems(db_url: str) -> None:
    policy = PolicyPlugin(rules={"deny": ["ping"]})
    async with open_system(db_url, plugins=[policy]) as system:
        agent = await system.create(
            provider="scripted",
            model="m",
            tools=["ping", "read_file"],
            extra={"stead.permissions": {"ask": ["read_file"]}},
        )
        await agent.send("call ping read_file")
        await agent.wait_idle(timeout=TIMEOUT)
        assert [a.tool for a in await system.approvals()] == ["read_file"]
        assert results(await agent.history())["ping"][0].startswith("refused: ping is denied")


def test_a_table_must_cover_every_mode_and_column() -> None:
    with pytest.raises(stead.ConfigurationError, match="no row for mode 'workspace_write'"):
        PolicyPlugin(table={"read_only": DEFAULT_TABLE["read_only"]})
    broken = {m: dict(r) for m, r in DEFAULT_TABLE.items()}
    broken["auto"]["write"] = "maybe"  # type: ignore[assignment]
    with pytest.raises(stead.ConfigurationError, match="auto/write"):
        PolicyPlugin(table=broken)  # type: ignore[arg-type]


def test_a_tool_that_declares_nothing_is_external() -> None:
    @stead.tool
    async def anything() -> str:
        "Something."
        return "x"

    assert (anything.effects, anything.destructive, anything.approval) == ("external", False, "policy")
    with pytest.raises(stead.ConfigurationError, match="effects must be one of"):
        stead.tool(effects="everything")(anything.fn)
    with pytest.raises(stead.ConfigurationError, match="approval must be one of"):
        stead.tool(approval="sometimes")(anything.fn)


async def test_without_a_policy_plugin_every_tool_runs_as_before(db_url: str) -> None:
    async with open_system(db_url, approvals=False) as system:
        agent = await system.create(provider="scripted", model="m", tools=NAMES, permission_mode="read_only")
        await agent.send("call " + " ".join(NAMES))
        await agent.wait_idle(timeout=TIMEOUT)
        assert all(ran[n] == 1 for n in NAMES)
        with pytest.raises(stead.ConfigurationError, match="approvals are off"):
            await system.approvals()


def test_the_approvals_table_has_sqlite_and_postgresql_migrations() -> None:
    (sqlite,) = PolicyPlugin.migrations["sqlite"]["policy"]
    (postgres,) = PolicyPlugin.migrations["postgresql"]["policy"]
    assert "CREATE TABLE approvals" in sqlite and "call_id TEXT NOT NULL UNIQUE" in sqlite
    assert "CHECK (status IN ('pending', 'approved', 'rejected', 'expired', 'cancelled'))" in postgres
    assert "DOUBLE PRECISION" in postgres and "REAL" not in postgres
    assert sqlite.replace("REAL", "DOUBLE PRECISION") == postgres  # the only difference


def _psql(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["su", "postgres", "-c", "psql -X -q -v ON_ERROR_STOP=1 -f -"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_approvals_sql_runs_on_postgresql() -> None:
    """No PostgreSQL store exists yet: run the table's migration and every statement the plugin sends
    (`?` numbered as PostgreSQL's `$n`) on the machine's PostgreSQL, in a transaction rolled back."""
    if shutil.which("psql") is None or os.geteuid() != 0 or _psql("SELECT 1").returncode != 0:
        pytest.skip("no local PostgreSQL reachable as the postgres user")
    from stead.policy import _sql as Q

    def numbered(sql: str) -> str:
        count = iter(range(1, 100))
        return re.sub(r"\?", lambda _: f"${next(count)}", sql)

    (ddl,) = PolicyPlugin.migrations["postgresql"]["policy"]
    lines = ["BEGIN;", *(f"{s.strip()};" for s in ddl.split(";") if s.strip())]
    statements = {
        "ins": Q.INSERT,
        "dec": Q.DECIDE,
        "decc": Q.DECIDE_CALL,
        "due": Q.DUE,
        "nxt": Q.NEXT_EXPIRY,
        "sel": Q.SELECT + " WHERE status = ? AND agent_id = ? AND root_run_id = ? ORDER BY created_at, id",
    }
    lines += [f"PREPARE {name} AS {numbered(sql)};" for name, sql in statements.items()]
    lines += [
        "EXECUTE ins('a1', 'ag', 'r', 'r', 'c1', 't', '{}', 'write', 1, 'auto', 'why', 1.5, 9.0);",
        "EXECUTE due(10.0);",
        "EXECUTE dec('approved', 'ok', NULL, 'ana', 2.0, 'a1');",
        "EXECUTE decc('cancelled', NULL, 'stead', 3.0, 'c1');",
        "EXECUTE sel('approved', 'ag', 'r');",
        "ROLLBACK;",
    ]
    done = _psql("\n".join(lines))
    assert done.returncode == 0, done.stderr
    assert "approved" in done.stdout and "ana" in done.stdout  # the first decision stood
