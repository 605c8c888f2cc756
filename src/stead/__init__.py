"""stead: durable, observable, multi-agent LLM agents.

Package layout (each layer depends only on those above it in this list):
    _ids, errors, messages   ids, the error hierarchy, messages and content blocks
    store/                   the Store contract and its SQLite implementation (+ fault injection)
    providers/               the provider protocol, the scripted provider, real drivers
    tools/                   @stead.tool, tool context, call-bound KV
    core/                    the kernel: the durable loop of one agent (knows nothing above it)
    agent, system            the Agent handle and AgentSystem (opening, restoring, closing)
    definitions/, cli/       agent definition files and the `stead` command
"""

from stead.agent import Acceptance, Agent, Input
from stead.core.config import RetryPolicy
from stead.core.events import (
    Activated,
    BlockReset,
    Event,
    MessageConsumed,
    Settled,
    ToolFinished,
    ToolStarted,
)
from stead.core.hooks import HookContext, Hooks, ResponseInfo
from stead.core.outcome import Outcome
from stead.core.results import RunResult
from stead.errors import (
    AgentNotFound,
    Closed,
    CloseFromInside,
    ConfigurationError,
    DefinitionError,
    InvalidId,
    InvalidInput,
    NotFound,
    ProviderError,
    RunFailed,
    RunNotFound,
    SchemaTooNew,
    SteadError,
    StoreCrashed,
    StoreError,
    StoreLocked,
)
from stead.messages import Block, Message, Reasoning, Text, ToolCall, ToolResult, Usage
from stead.observability import Run, Step
from stead.orchestration import RuntimeChange
from stead.providers.base import (
    BlockEnd,
    Done,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
    UsageEvent,
)
from stead.system import AgentInfo, AgentSystem, open
from stead.tools import IN_DOUBT, RUN_AGAIN, CallKV, Tool, ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "IN_DOUBT",
    "RUN_AGAIN",
    "Acceptance",
    "Activated",
    "Agent",
    "AgentInfo",
    "AgentNotFound",
    "AgentSystem",
    "Block",
    "BlockEnd",
    "BlockReset",
    "CallKV",
    "CloseFromInside",
    "Closed",
    "ConfigurationError",
    "DefinitionError",
    "Done",
    "Event",
    "HookContext",
    "Hooks",
    "Input",
    "InvalidId",
    "InvalidInput",
    "Message",
    "MessageConsumed",
    "NotFound",
    "Outcome",
    "Provider",
    "ProviderError",
    "ProviderRequest",
    "Reasoning",
    "ReasoningDelta",
    "ResponseInfo",
    "RetryPolicy",
    "Run",
    "RunFailed",
    "RunNotFound",
    "RunResult",
    "RuntimeChange",
    "SchemaTooNew",
    "Settled",
    "SteadError",
    "Step",
    "StoreCrashed",
    "StoreError",
    "StoreLocked",
    "Text",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolFinished",
    "ToolResult",
    "ToolSpec",
    "ToolStarted",
    "Usage",
    "UsageEvent",
    "__version__",
    "open",
    "tool",
]
