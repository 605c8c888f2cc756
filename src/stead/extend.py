"""`stead.extend`: the tier for plugin authors — everything a layer above the kernel builds on.

    from stead.extend import Plugin, Hooks, HookContext, Tx, record_step

A plugin (`Plugin`) contributes tools, providers, hooks, per-dialect migrations, inbound-message validators
and a start/close lifecycle (see docs/architecture.md, "The plugin seam"). Hooks receive a `HookContext`
(and, for `*_tx` hooks, the open transaction `ctx.tx`, a `Tx` of the system's `Store`): a plugin's own rows
are written there, so they commit exactly when the change they describe does. `record_step` adds a step to
a run's record in that same transaction (a no-op when run records are off); `update_step` changes it;
`record_run` / `end_run` open and close the record of a run the kernel's loop does not drive (a realtime
session). Those go through `StepWriter`, the seam the records plugin binds (`bind_step_writer`).

Every built-in plugin (records, tracing, orchestration, definitions, flows, memory, approvals, MCP, realtime,
the HTTP service) imports only this module, `stead`, its own package and the public face of a plugin it
declares it builds on (`tests/test_import_graph.py` holds them to it). So the daily-use names (`Agent`,
`Message`, the errors, …) are here too, as the same objects as in `stead`: this module sits below every
plugin and never imports one.
"""

import inspect

from stead._approvals import Approval, ApprovalSource, ApprovalStatus, Decision
from stead._changes import CHANGES_KEY, RuntimeChange, decode_changes
from stead._ids import new_id
from stead._plugin import (
    STEP_TYPE_KEY,
    DefinitionSource,
    IncomingMessage,
    MemorySource,
    Migrations,
    RealtimeSessionHandle,
    RealtimeSource,
    TraceContextSource,
)
from stead._runs import Run, RunReader, Step, run_json, step_json
from stead._scope import AgentScope, page_query
from stead._steps import (
    PARENT_KEY,
    RUN_STATUSES,
    SESSION_KEY,
    STEP_TYPES,
    StepWriter,
    bind_step_writer,
    end_run,
    parent_link,
    record_guardrail,
    record_run,
    record_step,
    rename_step,
    step_writer,
    update_step,
)
from stead._yaml import YamlDocument, load_yaml_model, read_yaml
from stead.agent import Acceptance, Agent, Input, check_storable
from stead.core.config import PERMISSION_MODES, AgentConfig
from stead.core.events import BlockReset, Event, Settled, ToolFinished, ToolStarted
from stead.core.gate import Gate, call_gates
from stead.core.hooks import (
    AwaitingInputInfo,
    BeforeToolCallInfo,
    BlockInfo,
    CallDecidedInfo,
    CompactionInfo,
    GateCallInfo,
    HookContext,
    Hooks,
    InstructionsInfo,
    MessageConsumedInfo,
    ModelChangedInfo,
    OfferedToolsInfo,
    PermissionModeChangedInfo,
    ResponseInfo,
    RunContext,
    SettledInfo,
    ToolDispatchedInfo,
    ToolOutputInfo,
    ToolResultInfo,
)
from stead.core.outcome import Outcome
from stead.core.records import PAYLOAD as RUN_PAYLOAD_KEY
from stead.core.records import PAYLOAD_METADATA as PAYLOAD_METADATA_KEY
from stead.core.records import (
    BlockRecord,
    CompactionRecord,
    EndRecord,
    HistoryRecord,
    InputRecord,
    NoteRecord,
    OtherRecord,
    ResultRecord,
    decode_record,
)
from stead.core.results import RunResult
from stead.core.structured import answer_errors, parse_answer, schema_problem
from stead.errors import (
    AgentNotFound,
    Closed,
    ConfigurationError,
    DefinitionError,
    InvalidInput,
    NotFound,
    ProviderError,
    ReadOnly,
    RunNotFound,
    SteadError,
    StoreError,
)
from stead.messages import (
    Block,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    Usage,
    block_json,
    dumps,
    encode_block,
    message_json,
    usage_json,
)
from stead.providers._options import SUPPORTED as SUPPORTED_MODEL_OPTIONS
from stead.providers._options import OptionError, check_model_options, unsupported_options
from stead.providers.base import (
    BlockEnd,
    Done,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolSpec,
    UsageEvent,
)
from stead.providers.catalog import Prices, Route, load_catalog, parse_model
from stead.providers.router import parse_spec
from stead.providers.scripted_file import (
    ScriptedFileOf,
    ScriptedReply,
    ScriptedRuleOf,
    ScriptedToolCall,
    ScriptedWhen,
)
from stead.store.base import AgentRow, Capabilities, FleetLease, OwnerNotify, Store, StoreClass, Tx
from stead.system import AgentSystem, Plugin
from stead.tools import CallKV, Tool, ToolContext, tool
from stead.tools._tool import ToolArgumentError, render_output

__all__ = [
    "CHANGES_KEY",
    "PARENT_KEY",
    "PAYLOAD_METADATA_KEY",
    "PERMISSION_MODES",
    "RUN_PAYLOAD_KEY",
    "RUN_STATUSES",
    "SESSION_KEY",
    "STEP_TYPES",
    "STEP_TYPE_KEY",
    "SUPPORTED_MODEL_OPTIONS",
    "Acceptance",
    "Agent",
    "AgentConfig",
    "AgentNotFound",
    "AgentRow",
    "AgentScope",
    "AgentSystem",
    "Approval",
    "ApprovalSource",
    "ApprovalStatus",
    "AwaitingInputInfo",
    "BeforeToolCallInfo",
    "Block",
    "BlockEnd",
    "BlockInfo",
    "BlockRecord",
    "BlockReset",
    "CallDecidedInfo",
    "CallKV",
    "Capabilities",
    "Closed",
    "CompactionInfo",
    "CompactionRecord",
    "ConfigurationError",
    "Decision",
    "DefinitionError",
    "DefinitionSource",
    "Done",
    "EndRecord",
    "Event",
    "FleetLease",
    "Gate",
    "GateCallInfo",
    "HistoryRecord",
    "HookContext",
    "Hooks",
    "IncomingMessage",
    "Input",
    "InputRecord",
    "InstructionsInfo",
    "InvalidInput",
    "MemorySource",
    "Message",
    "MessageConsumedInfo",
    "Migrations",
    "ModelChangedInfo",
    "NotFound",
    "NoteRecord",
    "OfferedToolsInfo",
    "OptionError",
    "OtherRecord",
    "Outcome",
    "OwnerNotify",
    "PermissionModeChangedInfo",
    "Plugin",
    "Prices",
    "Provider",
    "ProviderError",
    "ProviderRequest",
    "ReadOnly",
    "RealtimeSessionHandle",
    "RealtimeSource",
    "Reasoning",
    "ReasoningDelta",
    "ResponseInfo",
    "ResultRecord",
    "Route",
    "Run",
    "RunContext",
    "RunNotFound",
    "RunReader",
    "RunResult",
    "RuntimeChange",
    "ScriptedFileOf",
    "ScriptedReply",
    "ScriptedRuleOf",
    "ScriptedToolCall",
    "ScriptedWhen",
    "Settled",
    "SettledInfo",
    "SteadError",
    "Step",
    "StepWriter",
    "Store",
    "StoreClass",
    "StoreError",
    "StreamEvent",
    "Text",
    "TextDelta",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolContext",
    "ToolDispatchedInfo",
    "ToolFinished",
    "ToolOutputInfo",
    "ToolResult",
    "ToolResultInfo",
    "ToolSpec",
    "ToolStarted",
    "TraceContextSource",
    "Tx",
    "Usage",
    "UsageEvent",
    "YamlDocument",
    "answer_errors",
    "bind_step_writer",
    "block_json",
    "call_gates",
    "check_model_options",
    "check_storable",
    "decode_changes",
    "decode_record",
    "dumps",
    "encode_block",
    "end_run",
    "load_catalog",
    "load_yaml_model",
    "message_json",
    "new_id",
    "page_query",
    "parent_link",
    "parse_answer",
    "parse_model",
    "parse_spec",
    "read_yaml",
    "record_guardrail",
    "record_run",
    "record_step",
    "rename_step",
    "render_output",
    "run_json",
    "schema_problem",
    "step_json",
    "step_writer",
    "tool",
    "unsupported_options",
    "update_step",
    "usage_json",
]

# Each public name reports the most public tier that exports it: the daily-use ones already say `stead`
# (`stead/__init__` runs before this module and marks its own; this module must not import it, or the
# plugins `_open.py` loads would close a cycle through it).
for _name in __all__:
    _obj = globals()[_name]
    if (isinstance(_obj, type) or inspect.isfunction(_obj)) and _obj.__module__ != "stead":
        _obj.__module__ = "stead.extend"
del _name, _obj
