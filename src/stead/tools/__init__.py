"""Tools: the `@stead.tool` decorator, tool context and call-bound KV."""

from stead.tools._tool import (
    IN_DOUBT,
    RUN_AGAIN,
    Reconciliation,
    Tool,
    ToolArgumentError,
    render_output,
    tool,
)
from stead.tools.context import CallKV, ToolContext

__all__ = [
    "IN_DOUBT",
    "RUN_AGAIN",
    "CallKV",
    "Reconciliation",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "render_output",
    "tool",
]
