"""What agents built from definitions keep in `AgentConfig.extra`, and reading it back (shared by the
orchestrator, its hooks and the flow support, so none imports another for it)."""

from __future__ import annotations

from stead.extend import AgentConfig

__all__ = [
    "PARENT_KEY",
    "X_CHAIN",
    "X_DATA",
    "X_DEFINITION",
    "X_LIMITS",
    "X_MCP",
    "X_MEMORY",
    "X_PERMISSIONS",
    "X_SUB_AGENTS",
    "X_TOOLS",
    "base_lists",
    "chain_of",
]

# AgentConfig.extra keys of agents built from definitions
X_DEFINITION = "stead.definition"
X_CHAIN = "stead.chain"  # definition names from the root of the delegation tree to this agent
X_DATA = "stead.data"
X_TOOLS = "stead.tools"  # the agent's own tools (before the runtime changes of a run)
X_SUB_AGENTS = "stead.sub_agents"  # its own sub-agents (ditto)
X_LIMITS = "stead.limits"
X_MEMORY = "stead.memory"  # the definition's `memory:` section (stead.memory.AgentMemory)
X_PERMISSIONS = "stead.permissions"  # allow / ask / deny rules (stead.policy)
X_MCP = "stead.mcp"  # the MCP servers whose tools the agent is offered (stead.mcp)

PARENT_KEY = "stead.parent"


def chain_of(config: AgentConfig) -> list[str]:
    """The delegation chain of an agent: root → … → this agent (a root agent is a chain of one)."""
    chain = config.extra.get(X_CHAIN)
    if isinstance(chain, list) and all(isinstance(c, str) for c in chain) and chain:
        return list(chain)
    return [str(config.extra.get(X_DEFINITION) or config.name or "agent")]


def base_lists(config: AgentConfig) -> tuple[list[str], list[str]]:
    """An agent's own (tools, sub-agents), before the runtime changes of a run."""
    tools = config.extra.get(X_TOOLS)
    subs = config.extra.get(X_SUB_AGENTS)
    if isinstance(tools, list) and isinstance(subs, list):
        return [str(t) for t in tools], [str(s) for s in subs]
    return list(config.tools), []
