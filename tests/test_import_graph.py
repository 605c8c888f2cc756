"""The import graph of `src/stead` has no cycles, and the layers import only what is below them.

Every import counts: module level, inside functions and classes, and under `if TYPE_CHECKING:` — a cycle
held together by a function-level import is still two ideas tangled in one place (issue 8, item 3). The
graph is built with `ast` (nothing is imported). An edge goes to the exact module named: `from X import y`
points at `X.y` when that is a module of the package, else at `X`; importing `stead.a.b` adds no edge to
the package `stead.a`'s `__init__` (Python runs it, but it is not what the importer depends on — otherwise
everything would cycle through `stead/__init__`).

The same code checks a small synthetic package in `tmp_path`, so the test is shown to fail on a planted
cycle and a planted layer violation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


# ---------------------------------------------------------------------------------------------- the graph
def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a directory under `root`): dotted name → file."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve_base(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a (possibly relative) `from ... import` names."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]  # a module's relative imports start at its package
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{name}" if name else base


def _target(named: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that `named` refers to (the longest existing prefix), or None."""
    parts = named.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports (every import statement anywhere in the file)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_target(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_base(module, _is_package(path), node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else _target(base, modules))
            for t in targets:
                if t is not None and t != module:
                    graph[module].add(t)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan, iteratively deep enough for a package of this size
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [_cycle_in(graph, set(comp)) for comp in components]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(prev[chain[-1]])
                    return [*reversed(chain), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in component {sorted(comp)}")  # pragma: no cover


@dataclass(frozen=True)
class Rule:
    """Modules matching `applies_to` may import only modules matching `allowed` (when given) and never
    modules matching `forbidden`. A pattern `a.b` matches `a.b` itself; `a.b.*` matches everything below."""

    name: str
    applies_to: tuple[str, ...]
    allowed: tuple[str, ...] | None = None
    forbidden: tuple[str, ...] = ()


def _matches(module: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith(".*"):
            if module.startswith(p[:-1]):
                return True
        elif module == p:
            return True
    return False


def layer_violations(graph: dict[str, set[str]], rules: Iterable[Rule]) -> list[str]:
    out: list[str] = []
    for rule in rules:
        for module in sorted(graph):
            if not _matches(module, rule.applies_to):
                continue
            for target in sorted(graph[module]):
                bad = (rule.allowed is not None and not _matches(target, rule.allowed)) or _matches(
                    target, rule.forbidden
                )
                if bad:
                    out.append(f"{rule.name}: {module} imports {target}")
    return out


# ---------------------------------------------------------------------------------------------- the rules
STORE_ALLOWED = ("stead._ids", "stead.errors", "stead.messages", "stead.store", "stead.store.*")
STORE_RULE = Rule("store", ("stead.store", "stead.store.*"), allowed=STORE_ALLOWED)
KERNEL = (
    *STORE_ALLOWED,
    "stead._tokens",
    "stead.providers.base",
    "stead.tools",
    "stead.tools.*",
    "stead.core",
    "stead.core.*",
)
CORE_RULE = Rule("core", ("stead.core", "stead.core.*"), allowed=KERNEL)
ABOVE_THE_SYSTEM = tuple(
    f"stead.{layer}{suffix}"
    for layer in (
        "observability",
        "orchestration",
        "definitions",
        "context",
        "memory",
        "policy",
        "mcp",
        "realtime",
        "server",
        "flows",
        "cli",
    )
    for suffix in ("", ".*")
)
SYSTEM_RULE = Rule(
    "system/agent",
    ("stead.system", "stead.agent", "stead._opening", "stead._group_commit", "stead._steps", "stead._tokens"),
    forbidden=ABOVE_THE_SYSTEM,
)
EXTEND_RULE = Rule("extend", ("stead.extend", "stead.testing"), forbidden=ABOVE_THE_SYSTEM)

PUBLIC_TIERS = ("stead", "stead.extend", "stead.testing")
PLUGIN_DEPENDENCIES: dict[str, tuple[str, ...]] = {
    "observability": (),
    "flows": (),
    "mcp": (),
    "memory": (),
    "policy": (),
    "server": (),
    "definitions": ("flows", "mcp"),
    "orchestration": ("definitions", "flows"),
    "realtime": ("definitions", "orchestration"),
}
"""Each built-in plugin → the plugins it builds on (their public face, the package itself, only)."""


def plugin_rules(dependencies: dict[str, tuple[str, ...]], root: str = "stead") -> list[Rule]:
    """A rule per plugin: it imports the public tiers, its own package and the faces of the plugins it
    declares, nothing else (no `_`-module of the kernel or of another plugin)."""
    tiers = tuple(t.replace("stead", root, 1) for t in PUBLIC_TIERS)
    return [
        Rule(
            f"plugin {name}",
            (f"{root}.{name}", f"{root}.{name}.*"),
            allowed=(*tiers, f"{root}.{name}", f"{root}.{name}.*", *(f"{root}.{d}" for d in deps)),
        )
        for name, deps in dependencies.items()
    ]


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The graph between packages (`stead.flows`, `stead.core`, …; top-level modules stand for themselves)."""

    def pkg(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = out.setdefault(pkg(module), set())
        edges.update(pkg(t) for t in targets if pkg(t) != pkg(module))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC, "stead")


def _show_cycles(cycles: list[list[str]]) -> str:
    return "\n".join(" → ".join(c) for c in cycles)


def test_the_graph_sees_the_kernel(graph: dict[str, set[str]]) -> None:
    """Sanity: the parser finds the modules and their imports (an empty graph would pass every rule)."""
    assert "stead.core.runtime" in graph and "stead.store.sqlite" in graph
    assert "stead.store.base" in graph["stead.core.runtime"] or any(
        "stead.store.base" in graph[m] for m in graph if m.startswith("stead.core.")
    )
    assert "stead.agent" in graph["stead.system"]


def test_no_import_cycles_in_the_kernel(graph: dict[str, set[str]]) -> None:
    """core/, store/, tools/, messages, the provider protocol, the agent handle and the system form no
    cycle among themselves (any import counts)."""
    kernel = {m for m in graph if _matches(m, (*KERNEL, "stead.agent", "stead.system"))}
    sub = {m: graph[m] & kernel for m in kernel}
    cycles = find_cycles(sub)
    assert not cycles, "import cycles:\n" + _show_cycles(cycles)


def test_no_import_cycles_anywhere(graph: dict[str, set[str]]) -> None:
    cycles = find_cycles(graph)
    print(_show_cycles(cycles))
    assert not cycles, "import cycles:\n" + _show_cycles(cycles)


def test_store_imports_only_what_is_below_it(graph: dict[str, set[str]]) -> None:
    assert layer_violations(graph, [STORE_RULE]) == []


def test_core_imports_only_store_providers_base_and_tools(graph: dict[str, set[str]]) -> None:
    assert layer_violations(graph, [CORE_RULE]) == []


def test_system_and_agent_import_no_layer_above_them(graph: dict[str, set[str]]) -> None:
    assert layer_violations(graph, [SYSTEM_RULE]) == []


def test_extend_and_testing_stand_below_every_plugin(graph: dict[str, set[str]]) -> None:
    assert layer_violations(graph, [EXTEND_RULE]) == []


def test_built_in_plugins_import_only_public_tiers_and_declared_faces(graph: dict[str, set[str]]) -> None:
    """Issue 22: a built-in plugin lives by the seams an outside plugin has (`stead`, `stead.extend`,
    `stead.testing`) plus the public face of each plugin it declares it builds on."""
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 1 and not m.split(".")[1].startswith("_")}
    assert set(PLUGIN_DEPENDENCIES) <= packages
    assert layer_violations(graph, plugin_rules(PLUGIN_DEPENDENCIES)) == []


def test_no_cycle_between_packages(graph: dict[str, set[str]]) -> None:
    """Plugins are siblings: no package imports one that imports it back (through any path)."""
    cycles = find_cycles(package_graph(graph))
    assert not cycles, "package cycles:\n" + _show_cycles(cycles)


# ---------------------------------------------------------------------------------------------- self-test
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_planted_cycle_is_found_whatever_hides_it(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "class A:\n    def f(self):\n        from pkg import b\n        return b\n",
            "pkg/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n"),
            "pkg/c.py": "from .a import A\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "import pkg.sub.e\n",
            "pkg/sub/e.py": "from ..a import A\n",
        },
    )
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.a"] == {"pkg.b"}  # an import inside a method of a class
    assert g["pkg.b"] == {"pkg.c"}  # under TYPE_CHECKING, relative, `from . import module`
    assert g["pkg.c"] == {"pkg.a"}  # relative `from .a import name`
    assert g["pkg.sub.d"] == {"pkg.sub.e"}  # no edge to the package `pkg.sub`
    assert g["pkg.sub.e"] == {"pkg.a"}  # `..` from a subpackage module
    assert find_cycles(g) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    # without the function-level import the graph is acyclic
    (tmp_path / "pkg/a.py").write_text("class A:\n    pass\n", encoding="utf-8")
    assert find_cycles(import_graph(tmp_path, "pkg")) == []


def test_a_planted_layer_violation_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/x.py": "def f():\n    import pkg.high.y\n",
            "pkg/low/z.py": "from pkg.low import x\n",
            "pkg/high/__init__.py": "",
            "pkg/high/y.py": "from pkg.low.x import f\n",
        },
    )
    g = import_graph(tmp_path, "pkg")
    rule = Rule("low", ("pkg.low", "pkg.low.*"), allowed=("pkg.low", "pkg.low.*"))
    assert layer_violations(g, [rule]) == ["low: pkg.low.x imports pkg.high.y"]
    forbid = Rule("no-high", ("pkg.low.z",), forbidden=("pkg.high", "pkg.high.*"))
    assert layer_violations(g, [forbid]) == []
    assert find_cycles(g) == [["pkg.high.y", "pkg.low.x", "pkg.high.y"]]


def test_a_planted_plugin_reach_and_package_cycle_are_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/extend.py": "from pkg.core.x import X\n",
            "pkg/core/__init__.py": "",
            "pkg/core/x.py": "class X: ...\n",
            "pkg/alpha/__init__.py": "from pkg.alpha._a import A\n",
            "pkg/alpha/_a.py": "from pkg.extend import X\nfrom pkg.beta._b import B\n",
            "pkg/beta/__init__.py": "from pkg.beta._b import B\n",
            "pkg/beta/_b.py": "from pkg.core.x import X\nfrom pkg.alpha import A\nB = 1\n",
        },
    )
    g = import_graph(tmp_path, "pkg")
    rules = plugin_rules({"alpha": ("beta",), "beta": ()}, root="pkg")
    assert layer_violations(g, rules) == [
        "plugin alpha: pkg.alpha._a imports pkg.beta._b",  # a declared dependency, but not its face
        "plugin beta: pkg.beta._b imports pkg.alpha",  # not declared
        "plugin beta: pkg.beta._b imports pkg.core.x",  # the kernel's module, not a public tier
    ]
    assert find_cycles(package_graph(g)) == [["pkg.alpha", "pkg.beta", "pkg.alpha"]]
