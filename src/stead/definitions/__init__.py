"""Agent definitions: the YAML schema (`AgentDefinition`), its loader with `file:line:` errors, registries
of definitions that reference each other, and the instructions template.

from stead.definitions import load_definition, load_registry
definition = load_definition("examples/calculator/agent.yaml")
team = load_registry("examples/team")
"""

from stead.definitions._loader import import_tool, load_definition, load_registry
from stead.definitions._registry import Registry
from stead.definitions._schema import AgentDefinition, Limits, NarrationSettings, RealtimeSettings
from stead.definitions._template import render_instructions
from stead.extend import DefinitionError

__all__ = [
    "AgentDefinition",
    "DefinitionError",
    "Limits",
    "NarrationSettings",
    "RealtimeSettings",
    "Registry",
    "import_tool",
    "load_definition",
    "load_registry",
    "render_instructions",
]
