"""Observability (docs/observability.md): run records (`runs`, `run_steps`, the `prompt_runs` view) and
OpenTelemetry spans.

`RunRecorder` writes the records through the kernel's hooks (installed by `stead.open(records=True)`, the
default); `stead.Run` / `stead.Step` read them back (`system.runs()`, `system.run(id)`). `TracingHooks`
(`stead.observability.tracing`, needs `opentelemetry-api`) emits GenAI spans; it is imported lazily so the
records work without OpenTelemetry installed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from stead.extend import PARENT_KEY, SESSION_KEY, parent_link, record_guardrail, record_step
from stead.observability.queries import Run, Step, get_run, list_runs
from stead.observability.records import RunRecorder

if TYPE_CHECKING:
    from stead.observability.tracing import TracingHooks

__all__ = [
    "PARENT_KEY",
    "SESSION_KEY",
    "Run",
    "RunRecorder",
    "Step",
    "TracingHooks",
    "get_run",
    "list_runs",
    "parent_link",
    "record_guardrail",
    "record_step",
    "traceparent_for_call",
]


def traceparent_for_call(call_id: str) -> str | None:
    """The W3C traceparent of the `execute_tool` span of a running tool call, for the child run's
    `metadata["stead.parent"]["traceparent"]`; None when tracing is off (never imports OpenTelemetry)."""
    tracing = sys.modules.get("stead.observability.tracing")
    if tracing is None:
        return None
    result: str | None = tracing.traceparent_for_call(call_id)
    return result


def __getattr__(name: str) -> Any:
    if name == "TracingHooks":
        from stead.observability.tracing import TracingHooks

        return TracingHooks
    raise AttributeError(f"module 'stead.observability' has no attribute {name!r}")
