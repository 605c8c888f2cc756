"""A plugin reads another plugin's data through its public API, never its tables (issue 22): no SQL string
in a built-in plugin's package names a table another plugin creates, and the kernel names none at all.
The HTTP service lists approvals and runs through `ApprovalSource.approvals_page` and
`RunReader.runs_page`, scoped by its tenant (`AgentScope`); memory records what it injected into a prompt
with `stead.extend.update_step`. Proven on planted statements."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stead
from stead.extend import Plugin
from stead.memory._plugin import MemoryPlugin
from stead.observability.plugin import RecordsPlugin, TracingPlugin
from stead.policy._plugin import PolicyPlugin
from stead.realtime._plugin import RealtimePlugin
from stead.server._plugin import ServerPlugin

SRC = Path(stead.__file__).parent
OWNERS: dict[str, tuple[type[Plugin], ...]] = {
    "policy": (PolicyPlugin,),
    "observability": (RecordsPlugin, TracingPlugin),
    "memory": (MemoryPlugin,),
    "realtime": (RealtimePlugin,),
    "server": (ServerPlugin,),
}
"""Package → the plugins it defines that create tables."""
PLUGIN_PACKAGES = (*OWNERS, "orchestration", "mcp", "flows", "definitions")
_CREATE = re.compile(r"CREATE\s+(?:VIRTUAL\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_USE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+(\w+)", re.IGNORECASE)


def tables_of(*plugins: type[Plugin]) -> set[str]:
    tables: set[str] = set()
    for plugin in plugins:
        for modules in plugin.migrations.values():
            for scripts in modules.values():
                for script in scripts:
                    tables.update(t.lower() for t in _CREATE.findall(script))
    return tables


def tables_named(source: str, tables: set[str]) -> set[str]:
    """The tables of `tables` that a string constant of `source` reads or writes in SQL."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(t.lower() for t in _USE.findall(node.value) if t.lower() in tables)
    return found


def reaches(files: list[Path], tables: set[str]) -> dict[str, set[str]]:
    named = {str(p.relative_to(SRC)): tables_named(p.read_text(), tables) for p in files}
    return {name: found for name, found in named.items() if found}


def test_no_plugin_names_a_table_of_another_plugin() -> None:
    every = tables_of(*(p for plugins in OWNERS.values() for p in plugins))
    assert {"approvals", "runs", "run_steps", "stead_server_agents"} <= every
    for package in PLUGIN_PACKAGES:
        others = every - tables_of(*OWNERS.get(package, ()))
        assert reaches(sorted((SRC / package).rglob("*.py")), others) == {}, package


def test_the_kernel_names_no_plugin_table() -> None:
    every = tables_of(*(p for plugins in OWNERS.values() for p in plugins))
    kernel = [*SRC.glob("*.py"), *(SRC / "core").rglob("*.py"), *(SRC / "store").rglob("*.py")]
    assert reaches(kernel, every) == {}


def test_a_planted_read_of_another_plugins_table_is_found() -> None:
    tables = tables_of(PolicyPlugin, RecordsPlugin)
    planted = 'SQL = "SELECT p.id FROM approvals p " "JOIN agents a ON a.id = p.agent_id"\n'
    assert tables_named(planted, tables) == {"approvals"}
    assert tables_named('SQL = "UPDATE run_steps SET input_json = ?"', tables) == {"run_steps"}
    assert tables_named('SQL = "SELECT id FROM agents"', tables) == set()  # the kernel's table
