"""The HTTP service reads other plugins' data through their public APIs, never their tables (issue 22):
no SQL string in `stead.server` names a table another built-in plugin creates (approvals and runs are
listed through `ApprovalSource.approvals_page` and `RunReader.runs_page`, scoped by the service's tenant,
`AgentScope`). Proven on a planted statement."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stead
from stead.memory._plugin import MemoryPlugin
from stead.observability.plugin import RecordsPlugin, TracingPlugin
from stead.policy._plugin import PolicyPlugin
from stead.realtime._plugin import RealtimePlugin

SERVER = Path(stead.__file__).parent / "server"
OTHERS = (PolicyPlugin, RecordsPlugin, TracingPlugin, MemoryPlugin, RealtimePlugin)
_CREATE = re.compile(r"CREATE\s+(?:VIRTUAL\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)


def other_plugins_tables() -> set[str]:
    tables: set[str] = set()
    for plugin in OTHERS:
        for modules in plugin.migrations.values():
            for scripts in modules.values():
                for script in scripts:
                    tables.update(t.lower() for t in _CREATE.findall(script))
    return tables


def tables_named(source: str, tables: set[str]) -> set[str]:
    """The tables of `tables` that a string constant of `source` reads or writes in SQL."""
    pattern = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+(\w+)", re.IGNORECASE)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(t.lower() for t in pattern.findall(node.value) if t.lower() in tables)
    return found


def test_the_server_names_no_table_of_another_plugin() -> None:
    tables = other_plugins_tables()
    assert {"approvals", "runs", "run_steps"} <= tables
    named = {str(p.name): tables_named(p.read_text(), tables) for p in SERVER.glob("*.py")}
    assert {name: found for name, found in named.items() if found} == {}


def test_a_planted_read_of_another_plugins_table_is_found() -> None:
    planted = 'SQL = "SELECT p.id FROM approvals p " "JOIN agents a ON a.id = p.agent_id"\n'
    assert tables_named(planted, other_plugins_tables()) == {"approvals"}
    assert tables_named('SQL = "SELECT 1 FROM run_steps"', other_plugins_tables()) == {"run_steps"}
