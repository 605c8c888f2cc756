"""MCP tools: Model Context Protocol servers' tools as stead tools (docs/mcp.md). Needs `stead[mcp]`.

    system = await stead.open(url, mcp=[{"name": "time", "command": "mcp-server-time"}])
    agent = await system.create(model=..., tools=["time__get_current_time"])

or, in a definition, `mcp: [{name: time, command: mcp-server-time, trust_annotations: true}]` offers every
tool of the server to that agent. Importing this package does not import the SDK.
"""

from stead.mcp._config import McpServer, ToolOverride
from stead.mcp._plugin import MCP_KEY, McpPlugin, McpTool, McpToolError, flags_for, tool_name

__all__ = [
    "MCP_KEY",
    "McpPlugin",
    "McpServer",
    "McpTool",
    "McpToolError",
    "ToolOverride",
    "flags_for",
    "tool_name",
]
