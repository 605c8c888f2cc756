"""The `stead` command (docs/cli.md): run definitions, chat with agents, inspect the database.

stead run examples/calculator/agent.yaml "What is (2+3)*4?"
stead chat examples/team orchestrator
stead agents                      # read-only: works while another process runs agents
stead history AGENT_ID [--json]
stead runs [show RUN_ID]
"""

from stead.cli._app import app, main

__all__ = ["app", "main"]
