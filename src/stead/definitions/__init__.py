"""Agent definitions: the YAML schema (`AgentDefinition`) and its loader with `file:line:` errors.

from stead.definitions import load_definition
definition = load_definition("examples/calculator/agent.yaml")
"""

from stead.definitions._loader import import_tool, load_definition, make_provider
from stead.definitions._schema import KNOWN_PROVIDERS, AgentDefinition, parse_model
from stead.errors import DefinitionError

__all__ = [
    "KNOWN_PROVIDERS",
    "AgentDefinition",
    "DefinitionError",
    "import_tool",
    "load_definition",
    "make_provider",
    "parse_model",
]
