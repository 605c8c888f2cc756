"""Instructions are Jinja2 templates, rendered in a sandbox with undefined names as errors.

Syntax errors are found when the definition loads; an undefined variable is found when an agent is created
(the data is known only then). Both become `DefinitionError`s pointing at the template's line in the file.

SEC6k2: a render has budgets. It may take at most `MAX_RENDER_SECONDS` (checked while the template's own code
runs, every few hundred lines it executes, so a loop that outputs nothing is stopped too), produce at most
`MAX_RENDER_CHARS` characters (counted as the output is generated), and `*` / `**` may not build a string,
list or number larger than that; Jinja's sandbox already refuses `range()` past 100,000 items. Past a budget
the render ends with a `DefinitionError` saying which.
"""

from __future__ import annotations

import sys
import time
from types import FrameType
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from stead.definitions._schema import AgentDefinition
from stead.extend import DefinitionError, YamlDocument

__all__ = ["MAX_RENDER_CHARS", "MAX_RENDER_SECONDS", "compile_instructions", "render_instructions"]

MAX_RENDER_SECONDS = 2.0
MAX_RENDER_CHARS = 500_000
_CHECK_EVERY = 256
"""Template lines executed between two looks at the clock."""


class _OverBudget(Exception):
    """A render went past one of its budgets (the message says which)."""


class _Environment(SandboxedEnvironment):
    """The sandbox, with `*` and `**` bounded (SEC6k2)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_RENDER_CHARS
                ):
                    raise _OverBudget(
                        f"`*` would build {len(seq) * n:,} items; the limit is {MAX_RENDER_CHARS:,}"
                    )
        power = operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1
        if power and right * abs(left).bit_length() > 4 * MAX_RENDER_CHARS:
            raise _OverBudget(f"`**` would build a number of more than {MAX_RENDER_CHARS:,} digits")
        return super().call_binop(context, operator, left, right)


_ENV = _Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


class _Clock:
    """A trace function that stops the template's own frames at the deadline (a Python thread cannot be
    interrupted from outside; a trace function runs inside the frame and can raise there)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.lines = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            return self.line if frame.f_code.co_filename == "<template>" else None
        return None

    def line(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.lines += 1
        if self.lines % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise _OverBudget(f"rendering took longer than {MAX_RENDER_SECONDS:g} seconds")
        return self.line


def _render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """Render within the budgets (`_OverBudget` past one)."""
    clock = _Clock(time.monotonic() + MAX_RENDER_SECONDS)
    previous = sys.gettrace()
    parts: list[str] = []
    size = 0
    sys.settrace(clock)
    try:
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise _OverBudget(f"the output grew past {MAX_RENDER_CHARS:,} characters")
            parts.append(chunk)
    finally:
        sys.settrace(previous)
    return "".join(parts)


def _first_line(doc: YamlDocument) -> int:
    """The file line of the template's first line (a block scalar starts on the line after `|`)."""
    line = doc.line(["instructions"])
    root = doc.root
    if isinstance(root, yaml.MappingNode):
        for k, v in root.value:
            if (
                isinstance(k, yaml.ScalarNode)
                and k.value == "instructions"
                and isinstance(v, yaml.ScalarNode)
            ):
                return line + 1 if v.style in ("|", ">") else line
    return line


def compile_instructions(definition: AgentDefinition, doc: YamlDocument) -> None:
    """Parse the instructions template; a syntax error names the file line it is on."""
    first = _first_line(doc)
    definition._instructions_line = first
    try:
        definition._template = _ENV.from_string(definition.instructions)
    except jinja2.TemplateSyntaxError as e:
        line = first + max((e.lineno or 1) - 1, 0)
        raise DefinitionError(
            f"instructions: template syntax error: {e.message}", path=str(doc.path), line=line
        ) from None


def render_instructions(definition: AgentDefinition, context: dict[str, Any]) -> str:
    """Render the instructions with `context`; undefined names and sandbox violations are
    `DefinitionError`s naming the definition's file and line."""
    template = definition._template
    if template is None:
        try:
            template = definition._template = _ENV.from_string(definition.instructions)
        except jinja2.TemplateSyntaxError as e:
            raise DefinitionError(f"instructions: template syntax error: {e.message}") from None
    path = str(definition.source) if definition.source is not None else None
    try:
        return _render(template, context)
    except _OverBudget as e:
        raise DefinitionError(
            f"instructions: the template went past its render budget: {e}",
            path=path,
            line=definition._instructions_line + _template_line(e) if path else None,
        ) from None
    except jinja2.UndefinedError as e:
        raise DefinitionError(
            f"instructions: {e.message} (the template sees agent, tools, sub_agents and data)",
            path=path,
            line=definition._instructions_line + _template_line(e) if path else None,
        ) from None
    except jinja2.TemplateError as e:
        raise DefinitionError(
            f"instructions: {e}", path=path, line=definition._instructions_line + _template_line(e)
        ) from None
    except Exception as e:
        raise DefinitionError(
            f"instructions: rendering failed: {type(e).__name__}: {e}",
            path=path,
            line=definition._instructions_line,
        ) from None


def _template_line(error: BaseException) -> int:
    """0-based line of the template where a render error happened (Jinja marks template frames)."""
    tb = error.__traceback__
    line = 0
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = max(tb.tb_lineno - 1, 0)
        tb = tb.tb_next
    return line
