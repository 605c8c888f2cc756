"""Checking and compiling a flow (and any definition's payload rules) when its file loads.

Everything that can be checked without running is checked here, and every error is a `DefinitionError` with
`file:line:` and the field: expressions (compiled with their length and nesting limits), output targets,
payload patterns, prompt templates, step and path names, the tools and sub-agents steps name, the start
step, and whether the flow has the model its prompt steps need. The compiled forms are attached to the
definition's models, so running a flow never parses anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from stead.extend import DefinitionError, YamlDocument, schema_problem
from stead.flows._expr import ExpressionError, compile_expression
from stead.flows._paths import PathError, parse_pattern, parse_target
from stead.flows._schema import FlowDefinition, FlowStep, StepBody

__all__ = ["TEMPLATES", "Static", "check_schema", "compile_flow", "compile_payload_rules"]

TEMPLATES = SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
)
"""Prompt-step templates: sandboxed, undefined names are errors (as for instructions)."""

Loc = list[int | str]


class Static:
    """A static value in an input mapping (anything that is not a string)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _field(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error(doc: YamlDocument | None, loc: Loc, message: str, *, key: bool = False) -> DefinitionError:
    text = f"{_field(loc)}: {message}"
    if doc is None:
        return DefinitionError(text)
    return doc.error(text, loc, key=key)


def _expr(doc: YamlDocument | None, loc: Loc, source: Any) -> Any:
    try:
        return compile_expression(source)
    except ExpressionError as e:
        raise _error(doc, loc, str(e)) from None


def compile_payload_rules(definition: FlowDefinition, doc: YamlDocument | None) -> None:
    rules = definition.payload
    if rules is None:
        return
    for name in ("read", "write"):
        patterns = getattr(rules, name)
        if patterns is None:
            continue
        compiled = []
        for i, text in enumerate(patterns):
            try:
                compiled.append(parse_pattern(text, write=name == "write"))
            except PathError as e:
                raise _error(doc, ["payload", name, i], str(e)) from None
        setattr(rules, f"_{name}", compiled)


def compile_flow(definition: FlowDefinition, doc: YamlDocument | None = None) -> None:
    """Check and compile `definition`'s payload rules and, for a flow, its steps, paths and result."""
    compile_payload_rules(definition, doc)
    definition._compiled = True
    if definition.type != "flow":
        return
    names: dict[str, int] = {}
    starts: list[str] = []
    for i, step in enumerate(definition.steps):
        if step.name in names:
            raise _error(
                doc, ["steps", i, "name"], f"another step is named {step.name!r} (steps[{names[step.name]}])"
            )
        names[step.name] = i
        if step.start:
            starts.append(step.name)
    if len(starts) > 1:
        i = names[starts[1]]
        raise _error(
            doc, ["steps", i, "start"], f"only one step can be the start (found: {', '.join(starts)})"
        )
    tools = {t.name for t in definition.resolved_tools}
    for i, step in enumerate(definition.steps):
        _compile_step(definition, doc, ["steps", i], step, tools)
    for i, path in enumerate(definition.paths):
        for end in ("from", "to"):
            target = path.from_ if end == "from" else path.to
            if target not in names:
                known = ", ".join(names)
                raise _error(doc, ["paths", i, end], f"no step is named {target!r} (steps: {known})")
        if path.when is not None:
            path._when = _expr(doc, ["paths", i, "when"], path.when)
    if definition.result is not None:
        definition._result = _expr(doc, ["result"], definition.result)


def _compile_step(
    definition: FlowDefinition, doc: YamlDocument | None, loc: Loc, step: FlowStep, tools: set[str]
) -> None:
    if step.for_each is not None:
        step.for_each._items = _expr(doc, [*loc, "for_each", "items"], step.for_each.items)
        _compile_body(definition, doc, [*loc, "for_each", "do"], step.for_each.do, tools)
    elif step.while_ is not None:
        step.while_._when = _expr(doc, [*loc, "while", "when"], step.while_.when)
        _compile_body(definition, doc, [*loc, "while", "do"], step.while_.do, tools)
    if step.kind in ("for_each", "while"):
        if step.input is not None:
            raise _error(doc, [*loc, "input"], "a loop has no input of its own (give its 'do' step one)")
        step._output = _outputs(doc, [*loc, "output"], step.output)
        return
    _compile_body(definition, doc, loc, step, tools)


def _compile_body(
    definition: FlowDefinition, doc: YamlDocument | None, loc: Loc, body: StepBody, tools: set[str]
) -> None:
    if body.tool is not None and body.tool not in tools:
        known = ", ".join(sorted(tools)) or "none"
        raise _error(doc, [*loc, "tool"], f"{body.tool!r} is not one of this flow's tools (tools: {known})")
    if body.sub_agent is not None and body.sub_agent not in definition.sub_agents:
        known = ", ".join(definition.sub_agents) or "none"
        raise _error(
            doc,
            [*loc, "sub_agent"],
            f"{body.sub_agent!r} is not listed under sub_agents (sub_agents: {known})",
        )
    if body.prompt is not None:
        if definition.model is None:
            raise _error(doc, [*loc, "prompt"], "a prompt step needs a model: set the flow's 'model'")
        body._template = _template(doc, [*loc, "prompt"], body.prompt)
        if body.output_schema is not None:
            check_schema(doc, [*loc, "output_schema"], body.output_schema)
    if isinstance(body.input, str):
        body._input = _expr(doc, [*loc, "input"], body.input)
    elif isinstance(body.input, dict):
        body._input = {
            key: _expr(doc, [*loc, "input", key], value) if isinstance(value, str) else Static(value)
            for key, value in body.input.items()
        }
    if body.request is not None:
        body._request = _expr(doc, [*loc, "request"], body.request)
    body._output = _outputs(doc, [*loc, "output"], body.output)


def _outputs(doc: YamlDocument | None, loc: Loc, output: dict[str, str] | None) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    for key, source in (output or {}).items():
        try:
            target = parse_target(key)
        except PathError as e:
            raise _error(doc, [*loc, key], str(e), key=True) from None
        out.append((target, _expr(doc, [*loc, key], source)))
    return out


def check_schema(doc: YamlDocument | None, loc: Loc, schema: Any) -> None:
    """A JSON schema of the supported subset (`stead.core.structured.schema_problem`), or the error."""
    problem = schema_problem(schema)
    if problem is not None:
        where, message = problem
        raise _error(doc, [*loc, *where], message)


def _node(root: yaml.Node | None, loc: Sequence[int | str]) -> yaml.Node | None:
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next(
                (v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None
            )
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            return None
    return node


def _template(doc: YamlDocument | None, loc: Loc, source: str) -> Any:
    try:
        return TEMPLATES.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        if doc is None:
            raise DefinitionError(f"{_field(loc)}: template syntax error: {e.message}") from None
        node = _node(doc.root, loc)
        first = doc.line(loc) + (1 if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">") else 0)
        raise DefinitionError(
            f"{_field(loc)}: template syntax error: {e.message}",
            path=str(doc.path),
            line=first + max((e.lineno or 1) - 1, 0),
        ) from None
