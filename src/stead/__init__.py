"""stead: durable, observable, multi-agent LLM agents.

Public tiers: `stead` (daily use), `stead.extend` (for plugin authors: Plugin, Hooks, Store/Tx, record_step),
`stead.testing` (scripted models, fault injection). Everything else is implementation.

Package layout (each layer depends only on those above it in this list; docs/architecture.md and README's
"Layout" name every module):
    _ids, errors, messages   ids, the error hierarchy, messages and content blocks
    _tokens, _runs, _steps   token estimates; run/step data; the run-record seam (`stead.extend.record_step`)
    store/                   the Store contract, its SQLite and PostgreSQL implementations, fault injection
    providers/               the provider protocol, the scripted provider, real drivers, the catalog
    tools/                   @stead.tool, tool context, call-bound KV
    core/                    the kernel: the durable loop of one agent (knows nothing above it)
    agent, system            the Agent handle and AgentSystem (plugins, opening, restoring, closing)
    extend, testing          the tiers for plugin authors and for tests (below every plugin)
    --- plugins, siblings that import only the tiers above and the public face of a plugin they declare:
        observability/, flows/, mcp/, memory/, policy/, definitions/ (→ flows, mcp),
        orchestration/ (→ definitions, flows), realtime/ (→ definitions, orchestration), server/ ---
    _open                    `stead.open`: keyword shortcuts → built-in plugins
    cli/                     the `stead` command
"""

import inspect as _inspect

from stead._approvals import Approval, Decision
from stead._changes import RuntimeChange
from stead._open import open
from stead._runs import Run, Step
from stead.agent import Acceptance, Agent, Input
from stead.core.config import ContextPolicy, RetryPolicy
from stead.core.events import (
    Activated,
    ApprovalDecided,
    ApprovalRequested,
    BlockReset,
    Compacted,
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
    CompactionFailed,
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
from stead.providers.base import (
    BlockEnd,
    Done,
    ModelOptions,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
    UsageEvent,
)
from stead.system import AgentInfo, AgentSystem, Plugin
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
    "Approval",
    "ApprovalDecided",
    "ApprovalRequested",
    "Block",
    "BlockEnd",
    "BlockReset",
    "CallKV",
    "CloseFromInside",
    "Closed",
    "Compacted",
    "CompactionFailed",
    "ConfigurationError",
    "ContextPolicy",
    "Decision",
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
    "ModelOptions",
    "NotFound",
    "Outcome",
    "Plugin",
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

# Each public name reports its tier (`stead`), as httpx does: help(), reprs and docs show the name to import.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or _inspect.isfunction(_obj):
        _obj.__module__ = "stead"
del _name, _obj, _inspect
