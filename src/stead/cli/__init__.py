"""The `stead` command (DESIGN §11): run definitions, list agents, show histories.

stead run examples/calculator/agent.yaml "What is (2+3)*4?"
stead agents
stead history AGENT_ID [--json]
"""

from stead.cli._app import app, main

__all__ = ["app", "main"]
