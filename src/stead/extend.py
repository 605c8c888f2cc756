"""`stead.extend`: the tier for plugin authors — everything a layer above the kernel builds on.

    import stead
    from stead.extend import Plugin, Hooks, HookContext, record_step

A plugin (`Plugin`) contributes tools, providers, hooks, per-dialect migrations, inbound-message validators
and a start/close lifecycle (see docs/architecture.md, "The plugin seam"). Hooks receive a `HookContext`
(and, for `*_tx` hooks, the open transaction `ctx.tx`, a `Tx` of the system's `Store`): a plugin's own rows
are written there, so they commit exactly when the change they describe does. `record_step` adds a step to
a run's record in that same transaction (a no-op when run records are off); `update_step` changes it;
`record_run` / `end_run` open and close the record of a run the kernel's loop does not drive (a realtime
session).

Daily-use names (`stead.Plugin`, `stead.Hooks`, …) are the same objects as here.
"""

import inspect

from stead._approvals import ApprovalSource
from stead._plugin import (
    STEP_TYPE_KEY,
    DefinitionSource,
    IncomingMessage,
    Migrations,
    TraceContextSource,
)
from stead._runs import RunReader
from stead.core.config import AgentConfig
from stead.core.gate import Gate
from stead.core.hooks import CompactionInfo, HookContext, Hooks, ResponseInfo, RunContext
from stead.observability.records import end_run, record_run, record_step, update_step
from stead.store.base import AgentRow, Store, Tx
from stead.system import Plugin

__all__ = [
    "STEP_TYPE_KEY",
    "AgentConfig",
    "AgentRow",
    "ApprovalSource",
    "CompactionInfo",
    "DefinitionSource",
    "Gate",
    "HookContext",
    "Hooks",
    "IncomingMessage",
    "Migrations",
    "Plugin",
    "ResponseInfo",
    "RunContext",
    "RunReader",
    "Store",
    "TraceContextSource",
    "Tx",
    "end_run",
    "record_run",
    "record_step",
    "update_step",
]

# Each public name reports the most public tier that exports it (`stead` for the daily-use ones).
_DAILY = {"HookContext", "Hooks", "Plugin", "ResponseInfo"}
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or inspect.isfunction(_obj):
        _obj.__module__ = "stead" if _name in _DAILY else "stead.extend"
del _name, _obj
