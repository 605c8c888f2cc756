"""Loading agent definition files: YAML → `AgentDefinition`, with tools imported and the model checked.

Every problem is a `stead.DefinitionError` whose message starts with `file:line:` and names the field.
Model strings are checked against the one grammar of `stead.providers.router` (the catalog, driver kinds,
scripted model files — loaded here — and the names of the providers that will be registered, passed as
`providers=`); which candidate is used is decided when an agent is created, by the system's router.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any

from stead.definitions._registry import Registry
from stead.definitions._schema import AgentDefinition
from stead.definitions._template import compile_instructions
from stead.extend import SUPPORTED_MODEL_OPTIONS as SUPPORTED
from stead.extend import (
    ConfigurationError,
    DefinitionError,
    OptionError,
    Provider,
    Tool,
    YamlDocument,
    check_model_options,
    load_catalog,
    load_yaml_model,
    parse_spec,
    read_yaml,
    tool,
    unsupported_options,
)
from stead.flows import check_schema, compile_flow
from stead.testing import load_scripted_model

__all__ = ["import_tool", "load_definition", "load_registry"]


def load_definition(path: str | Path, *, providers: Collection[str] = ()) -> AgentDefinition:
    """Load and check an agent definition file: schema, instructions template, tool imports, the model
    strings (`providers`: names of the providers that will be registered, so `model: NAME:MODEL` is known)
    and the scripts of scripted models. References to sub-agents are checked by `load_registry`."""
    definition, _ = _load(Path(path), providers)
    return definition


_MARKERS = ("name", "model", "instructions", "tools", "sub_agents")
"""Keys that make a YAML file an agent definition (one with errors, perhaps): a file with none of them is
something else and is reported as such instead of as a list of unknown keys."""


def _check_is_definition(doc: YamlDocument) -> None:
    data = doc.data
    if isinstance(data, dict) and data.get("scripted") is True:
        raise doc.error("this is a scripted model file (scripted: true), not an agent definition")
    if not isinstance(data, dict):
        return  # empty files and lists get load_yaml_model's own messages
    if not any(k in data for k in _MARKERS):
        keys = ", ".join(str(k) for k in list(data)[:5]) + (", ..." if len(data) > 5 else "")
        raise doc.error(
            f"not an agent definition: it has none of the keys name, model, instructions (its keys: {keys})"
        )


def _load(
    p: Path, providers: Collection[str] = (), doc: YamlDocument | None = None
) -> tuple[AgentDefinition, YamlDocument]:
    _check_is_definition(doc if doc is not None else read_yaml(p, what="agent definition"))
    definition, doc = load_yaml_model(p, AgentDefinition, what="agent definition")
    definition._source = p.resolve()
    compile_instructions(definition, doc)
    definition._tools = _resolve_tools(definition, doc)
    _check_models(definition, doc, providers)
    _check_model_options(definition, doc, providers)
    if definition.output is not None:
        check_schema(doc, ["output"], definition.output)
    compile_flow(definition, doc)  # payload rules; a flow's steps, paths and expressions (file:line errors)
    return definition, doc


def _check_model_options(definition: AgentDefinition, doc: YamlDocument, providers: Collection[str]) -> None:
    """`model_options:`: known keys, right types, a named `tool_choice` one of the agent's tools (or
    sub-agents), and only options every candidate's vendor takes."""
    raw = definition.model_options
    if not raw:
        return
    names = [t.name for t in definition.resolved_tools] + list(definition.sub_agents)
    try:
        options = check_model_options(raw, tools=names if definition.type == "loop" else None)
    except OptionError as e:
        raise doc.error(str(e), ["model_options", e.key] if e.key else ["model_options"]) from None
    catalog = load_catalog(os.environ.get("STEAD_CATALOG") or None)
    for candidate in definition.candidates:
        try:
            spec = parse_spec(candidate, registered=providers, catalog=catalog, base_dir=definition.base_dir)
        except ConfigurationError:
            continue  # reported by _check_models
        if spec.route is None:
            continue  # a registered provider or a scripted model: it decides itself
        bad = unsupported_options(spec.route.driver, options)
        if bad:
            raise doc.error(
                f"model_options.{bad[0]}: {spec.route.vendor} ({candidate}) does not support this option "
                f"(its options: {', '.join(sorted(SUPPORTED[spec.route.driver]))})",
                ["model_options", bad[0]],
            )
    definition.model_options = options.items()


def _check_models(definition: AgentDefinition, doc: YamlDocument, providers: Collection[str]) -> None:
    """Each candidate must name something the grammar knows; scripted model files are loaded now."""
    catalog = load_catalog(os.environ.get("STEAD_CATALOG") or None)
    single = isinstance(definition.model, str)
    for i, candidate in enumerate(definition.candidates):
        loc: list[int | str] = ["model"] if single else ["model", i]
        field = "model" if single else f"model[{i}]"
        if definition.type == "realtime":
            # realtime models have their own grammar (stead.realtime); only scripted files are checked here
            prefix, _, rest = candidate.partition(":")
            if prefix == "text-duplex" and not (definition.base_dir / rest).is_file():
                raise doc.error(f"{field}: text-duplex script {rest!r} not found", loc)
            continue
        try:
            spec = parse_spec(candidate, registered=providers, catalog=catalog, base_dir=definition.base_dir)
        except ConfigurationError as e:
            if ":" not in candidate:
                raise doc.error(
                    f"{field}: must look like 'provider:model' or be a catalog model name; {e}", loc
                ) from None
            raise doc.error(f"{field}: {e}", loc) from None
        if spec.kind == "scripted":
            assert spec.path is not None
            definition._providers[candidate] = _load_scripted(doc, spec.path, candidate, field, loc)


def _load_scripted(
    doc: YamlDocument, file: Path, candidate: str, field: str, loc: list[int | str]
) -> Provider:
    if not file.is_file():
        name = candidate.partition(":")[2].strip()
        raise doc.error(f"{field}: scripted model file {name!r} not found (looked for {file})", loc)
    return load_scripted_model(_display(file))


def load_registry(directory: str | os.PathLike[str], *, providers: Collection[str] = ()) -> Registry:
    """Load every agent definition in `directory` (`*.yaml` / `*.yml` at its top level; scripted model
    files — `scripted: true` — and hidden files such as `.pre-commit-config.yaml` are skipped) and check the
    references between them: unknown sub-agents, delegation cycles, duplicate names and sub-agents that
    clash with a tool name. Every problem is a `DefinitionError` naming `file:line:` and the field; any
    other YAML file (`docker-compose.yaml`, say) is refused as "not an agent definition", naming it.
    `providers`: as for `load_definition`."""
    d = Path(directory)
    if not d.is_dir():
        raise DefinitionError("definitions directory not found", path=str(d))
    docs: dict[str, tuple[AgentDefinition, YamlDocument]] = {}
    files = sorted(f for f in [*d.glob("*.yaml"), *d.glob("*.yml")] if not f.name.startswith("."))
    for f in files:
        head = read_yaml(f, what="agent definition")
        if isinstance(head.data, dict) and head.data.get("scripted") is True:
            continue  # a scripted model file living next to the definitions
        definition, doc = _load(f, providers, head)
        if definition.name in docs:
            other = docs[definition.name][0].source
            raise doc.error(f"name: another definition is named {definition.name!r} ({other})", ["name"])
        docs[definition.name] = (definition, doc)
    if not docs:
        raise DefinitionError("no agent definitions (*.yaml) in this directory", path=str(d))
    for name, (definition, doc) in docs.items():
        tool_names = {t.name for t in definition.resolved_tools}
        for i, sub in enumerate(definition.sub_agents):
            loc: list[int | str] = ["sub_agents", i]
            if sub not in docs:
                known = ", ".join(sorted(docs)) or "none"
                raise doc.error(f"sub_agents[{i}]: unknown sub-agent {sub!r}; definitions: {known}", loc)
            if sub == name:
                raise doc.error(f"sub_agents[{i}]: {name!r} cannot delegate to itself", loc)
            if sub in tool_names:
                raise doc.error(f"sub_agents[{i}]: {sub!r} is also the name of one of its tools", loc)
    _check_cycles(docs)
    return Registry(d, {name: definition for name, (definition, _) in docs.items()})


def _check_cycles(docs: dict[str, tuple[AgentDefinition, YamlDocument]]) -> None:
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        definition, doc = docs[name]
        for i, sub in enumerate(definition.sub_agents):
            if state.get(sub) == 1:
                cycle = (
                    " → ".join([*path[path.index(sub) :], name, sub]) if sub in path else f"{name} → {sub}"
                )
                raise doc.error(f"sub_agents[{i}]: delegation cycle {cycle}", ["sub_agents", i])
            if state.get(sub) is None:
                visit(sub, [*path, name])
        state[name] = 2

    for name in sorted(docs):
        if state.get(name) is None:
            visit(name, [])


def _display(file: Path) -> Path:
    """A path relative to the working directory when it is below it (shorter error messages)."""
    try:
        return file.relative_to(Path.cwd())
    except ValueError:
        return file


def _resolve_tools(definition: AgentDefinition, doc: YamlDocument) -> list[Tool]:
    out: list[Tool] = []
    seen: dict[str, int] = {}
    for i, ref in enumerate(definition.tools):
        loc: list[int | str] = ["tools", i]
        try:
            t = import_tool(ref, base_dir=definition.base_dir)
        except ConfigurationError as e:
            raise doc.error(f"tools[{i}]: {e}", loc) from None
        if t.name in seen:
            raise doc.error(
                f"tools[{i}]: a tool named {t.name!r} is already listed (tools[{seen[t.name]}])", loc
            )
        seen[t.name] = i
        out.append(t)
    return out


def import_tool(ref: str, *, base_dir: Path | None = None) -> Tool:
    """Import `package.module:name` or `file.py:name` (relative to `base_dir`) as a `Tool`.

    A plain function is wrapped with `stead.tool`. Raises `ConfigurationError` naming the problem."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigurationError(f"{ref!r} must look like 'package.module:name' or 'file.py:name'")
    base = base_dir if base_dir is not None else Path.cwd()
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _import_file(base / target, target)
    else:
        module = _import_module(target, base)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"{target} has no attribute {attr!r}") from None
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        try:
            return tool(obj)
        except ConfigurationError as e:
            raise ConfigurationError(f"{ref}: {e}") from None
    raise ConfigurationError(f"{ref} is a {type(obj).__name__}, not a tool or a function")


def _ensure_path(directory: Path) -> None:
    """Make modules next to the definition importable (appended: never shadows installed packages)."""
    d = str(directory)
    if d not in sys.path:
        sys.path.append(d)


def _import_module(name: str, base: Path) -> ModuleType:
    _ensure_path(base)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigurationError(f"module {name!r} not found (searched sys.path and {base})") from None
        raise ConfigurationError(f"importing {name} failed: {e}") from None
    except ConfigurationError as e:  # e.g. a @stead.tool whose parameter type has no JSON schema
        raise ConfigurationError(f"{name}: {e}") from None
    except Exception as e:
        raise ConfigurationError(f"importing {name} failed: {type(e).__name__}: {e}") from None


def _import_file(file: Path, shown: str) -> ModuleType:
    file = file.resolve()
    if not file.is_file():
        raise ConfigurationError(f"tool file {shown!r} not found (looked for {file})")
    digest = hashlib.sha1(str(file).encode(), usedforsecurity=False).hexdigest()[:12]
    mod_name = f"_stead_tools_{file.stem}_{digest}"
    cached = sys.modules.get(mod_name)
    if cached is not None:
        return cached
    _ensure_path(file.parent)
    spec = importlib.util.spec_from_file_location(mod_name, file)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"cannot import {shown!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except ConfigurationError as e:  # e.g. a @stead.tool whose parameter type has no JSON schema
        del sys.modules[mod_name]
        raise ConfigurationError(f"{shown}: {e}") from None
    except Exception as e:
        del sys.modules[mod_name]
        raise ConfigurationError(f"importing {shown} failed: {type(e).__name__}: {e}") from None
    return module
