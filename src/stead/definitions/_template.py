"""Instructions are Jinja2 templates, rendered in a sandbox with undefined names as errors.

Syntax errors are found when the definition loads; an undefined variable is found when an agent is created
(the data is known only then). Both become `DefinitionError`s pointing at the template's line in the file.
"""

from __future__ import annotations

from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from stead._yaml import YamlDocument
from stead.definitions._schema import AgentDefinition
from stead.errors import DefinitionError

__all__ = ["compile_instructions", "render_instructions"]

_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


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
        return str(template.render(**context))
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
