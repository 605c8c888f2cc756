"""Hooks: the seams through which higher layers (and users) extend the kernel.

Transactional hooks (`*_tx`) run inside the transaction whose change they describe; raising rolls that
transaction back (a failing `activated_tx` refuses the message, A4). Observing hooks run after commit and
can never fail a run: their exceptions are logged and swallowed. Subclass `Hooks` and override what you need;
several hook objects compose in order. A hook takes `(ctx)` or `(ctx, info)` — one frozen info object per
hook (`SettledInfo`, `ToolResultInfo`, …), so a seam grows by a field, never by a positional argument.

Each hook is declared once, in `HOOKS` (a `HookSpec` each): `HookSet`'s dispatch, its overridden-only index
and the docs' hook table (`hook_table()`) derive from it. An override still written with the positional
signature of before is adapted, with one `DeprecationWarning` per class and hook (`is_legacy`).

A hook nobody overrides costs nothing: `HookSet` indexes, once, which hook objects override which method,
dispatches only to those, and the kernel asks `hooks.wants(name)` before it builds a `HookContext` (or an
event, or an info object) for a seam nobody listens to.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import Any, ClassVar

from stead.core.events import Event
from stead.core.gate import Gate
from stead.core.outcome import Outcome
from stead.core.records import build_messages, end_record
from stead.core.results import RunResult, run_state
from stead.messages import Block, Message, ToolCall, ToolResult, Usage
from stead.store.base import Store, Tx
from stead.tools._tool import Tool

__all__ = [
    "HOOKS",
    "HOOK_METHODS",
    "AwaitingInputInfo",
    "BeforeToolCallInfo",
    "BlockInfo",
    "CallDecidedInfo",
    "CompactionInfo",
    "GateCallInfo",
    "HookContext",
    "HookSet",
    "HookSpec",
    "Hooks",
    "InstructionsInfo",
    "MessageConsumedInfo",
    "ModelChangedInfo",
    "OfferedToolsInfo",
    "PermissionModeChangedInfo",
    "ResponseInfo",
    "RunContext",
    "SettledInfo",
    "ToolDispatchedInfo",
    "ToolOutputInfo",
    "ToolResultInfo",
    "hook_table",
    "is_legacy",
    "overrides",
]

log = logging.getLogger("stead.hooks")


@dataclass
class HookContext:
    """What a hook sees: the agent, the current lifecycle ids, effective settings, and (for `*_tx` hooks)
    the open transaction."""

    agent_id: str
    agent_name: str | None
    store: Store
    run_id: str | None = None
    turn_id: str | None = None
    inference_id: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    tx: Tx | None = None
    restored: bool = False
    message: Message | None = None
    """In `activated_tx` on acceptance: the message whose acceptance activated the agent."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The agent's configuration extras (what higher layers stored at creation; read-only)."""
    outcome: Outcome | None = None
    """In `settled_tx` and `settled`: how the run ended."""
    user: str | None = None
    """The user of the run's first message (`agent.send(..., user=...)`), for the whole run."""
    tenant: str | None = None
    """The tenant of the run's first message, for the whole run."""

    @property
    def permission_mode(self) -> str:
        return str(self.settings.get("permission_mode", "auto"))


@dataclass(frozen=True)
class RunContext:
    """Context a plugin adds to every request of one run (the `run_context` hook's answer).

    The kernel sends `text` as one system message right after the instructions, ahead of the history, in
    every inference of the run. It asks the hooks once per run, before the run's first inference and
    outside any transaction (a hook may search, embed, call out), and makes the answer durable in run KV
    with the turn's first durable write — so the live process and a restarted one send exactly the same
    context (R4), and later inferences of the run never ask again. `data` is durable with it (ids of what
    was injected, for records); the prompt step's hooks see both in `ResponseInfo.context`."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        return {"x": self.text, "d": self.data}

    @staticmethod
    def decode(raw: dict[str, Any]) -> RunContext:
        data = raw.get("d")
        return RunContext(str(raw.get("x", "")), dict(data) if isinstance(data, dict) else {})


@dataclass(frozen=True)
class ResponseInfo:
    """One finished inference, as told to `response_tx`."""

    inference_id: str
    provider: str
    model: str
    reason: str
    usage: Usage | None
    started_at: float
    first_token_at: float | None
    ended_at: float
    error: str | None = None
    purpose: str = "turn"
    """`turn` (the agent's own inference) or `compaction` (a summary request of a compaction, K1)."""

    model_call: bool = True
    """False when the provider answered without calling a model (`Done(model_call=False)`: a flow engine
    choosing its next step); run records and guardrails skip such responses."""

    context: RunContext | None = None
    """The run context the request carried (the `run_context` hooks' answer), if any."""


@dataclass(frozen=True)
class CompactionInfo:
    """One compaction (K1), as `before_compaction` / `compaction_tx` hooks and `agent.compact()` see it.

    `evicted` are the messages that leave the provider context (replaced by the summary); `kept` what the
    new history holds after the summary (shortened copies included). Tokens are estimates of the provider
    context before and after (`stead._tokens`). `passes` lists what was done, cheapest first: `stub`
    (old tool results cut to their first characters), `clamp` (records larger than a quarter of the window
    cut), `summary` (a model-written summary of the previous summary plus the evicted records, by the
    requests `summary_inference_ids`). `error` is set when the compaction failed (the history unchanged)."""

    id: str
    reason: str
    """`auto` (the next request would exceed window − reserve), `requested` (`agent.compact()`) or
    `overflow` (the provider said the context is too long)."""
    tokens_before: int
    tokens_after: int
    records_before: int
    records_after: int
    passes: tuple[str, ...] = ()
    evicted: tuple[Message, ...] = ()
    kept: tuple[Message, ...] = ()
    previous_summary: str | None = None
    summary: str | None = None
    summary_inference_ids: tuple[str, ...] = ()
    started_at: float = 0.0
    ended_at: float = 0.0
    error: str | None = None


# -- one info object per hook ---------------------------------------------------------------------------
# A hook gets `(ctx)` or `(ctx, info)`: what the hook is about travels in one frozen object, so a seam can
# grow a field without breaking any override. `ResponseInfo` and `CompactionInfo` (above) are of this kind.


@dataclass(frozen=True, slots=True)
class MessageConsumedInfo:
    """`message_consumed_tx`: a queued message entered history."""

    message: Message


@dataclass(frozen=True, slots=True)
class PermissionModeChangedInfo:
    """`permission_mode_changed_tx`: a consumed message changed the permission mode from `old` to `new`."""

    old: str
    new: str


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """`block_tx`: a completed assistant block being appended."""

    block: Block


@dataclass(frozen=True, slots=True)
class ToolDispatchedInfo:
    """`tool_dispatched_tx`: the batch of calls just made durable (before any of them runs)."""

    calls: Sequence[ToolCall]


@dataclass(frozen=True, slots=True)
class ToolResultInfo:
    """`tool_result_tx`: a call and the one result being committed for it (after the `tool_output`
    hooks: a replacement, if one made it)."""

    call: ToolCall
    result: ToolResult


@dataclass(frozen=True, slots=True)
class GateCallInfo:
    """`gate_call_tx`: a call of the batch being dispatched and the tool the run offers for it (None for a
    call it does not offer)."""

    call: ToolCall
    tool: Tool | None


@dataclass(frozen=True, slots=True)
class AwaitingInputInfo:
    """`awaiting_input_tx`: the calls of the batch held for a decision."""

    calls: Sequence[ToolCall]


@dataclass(frozen=True, slots=True)
class CallDecidedInfo:
    """`call_decided_tx`: a held call and its decision — `approved`, `rejected`, `expired` or `cancelled` —
    with the decider's note."""

    call: ToolCall
    decision: str
    note: str | None = None


def _no_records() -> list[dict[str, Any]]:
    return []


@dataclass(frozen=True)
class SettledInfo:
    """`settled_tx` and `settled`: how the run ended, and — computed on first use, from the history the
    kernel already holds (no read) — its result: `text` (the final assistant text), `messages`, `usage` and
    `result`, the same `RunResult` `agent.run` returns (without `output`, the typed answer, which only the
    caller's schema gives). `payload` is the run's payload as it ended (None when it had none)."""

    outcome: Outcome
    error: str | None = None
    """The run's failure (or "aborted") when it did not complete."""
    run_id: str = ""
    payload: dict[str, Any] | None = None
    _records: Callable[[], list[dict[str, Any]]] = field(default=_no_records, repr=False, compare=False)
    """The run's history records before its end record (the kernel's; read on first use)."""

    @cached_property
    def result(self) -> RunResult:
        """The run's result, as `agent.run` computes it from the committed history."""
        records = self._records()
        end = end_record(self.run_id, self.outcome, self.error, self.payload)
        first = next((r.get("id") for r in records if r.get("k") == "u"), None)
        if isinstance(first, str):
            state = run_state([*records, end], first)
            if state is not None and state.result is not None:
                return state.result
        # no input of the run is left in the history (a reset or a restart before it was consumed)
        messages = build_messages([r for r in records if r.get("k") != "c"])
        text = next((m.text for m in reversed(messages) if m.role == "assistant"), "")
        usages = [m.usage for m in messages if m.usage is not None]
        costs = [u.cost for u in usages if u.cost is not None]
        usage = Usage(
            sum(u.input_tokens for u in usages),
            sum(u.output_tokens for u in usages),
            sum(u.cached_tokens for u in usages),
            sum(costs) if costs else None,
            any(u.estimated for u in usages),
        )
        return RunResult(self.run_id, self.outcome, text, messages, usage, self.error, None, self.payload)

    @property
    def text(self) -> str:
        """The final assistant text (of the run's last assistant message; empty if it had none)."""
        return self.result.text

    @property
    def messages(self) -> list[Message]:
        """The run's messages, from its first consumed input to its last record."""
        return self.result.messages

    @property
    def usage(self) -> Usage:
        """Token usage summed over the run's responses."""
        return self.result.usage


@dataclass(frozen=True, slots=True)
class InstructionsInfo:
    """`instructions`: the instructions so far (the agent's configured ones, or the previous hook's)."""

    instructions: str


@dataclass(frozen=True, slots=True)
class ToolOutputInfo:
    """`tool_output`: a call and its result so far (the tool's, or the previous hook's replacement)."""

    call: ToolCall
    result: ToolResult


@dataclass(frozen=True, slots=True)
class OfferedToolsInfo:
    """`offered_tools`: the tool names offered so far (the agent's configured ones, or the previous
    hook's answer); a list the hook may return changed."""

    tools: list[str]


@dataclass(frozen=True, slots=True)
class ModelChangedInfo:
    """`model_changed`: the effective settings before and after the incompatible change (K2)."""

    old: dict[str, Any]
    new: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BeforeToolCallInfo:
    """`before_tool_call`: the call about to run."""

    call: ToolCall


class Hooks:
    """Override any of these. Every method is optional.

    `migrations` lets a layer that keeps its own tables declare them: module name → ordered SQL scripts,
    applied by `stead.open` before anything runs (see `stead.store.sqlite`)."""

    migrations: ClassVar[dict[str, list[str]]] = {}

    # -- transactional -----------------------------------------------------------------------------
    async def activated_tx(self, ctx: HookContext) -> None:
        """Work became owed (the pending record was created), or — with `ctx.restored` — the first stage
        after a restart of an active period."""

    async def message_consumed_tx(self, ctx: HookContext, info: MessageConsumedInfo) -> None:
        """A queued message (`info.message`) entered history (once per message, in order)."""

    async def permission_mode_changed_tx(self, ctx: HookContext, info: PermissionModeChangedInfo) -> None:
        """A consumed message changed the permission mode (`info.old` → `info.new`)."""

    async def block_tx(self, ctx: HookContext, info: BlockInfo) -> None:
        """A completed assistant block (`info.block`) is being appended."""

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        """An inference finished (any reason); runs in the transaction recording its end."""

    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        """A batch of calls (`info.calls`) was made durable (before any of them runs)."""

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        """A call's one result (`info.call`, `info.result`) is being committed."""

    async def gate_call_tx(self, ctx: HookContext, info: GateCallInfo) -> Gate | None:
        """A decision inside the transaction that dispatches the batch (T1), once per call, before its entry
        is written: `Gate.ask(reason, ref)` holds the call for a decision, `Gate.deny(text)` refuses it,
        None lets it run. `info.tool` is None for a call the run does not offer (it gets its T6 error result
        anyway). `ctx.settings` are those the consuming turn made effective (the permission mode, C3). The
        first non-None answer wins; a hook may write its own rows through `ctx.tx` (approval requests)."""
        return None

    async def awaiting_input_tx(self, ctx: HookContext, info: AwaitingInputInfo) -> None:
        """In the dispatch transaction, after `tool_dispatched_tx`: these calls of the batch (`info.calls`)
        are held for a decision, so the run will wait (its status becomes `awaiting_input`)."""

    async def call_decided_tx(self, ctx: HookContext, info: CallDecidedInfo) -> None:
        """A held call was decided, inside the deciding transaction: `approved` (it will run), or
        `rejected` / `expired` / `cancelled` (its error result commits in this transaction). Called for
        decisions the kernel makes too: a steered message rejects held calls, an abort cancels them."""

    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        """The active period ends: the pending record is being deleted. `info.outcome` (and `ctx.outcome`)
        says how the run ended; `info.error` is its failure (or "aborted") when it did not complete;
        `info.text` / `info.result` its final text and result."""

    async def agent_deleted_tx(self, ctx: HookContext) -> None:
        """`system.delete` is removing the agent (its row, keys and history) in `ctx.tx`: a layer that keeps
        rows about the agent deletes them here, so they go exactly when the agent does."""

    async def before_compaction(self, ctx: HookContext, info: CompactionInfo) -> None:
        """Transactional: a compaction is about to replace the history (K1). Runs inside the replacement
        transaction (`ctx.tx`), before the history is archived and rewritten, with every record that leaves
        the provider context in `info.evicted` — act on them here (e.g. extract facts into your own
        tables); raising rolls the whole replacement back (the compaction fails, nothing changes)."""

    async def compaction_tx(self, ctx: HookContext, info: CompactionInfo) -> None:
        """Transactional: a compaction ended — carried out (in its replacement transaction, after the
        history was replaced) or failed (`info.error`, in the transaction recording the failure)."""

    # -- decisions ---------------------------------------------------------------------------------
    async def instructions(self, ctx: HookContext, info: InstructionsInfo) -> str:
        """The system instructions of the next model request (default: the agent's configured ones). Layers
        render per-run state into them (a payload, a scratchpad); derive them from durable state only, so a
        restarted process sends the same request (R4). Hooks chain: each gets the previous one's text in
        `info.instructions`."""
        return info.instructions

    async def tool_output(self, ctx: HookContext, info: ToolOutputInfo) -> ToolResult:
        """A call's result, after the tool ran and before it commits: return `info.result`, or a replacement
        for the conversation (e.g. a reference to where a large output was stored). Hooks chain. The
        `tool_result_tx` hooks then see the replacement; keep what they need to store (the full output)
        meanwhile."""
        return info.result

    def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
        """The tool names offered to the model — and allowed to run — for this run (default: the agent's
        configured tools, `info.tools`). Called before each inference and each batch; must be cheap and not
        block. Hooks chain."""
        return info.tools

    async def model_changed(self, ctx: HookContext, info: ModelChangedInfo) -> str | None:
        """An incompatible settings change (`info.old` → `info.new`) is about to reset the conversation
        (K2). Return a handoff text to open the new conversation with (a system message), or None. The first
        non-None answer wins."""
        return None

    async def before_inference(self, ctx: HookContext) -> str | None:
        """Return a reason to end the run as failed instead of calling the model (guardrails), or None.
        The reason is recorded like a failed turn and the run settles; queued messages stay queued."""
        return None

    async def before_tool_call(self, ctx: HookContext, info: BeforeToolCallInfo) -> ToolResult | None:
        """Return a result to answer the call (`info.call`) without running it (policy, approvals), or None
        to run it. The first non-None answer wins."""
        return None

    async def run_context(self, ctx: HookContext) -> RunContext | None:
        """Context for every request of this run: one system message after the instructions (memory
        notes, retrieved passages). Asked before the run's first inference, outside any transaction;
        `ctx.message` is the first message that inference consumes, `ctx.user`/`ctx.tenant` the run's.
        The answer is made durable and reused for the rest of the run (see `RunContext`). Return None when
        this hook has nothing for this agent at all (it is then asked again at the next inference, so that
        answer must not depend on anything that changes during a run); return `RunContext("")` for "nothing
        this run"."""
        return None

    # -- observing ---------------------------------------------------------------------------------
    async def settled(self, ctx: HookContext, info: SettledInfo) -> None:
        """After the settlement committed and the loop stopped (the same `info` as `settled_tx`'s)."""

    def on_event(self, agent_id: str, event: Event) -> None:
        """Every event, live. Must not block."""


# -- the table: each hook declared once ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HookSpec:
    """One hook, as `HookSet` dispatches it and docs/architecture.md lists it (`hook_table()`).

    `combine` says how several overriding hook objects compose: `each` (in order; the first failure
    propagates), `first` (the first non-None answer wins), `chain` (each gets the previous answer in the
    info's `chains` field), `merge` (`run_context`), `observe` / `events` (every one, failures logged and
    ignored). `legacy` names the positional arguments the hook took before it took `info` (each is the info
    field of that name): an override still written that way is adapted, with a `DeprecationWarning`."""

    name: str
    kind: str
    """`transactional` (inside the kernel's transaction), `decision` or `observing`."""
    combine: str
    info: type | None
    """The info object after `ctx` (None: the hook takes `ctx` only — or, `on_event`, `(agent_id, event)`)."""
    returns: str
    doc: str
    legacy: tuple[str, ...] = ()
    chains: str = ""
    sync: bool = False

    @property
    def params(self) -> str:
        if self.combine == "events":
            return "agent_id, event"
        return "ctx" if self.info is None else f"ctx, info: {self.info.__name__}"

    @property
    def signature(self) -> str:
        """The override to write (for `settled_tx`:
        `async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None`)."""
        if self.combine == "events":
            params = "agent_id: str, event: Event"
        else:
            params = self.params.replace("ctx", "ctx: HookContext", 1)
        return f"{'' if self.sync else 'async '}def {self.name}(self, {params}) -> {self.returns}"


_TX, _DECISION, _OBSERVING = "transactional", "decision", "observing"

# fmt: off
HOOKS: tuple[HookSpec, ...] = (
    HookSpec("activated_tx", _TX, "each", None, "None",
             "work became owed (or, with `ctx.restored`, the first stage after a restart): run records, "
             "spans, counters"),
    HookSpec("message_consumed_tx", _TX, "each", MessageConsumedInfo, "None",
             "a queued message entered history: ledgers, durable events", ("message",)),
    HookSpec("permission_mode_changed_tx", _TX, "each", PermissionModeChangedInfo, "None",
             "a consumed message changed the permission mode", ("old", "new")),
    HookSpec("block_tx", _TX, "each", BlockInfo, "None",
             "a completed assistant block is appended: a run's final text, durable events", ("block",)),
    HookSpec("response_tx", _TX, "each", ResponseInfo, "None",
             "an inference ended (any reason): prompt steps, usage, guardrail counters"),
    HookSpec("tool_dispatched_tx", _TX, "each", ToolDispatchedInfo, "None",
             "a batch of calls was made durable: tool steps, call limits", ("calls",)),
    HookSpec("tool_result_tx", _TX, "each", ToolResultInfo, "None",
             "a call's one result commits: step results, artifacts, taint", ("call", "result")),
    HookSpec("gate_call_tx", _DECISION, "first", GateCallInfo, "Gate | None",
             "in the dispatch transaction, policies and approvals: hold a call (`Gate.ask`) or refuse it "
             "(`Gate.deny`) before its batch entry is written", ("call", "tool")),
    HookSpec("awaiting_input_tx", _TX, "each", AwaitingInputInfo, "None",
             "the batch holds calls for a decision: the run waits", ("calls",)),
    HookSpec("call_decided_tx", _TX, "each", CallDecidedInfo, "None",
             "a held call was decided (also by a steer or an abort)", ("call", "decision", "note")),
    HookSpec("settled_tx", _TX, "each", SettledInfo, "None",
             "the run ends (`info.outcome`, `info.text`, `info.result`): close run records, outboxes",
             ("error",)),
    HookSpec("agent_deleted_tx", _TX, "each", None, "None",
             "`system.delete` removes the agent: a layer's rows about it go with it"),
    HookSpec("before_compaction", _TX, "each", CompactionInfo, "None",
             "a compaction is about to replace the history: act on the evicted records (memory)"),
    HookSpec("compaction_tx", _TX, "each", CompactionInfo, "None",
             "a compaction ended (or failed): the `compaction` step"),
    HookSpec("instructions", _DECISION, "chain", InstructionsInfo, "str",
             "the instructions of the next model request (per-run templates: payload, scratchpad; "
             "docs/flows.md)", ("instructions",), chains="instructions"),
    HookSpec("tool_output", _DECISION, "chain", ToolOutputInfo, "ToolResult",
             "replace a call's result before it commits (large outputs stored as artifacts)",
             ("call", "result"), chains="result"),
    HookSpec("offered_tools", _DECISION, "chain", OfferedToolsInfo, "list[str]",
             "the tools a run offers and allows (runtime changes with scopes, MCP servers, memory); sync "
             "and cheap", ("tools",), chains="tools", sync=True),
    HookSpec("model_changed", _DECISION, "first", ModelChangedInfo, "str | None",
             "the handoff message that opens a reset conversation (K2)", ("old", "new")),
    HookSpec("before_inference", _DECISION, "first", None, "str | None",
             "guardrails: a reason ends the run failed before the model is called"),
    HookSpec("before_tool_call", _DECISION, "first", BeforeToolCallInfo, "ToolResult | None",
             "per-tool call limits, answers without running", ("call",)),
    HookSpec("run_context", _DECISION, "merge", None, "RunContext | None",
             "outside any transaction: one system message after the instructions for every request of a "
             "run (memory); asked once per run, made durable in run KV"),
    HookSpec("settled", _OBSERVING, "observe", SettledInfo, "None",
             "after the settlement committed: spans, progress, notifications", ("error",)),
    HookSpec("on_event", _OBSERVING, "events", None, "None",
             "every event, live (must not block): UIs, live streams", sync=True),
)
# fmt: on
"""Every hook, in dispatch-index order: `HookSet`, `HOOK_METHODS` and the docs' hook table derive from it."""

SPECS: dict[str, HookSpec] = {s.name: s for s in HOOKS}
HOOK_METHODS: tuple[str, ...] = tuple(SPECS)


def hook_table() -> str:
    """The hook table of docs/architecture.md ("The hooks"), generated from `HOOKS` (a test holds the page
    to it)."""
    rows = ["| hook | kind | called with | returns | several hooks | used for |", "|---|---|---|---|---|---|"]
    for s in HOOKS:
        returns = s.returns.replace("|", "\\|")  # a pipe inside a table cell, even in code, is escaped
        rows.append(
            f"| `{s.name}` | {s.kind} | `({s.params})` | `{returns}` | {_SEVERAL[s.combine]} | {s.doc} |"
        )
    return "\n".join(rows)


_SEVERAL = {
    "each": "in order; the first failure propagates",
    "first": "in order; the first non-None answer wins",
    "chain": "chained: each gets the previous answer",
    "merge": "texts joined, data merged, in order",
    "observe": "each; failures logged and ignored",
    "events": "each; failures logged and ignored",
}


def overrides(hook: Hooks, name: str) -> bool:
    """Whether `hook` does something for `name`: its class (or the object itself) replaces the default."""
    return name in vars(hook) or getattr(type(hook), name) is not getattr(Hooks, name)


# -- overrides still written with the positional signatures --------------------------------------------

_warned: set[tuple[type, str]] = set()


def _names_info(annotation: Any, info: type | None) -> bool:
    if info is None:
        return False
    if annotation is info:
        return True
    return isinstance(annotation, str) and annotation.strip("'\" ").rsplit(".", 1)[-1] == info.__name__


def _positional_params(fn: Any) -> list[inspect.Parameter] | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    return [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]


def is_legacy(spec: HookSpec, fn: Any) -> bool:
    """Whether override `fn` (bound) takes the hook's positional arguments of before the info objects:
    `(ctx, <legacy names>)` rather than `(ctx, info)`. A one-argument hook's override is new-style when that
    argument is named `info` or annotated with the info type."""
    if not spec.legacy:
        return False
    params = _positional_params(fn)
    if params is None or len(params) < 2:
        return False
    second = params[1]
    if second.name == "info" or _names_info(second.annotation, spec.info):
        return False
    if len(params) == 2:
        return len(spec.legacy) == 1
    return len(params) == 1 + len(spec.legacy)


def _warn_legacy(hook: Hooks, spec: HookSpec, fn: Any) -> None:
    cls = type(hook)
    if (cls, spec.name) in _warned:
        return
    _warned.add((cls, spec.name))
    params = [p.name for p in _positional_params(fn) or []]
    if inspect.ismethod(fn):
        params.insert(0, "self")
    moved = ", ".join(f"`{n}` is `info.{n}`" for n in spec.legacy)
    message = (
        f"{cls.__qualname__}.{spec.name}({', '.join(params)}) uses the positional hook signature, which is "
        f"deprecated: write `{spec.signature}` ({moved}). stead adapts the call for now."
    )
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        return
    module = getattr(fn, "__module__", None) or cls.__module__
    warnings.warn_explicit(message, DeprecationWarning, code.co_filename, code.co_firstlineno, module)


def _bind(hook: Hooks, spec: HookSpec) -> Callable[..., Any]:
    """The callable `HookSet` calls for `hook`'s override of `spec`: the bound method itself, or — for an
    override with the positional signature — an adapter that unpacks the info object (warned once)."""
    fn: Callable[..., Any] = getattr(hook, spec.name)
    if not is_legacy(spec, fn):
        return fn
    _warn_legacy(hook, spec, fn)
    if len(spec.legacy) == 1:
        (name,) = spec.legacy

        def one(ctx: HookContext, info: Any) -> Any:
            return fn(ctx, getattr(info, name))

        return one
    get = attrgetter(*spec.legacy)

    def many(ctx: HookContext, info: Any) -> Any:
        return fn(ctx, *get(info))

    return many


# -- dispatch ------------------------------------------------------------------------------------------


async def _nothing(*_: Any) -> None:
    return None


def _ignore(agent_id: str, event: Event) -> None:
    return None


def _dispatcher(spec: HookSpec, fns: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    """The composed hook: one callable per hook, built once (see `HookSpec.combine`). An override that is
    alone needs no composition (except observers: their failures are isolated)."""
    combine = spec.combine
    if combine == "events":
        if not fns:
            return _ignore

        def events(agent_id: str, event: Event) -> None:
            for f in fns:
                try:
                    f(agent_id, event)
                except Exception:
                    log.exception("observing hook on_event() failed (ignored)")

        return events
    if combine == "observe":
        if not fns:
            return _nothing
        name = spec.name

        async def observe(ctx: HookContext, info: Any) -> None:
            for f in fns:
                try:
                    await f(ctx, info)
                except Exception:
                    log.exception("observing hook %s() failed (ignored)", name)

        return observe
    if combine == "merge":
        return _merge(fns)
    if combine == "chain":
        return _chain(spec, fns)
    if not fns:
        return _nothing
    if len(fns) == 1:
        return fns[0]
    if combine == "first":
        if spec.info is None:

            async def first0(ctx: HookContext) -> Any:
                for f in fns:
                    answer = await f(ctx)
                    if answer is not None:
                        return answer
                return None

            return first0

        async def first(ctx: HookContext, info: Any) -> Any:
            for f in fns:
                answer = await f(ctx, info)
                if answer is not None:
                    return answer
            return None

        return first
    if spec.info is None:

        async def each0(ctx: HookContext) -> None:
            for f in fns:
                await f(ctx)

        return each0

    async def each(ctx: HookContext, info: Any) -> None:
        for f in fns:
            await f(ctx, info)

    return each


def _chain(spec: HookSpec, fns: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    field_name = spec.chains
    if len(fns) == 1:
        return fns[0]
    if spec.sync:

        def chain_sync(ctx: HookContext, info: Any) -> Any:
            value = getattr(info, field_name)
            for i, f in enumerate(fns):
                value = f(ctx, replace(info, **{field_name: value}) if i else info)
            return value

        return chain_sync

    async def chain(ctx: HookContext, info: Any) -> Any:
        value = getattr(info, field_name)
        for i, f in enumerate(fns):
            value = await f(ctx, replace(info, **{field_name: value}) if i else info)
        return value

    return chain


def _merge(fns: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    async def merge(ctx: HookContext) -> RunContext | None:
        """Every hook's context, in hook order: texts joined by a blank line, data merged (later keys
        win). None when no hook answered."""
        answers = [a for a in [await f(ctx) for f in fns] if a is not None]
        if not answers:
            return None
        if len(answers) == 1:
            return answers[0]  # type: ignore[no-any-return]
        data: dict[str, Any] = {}
        for a in answers:
            data.update(a.data)
        return RunContext("\n\n".join(a.text for a in answers if a.text), data)

    return merge


class HookSet(Hooks):
    """Composes several `Hooks` into one (with the same methods): transactional hooks chain (first failure
    propagates), observing hooks fan out with per-hook failure isolation. Each method calls only the hook
    objects that override it — indexed at construction from `HOOKS` (the hook list is fixed from then on),
    with overrides still written with a positional signature adapted (and warned about once)."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = list(hooks)
        self._by: dict[str, tuple[Callable[..., Any], ...]] = {}
        for spec in HOOKS:
            fns = tuple(_bind(h, spec) for h in self.hooks if overrides(h, spec.name))
            self._by[spec.name] = fns
            setattr(self, spec.name, _dispatcher(spec, fns))
        # the kernel asks `wants` a dozen times per response: a frozenset's `__contains__` answers without
        # a Python frame
        setattr(self, "wants", frozenset(name for name, fns in self._by.items() if fns).__contains__)  # noqa: B010

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def wants(self, name: str) -> bool:
        """Whether any hook object overrides `name` (ask before building a context for it). Replaced, per
        instance, by the same answer from a frozenset (see `__init__`)."""
        return bool(self._by.get(name))
