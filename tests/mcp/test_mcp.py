"""MCP tools (issue 12): the real `mcp-server-time` from PyPI over stdio, in-process servers for
annotations and `list_changed`, a scripted stdio server that dies mid-call, and closing from another task."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.mcp import McpPlugin, McpServer, flags_for
from stead.mcp._connection import Connection, resolve_command
from stead.providers.scripted import ScriptedProvider

pytest.importorskip("mcp")

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

TIMEOUT = 30.0
DYING = Path(__file__).resolve().parent / "dying_server.py"
TIME = {"name": "time", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}


def calls(*steps: tuple[str, dict[str, Any]]) -> ScriptedProvider:
    """A model that makes the given calls one response at a time, then answers with the last result."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = sum(len(m.content) for m in request.messages if m.role == "tool")
        if done < len(steps):
            name, args = steps[done]
            return [stead.ToolCall(name, args)]
        last = request.messages[-1].content[0]
        assert isinstance(last, stead.ToolResult)
        return [stead.Text(("ERROR " if last.is_error else "") + last.output)]

    return ScriptedProvider(respond)


def tool_results(history: list[stead.Message]) -> list[stead.ToolResult]:
    return [b for m in history for b in m.content if isinstance(b, stead.ToolResult)]


def annotated_server() -> MCPServer:
    srv = MCPServer("annotated")

    @srv.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    def lookup(key: str) -> str:
        """Read a value."""
        return f"value of {key}"

    @srv.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True))
    def search(query: str) -> str:
        """Search the web."""
        return f"results for {query}"

    @srv.tool(
        annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    )
    def put(key: str, value: str) -> str:
        """Store a value (idempotent)."""
        return "stored"

    @srv.tool(
        annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    )
    def append(key: str, value: str) -> str:
        """Append a value."""
        return "appended"

    @srv.tool(annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False))
    def wipe(key: str) -> str:
        """Delete a value."""
        return "wiped"

    @srv.tool()
    def plain(x: int) -> str:
        """No annotations at all."""
        return str(x)

    return srv


async def test_MCP1_time_server_list_and_call(db_url: str) -> None:
    """The real reference server from PyPI, over stdio: listed, called, and `is_error` for a bad timezone."""
    provider = calls(
        ("time__get_current_time", {"timezone": "Europe/Paris"}),
        ("time__get_current_time", {"timezone": "Mars/Olympus"}),
    )
    async with stead.open(db_url, providers={"scripted": provider}, mcp=[TIME]) as system:
        assert {"time__get_current_time", "time__convert_time"} <= set(system.tools)
        t = system.tools["time__get_current_time"]
        assert t.parameters["properties"]["timezone"]["type"] == "string"
        assert (t.effects, t.durable, t.destructive) == ("external", False, False)  # not trusted
        agent = await system.create(provider="scripted", model="m", tools=["time__get_current_time"])
        await agent.send("what time is it in Paris?")
        await agent.wait_idle(timeout=TIMEOUT)
        ok, bad = tool_results(await agent.history())
        assert not ok.is_error and json.loads(ok.output)["timezone"] == "Europe/Paris"
        assert bad.is_error and "Mars/Olympus" in bad.output and "Invalid timezone" in bad.output


async def test_MCP1_a_definition_offers_its_servers_tools(tmp_path: Path, db_url: str) -> None:
    (tmp_path / "model.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: x\n")
    (tmp_path / "clock.yaml").write_text(
        "name: clock\nmodel: scripted:model.yaml\n"
        "mcp:\n  - name: time\n    command: mcp-server-time\n    trust_annotations: true\n"
    )
    provider = calls(
        ("time__convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
    )
    async with stead.open(db_url, definitions=tmp_path, providers={"scripted/clock": provider}) as system:
        agent = await system.create(definition="clock")
        assert agent.config.tools == []  # offered without being listed under tools:
        assert system.tools["time__convert_time"].effects == "read"  # trusted: read-only, closed world
        await agent.send("noon UTC in Tokyo?")
        await agent.wait_idle(timeout=TIMEOUT)
        (result,) = tool_results(await agent.history())
        assert not result.is_error and "Asia/Tokyo" in result.output and "21:00" in result.output


async def test_MCP2_in_process_annotations_map_to_flags(db_url: str) -> None:
    spec = McpServer(
        name="kv", url="memory://kv", trust_annotations=True, tools={"plain": {"effects": "read"}}
    )
    plugin = McpPlugin([spec], in_process={"kv": annotated_server()})
    async with stead.open(db_url, plugins=[plugin]) as system:
        flags = {
            n: (t.effects, t.durable, t.destructive) for n, t in system.tools.items() if n.startswith("kv__")
        }
    assert flags == {
        "kv__lookup": ("read", True, False),
        "kv__search": ("external", True, False),
        "kv__put": ("write", True, False),
        "kv__append": ("write", False, False),
        "kv__wipe": ("write", False, True),
        "kv__plain": ("read", False, True),  # the override wins on effects; the spec defaults on the rest
    }


async def test_MCP3_untrusted_defaults_fail_closed(db_url: str) -> None:
    plugin = McpPlugin(
        [McpServer(name="kv", url="memory://kv", allow=["lookup", "wipe"])],
        in_process={"kv": annotated_server()},
    )
    async with stead.open(
        db_url, plugins=[plugin], approvals=True, providers={"scripted": calls(("kv__wipe", {"key": "a"}))}
    ) as system:
        names = sorted(n for n in system.tools if n.startswith("kv__"))
        assert names == ["kv__lookup", "kv__wipe"]  # the allow list
        for n in names:  # the server's read-only claim is ignored: external, at most once
            assert (system.tools[n].effects, system.tools[n].durable) == ("external", False)
        agent = await system.create(
            provider="scripted", model="m", tools=names, permission_mode="workspace_write"
        )
        await agent.send("wipe a")
        await agent.wait_idle(timeout=TIMEOUT)
        (a,) = await system.approvals()  # external in workspace_write: the policy asks
        assert a.tool == "kv__wipe" and agent.state == "waiting"
        await system.approve(a.id)
        await agent.wait_idle(timeout=TIMEOUT)
        assert tool_results(await agent.history())[0].output == "wiped"


def test_MCP2_flags_table() -> None:
    ann = ToolAnnotations
    assert flags_for(None, True) == ("external", False, True)  # spec defaults: open world, destructive
    assert flags_for(ann(read_only_hint=True), True) == ("external", True, False)
    assert flags_for(ann(read_only_hint=True), False) == ("external", False, False)


async def test_MCP6_list_changed_invalidates_cache(db_url: str) -> None:
    srv = MCPServer("growing")

    @srv.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool to this server."""
        srv.add_tool(lambda: "fresh!", name="fresh", description="A new tool.")
        await ctx.notify_tools_changed()
        return "grown"

    relisted = asyncio.Event()
    offered: list[list[str]] = []

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        offered.append([t.name for t in request.tools])
        done = sum(len(m.content) for m in request.messages if m.role == "tool")
        if done == 0:
            return [stead.ToolCall("g__grow", {})]
        if done == 1:
            await relisted.wait()  # the server's notification relists the tools (no timed wait)
            return [stead.ToolCall("g__fresh", {})]
        return [stead.Text("done")]

    plugin = McpPlugin([McpServer(name="g", url="memory://g")], in_process={"g": srv})
    async with stead.open(
        db_url, plugins=[plugin], providers={"scripted": ScriptedProvider(respond)}
    ) as system:
        agent = await system.create(provider="scripted", model="m", extra={"stead.mcp": ["g"]})
        assert plugin.tool_names("g") == ["g__grow"]
        conn = plugin.connections["g"]
        inner = conn.on_tools
        assert inner is not None

        def on_tools(c: Connection) -> None:
            inner(c)
            if "fresh" in [t.name for t in c.tools]:
                relisted.set()

        conn.on_tools = on_tools
        await agent.send("grow, then use the new tool")
        await agent.wait_idle(timeout=TIMEOUT)
        assert plugin.tool_names("g") == ["g__grow", "g__fresh"]
        first, second = tool_results(await agent.history())
        assert first.output == "grown" and not second.is_error and second.output == "fresh!"
        assert offered[0] == ["g__grow"] and offered[-1] == ["g__grow", "g__fresh"]


async def test_MCP5_server_crash_mid_call_error_and_restart(tmp_path: Path, db_url: str) -> None:
    starts = tmp_path / "starts.txt"
    spec = {
        "name": "dying",
        "command": sys.executable,
        "args": [str(DYING), str(starts)],
        "trust_annotations": True,
    }
    provider = calls(("dying__die", {"text": "x"}), ("dying__echo", {"text": "after"}), ("dying__starts", {}))
    async with stead.open(db_url, mcp=[spec], providers={"scripted": provider}) as system:
        plugin = system.plugin("mcp")
        assert isinstance(plugin, McpPlugin)
        plugin.connections["dying"].backoff = (0.01, 0.05)
        agent = await system.create(provider="scripted", model="m", extra={"stead.mcp": ["dying"]})
        await agent.send("go")
        await agent.wait_idle(timeout=TIMEOUT)
        died, echoed, counted = tool_results(await agent.history())
    # the call in flight when the server died: an error saying its effect is unknown, not sent again
    assert died.is_error and "stopped during the call" in died.output and "not sent again" in died.output
    # the server was restarted with backoff and the next calls went through
    assert not echoed.is_error and echoed.output == "echo after"
    assert counted.output == "2" and len(starts.read_text().splitlines()) == 2


async def test_MCP7_close_from_other_task_clean(tmp_path: Path) -> None:
    conn = Connection(McpServer(name="dying", command=sys.executable, args=[str(DYING)]))

    async def opener() -> bool:
        return await conn.start()

    assert await asyncio.get_running_loop().create_task(opener())
    result = await asyncio.get_running_loop().create_task(conn.call("echo", {"text": "hi"}))
    assert result.content[0].text == "echo hi"
    await asyncio.get_running_loop().create_task(
        conn.close()
    )  # neither the opening task nor the lifetime task
    assert not conn.up and conn.last_error is None  # ended without the cancel-scope error
    with pytest.raises(Exception, match="not running"):
        await conn.call("echo", {"text": "again"}, timeout=0.01)


def test_commands_next_to_this_python_are_found() -> None:
    assert Path(resolve_command("mcp-server-time")).name == "mcp-server-time"
