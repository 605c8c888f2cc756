"""MCP tools (docs/mcp.md)."""
