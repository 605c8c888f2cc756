"""Public tiers (issue 8): `stead` (daily use), `stead.extend` (plugin authors), `stead.testing` (scripted
models, fault injection). Each tier's `__all__` is pinned and also derived from the module, so an accidental
new public name fails; each public class and function reports its tier as `__module__`; `import stead`
stays light."""

from __future__ import annotations

import inspect
import subprocess
import sys
from types import ModuleType

import pytest

import stead
import stead.extend
import stead.testing

EXTEND = [
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
TESTING = [
    "Faults",
    "ScriptedProvider",
    "ScriptedResponse",
    "StoreCrashed",
    "check_store",
    "load_scripted_model",
]
TIERS = [stead, stead.extend, stead.testing]


def public_names(module: ModuleType) -> set[str]:
    """What a module actually exposes: every name not starting with `_` that is not a submodule."""
    return {n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)}


def test_extend_and_testing_are_pinned() -> None:
    assert stead.extend.__all__ == EXTEND
    assert stead.testing.__all__ == TESTING


@pytest.mark.parametrize("tier", TIERS, ids=lambda m: m.__name__)
def test_all_is_what_the_module_exposes(tier: ModuleType) -> None:
    assert public_names(tier) == {n for n in tier.__all__ if not n.startswith("_")}


@pytest.mark.parametrize("tier", TIERS, ids=lambda m: m.__name__)
def test_each_public_name_reports_its_tier(tier: ModuleType) -> None:
    for name in tier.__all__:
        obj = getattr(tier, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        expected = "stead" if name in stead.__all__ else tier.__name__
        assert obj.__module__ == expected, f"{tier.__name__}.{name} reports {obj.__module__}"


def test_shared_names_are_the_same_objects() -> None:
    for name in set(stead.__all__) & set(stead.extend.__all__):
        assert getattr(stead, name) is getattr(stead.extend, name)
    assert stead.testing.StoreCrashed is stead.StoreCrashed


def test_import_stead_is_light() -> None:
    code = (
        "import sys, stead\n"
        "heavy = [m for m in ('jinja2', 'stead.definitions', 'stead.orchestration') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
