"""OpenTelemetry spans for stead runs, following the GenAI semantic conventions (docs/observability.md).

`TracingHooks` turns the kernel's hooks and events into three kinds of spans:

- `invoke_agent {agent name}` — one per run, from activation to settlement;
- `chat {model}` — one per inference, a child of the run's span;
- `execute_tool {tool}` — one per tool call, a child of the run's span.

Hooks run inside transactions that may roll back, so spans only *end* at observable points: after the
transaction commits (`tx.after_commit`) or on the events the kernel emits after commit (`ToolStarted`,
`ToolFinished`, `Done`, `Settled`). A rolled-back activation leaves a span that is never ended, which the SDK
never exports. A child agent's `invoke_agent` span nests under its parent's `execute_tool` span through the
W3C `traceparent` in `metadata["stead.parent"]["traceparent"]` (see `traceparent_for_call`). A run resumed
after a restart gets `stead.resumed=true` and a link to the span of its first incarnation, whose
`traceparent` is kept in the `stead_trace_runs` table until the run settles.

Only `opentelemetry-api` is needed; pass an SDK `TracerProvider` (or configure the global one). Message
content (inputs, outputs, tool arguments and results) stays out of spans unless `capture_content=True`.
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from stead.extend import (
    BlockInfo,
    Done,
    Event,
    HookContext,
    Hooks,
    Outcome,
    ResponseInfo,
    Settled,
    SettledInfo,
    Text,
    ToolCall,
    ToolDispatchedInfo,
    ToolFinished,
    ToolResult,
    ToolResultInfo,
    ToolStarted,
    parent_link,
)

__all__ = ["TracingHooks", "traceparent_for_call"]

_PROPAGATOR = TraceContextTextMapPropagator()
_INSTANCES: weakref.WeakSet[TracingHooks] = weakref.WeakSet()

OP = "gen_ai.operation.name"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _traceparent(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _context_from(traceparent: Any) -> Context | None:
    if not isinstance(traceparent, str) or not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def traceparent_for_call(call_id: str) -> str | None:
    """The W3C traceparent of the `execute_tool` span of `call_id` in any live `TracingHooks`, or None."""
    for inst in list(_INSTANCES):
        tp = inst.traceparent_for_call(call_id)
        if tp is not None:
            return tp
    return None


@dataclass
class _RunSpan:
    span: Span
    agent_id: str
    agent_name: str | None
    resumed_inference: str | None = None

    @property
    def context(self) -> Context:
        return trace.set_span_in_context(self.span)


@dataclass
class _Dispatched:
    run_id: str
    call: ToolCall
    turn_id: str | None
    at_ns: int
    here: bool = True


@dataclass
class _ToolSpan:
    span: Span
    run_id: str


class TracingHooks(Hooks):
    """Emit OpenTelemetry GenAI spans for runs, inferences and tool calls.

    `tracer_provider`: an OpenTelemetry `TracerProvider` (default: the global one). `capture_content`: also
    record message content (`gen_ai.input.messages`, `gen_ai.output.messages`, tool call arguments and
    results) — off by default, since content may be sensitive."""

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, capture_content: bool = False
    ) -> None:
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer: Tracer = provider.get_tracer("stead")
        self.capture_content = capture_content
        self._runs: dict[str, _RunSpan] = {}
        self._agent_run: dict[str, str] = {}
        self._dispatched: dict[str, _Dispatched] = {}
        self._tools: dict[str, _ToolSpan] = {}
        self._inference_start: dict[str, int] = {}
        self._output: dict[str, list[str]] = {}
        _INSTANCES.add(self)

    # -- public ----------------------------------------------------------------------------------
    def traceparent_for_call(self, call_id: str) -> str | None:
        """The W3C `traceparent` of the `execute_tool` span of this call (started now if the call is
        dispatched but its span has not started yet), or None if the call is unknown. The orchestration
        layer puts it into `metadata["stead.parent"]["traceparent"]` of the child's activating message."""
        ts = self._tools.get(call_id)
        if ts is None:
            ts = self._start_tool(call_id, time.time_ns())
        return None if ts is None else _traceparent(ts.span)

    # -- helpers ---------------------------------------------------------------------------------
    def _common(self, agent_id: str, agent_name: str | None, run_id: str | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"gen_ai.agent.id": agent_id, "gen_ai.conversation.id": agent_id}
        if agent_name:
            attrs["gen_ai.agent.name"] = agent_name
        if run_id:
            attrs["stead.run.id"] = run_id
        return attrs

    def _start_tool(self, call_id: str, start_ns: int) -> _ToolSpan | None:
        d = self._dispatched.get(call_id)
        if d is None:
            return None
        run = self._runs.get(d.run_id)
        attrs = self._common(run.agent_id, run.agent_name, d.run_id) if run is not None else {}
        attrs.update(
            {
                OP: "execute_tool",
                "gen_ai.tool.name": d.call.name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "stead.step.id": call_id,
            }
        )
        if d.turn_id:
            attrs["stead.turn.id"] = d.turn_id
        if not d.here:
            attrs["stead.resumed"] = True
        if self.capture_content:
            args = d.call.arguments
            attrs["gen_ai.tool.call.arguments"] = args if isinstance(args, str) else json.dumps(args)
        span = self.tracer.start_span(
            f"execute_tool {d.call.name}",
            context=run.context if run is not None else None,
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=start_ns,
        )
        ts = self._tools[call_id] = _ToolSpan(span, d.run_id)
        return ts

    # -- activation ------------------------------------------------------------------------------
    async def activated_tx(self, ctx: HookContext) -> None:
        tx, run_id = ctx.tx, ctx.run_id
        if tx is None or run_id is None:
            return
        attrs = self._common(ctx.agent_id, ctx.agent_name, run_id)
        attrs[OP] = "invoke_agent"
        name = f"invoke_agent {ctx.agent_name}" if ctx.agent_name else "invoke_agent"
        links: list[Link] = []
        parent_tp: str | None = None
        if ctx.restored:
            attrs["stead.resumed"] = True
            rows = await tx.fetch(
                "SELECT traceparent, parent_traceparent FROM stead_trace_runs WHERE run_id = ?", (run_id,)
            )
            if rows:
                original = _context_from(rows[0][0])
                if original is not None:
                    links.append(
                        Link(trace.get_current_span(original).get_span_context(), {"stead.link": "resumed"})
                    )
                parent_tp = rows[0][1]
        else:
            message = ctx.message
            link = parent_link(message.metadata if message is not None else None)
            if link is not None:
                parent_tp = link.get("traceparent") if isinstance(link.get("traceparent"), str) else None
                attrs["stead.parent.run.id"] = link["run_id"]
            if self.capture_content and message is not None:
                attrs["gen_ai.input.messages"] = json.dumps(
                    [{"role": message.role, "parts": [{"type": "text", "content": message.text}]}]
                )
        span = self.tracer.start_span(
            name,
            context=_context_from(parent_tp),
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            links=links,
        )
        if ctx.restored:
            if not links:
                await tx.execute(
                    "INSERT INTO stead_trace_runs(run_id, traceparent, parent_traceparent) VALUES (?, ?, ?) "
                    "ON CONFLICT(run_id) DO NOTHING",
                    (run_id, _traceparent(span), parent_tp),
                )
        else:
            await tx.execute(
                "INSERT INTO stead_trace_runs(run_id, traceparent, parent_traceparent) VALUES (?, ?, ?) "
                "ON CONFLICT(run_id) DO NOTHING",
                (run_id, _traceparent(span), parent_tp),
            )
        run = _RunSpan(span, ctx.agent_id, ctx.agent_name)
        if ctx.restored:
            run.resumed_inference = ctx.inference_id

        def published() -> None:
            old = self._runs.get(run_id)
            if old is not None and old.span is not span:
                old.span.end()
            self._runs[run_id] = run
            self._agent_run[ctx.agent_id] = run_id

        tx.after_commit(published)

    # -- inferences ------------------------------------------------------------------------------
    async def before_inference(self, ctx: HookContext) -> str | None:
        if ctx.inference_id is not None:
            self._inference_start.setdefault(ctx.inference_id, time.time_ns())
        return None

    async def block_tx(self, ctx: HookContext, info: BlockInfo) -> None:
        block = info.block
        if self.capture_content and ctx.tx is not None and isinstance(block, Text) and ctx.inference_id:
            inf = ctx.inference_id
            ctx.tx.after_commit(lambda: self._output.setdefault(inf, []).append(block.text))

    async def response_tx(self, ctx: HookContext, info: ResponseInfo) -> None:
        if ctx.tx is None:
            return
        if not info.model_call:  # no model was called (a flow engine's navigation): no `chat` span
            inf = info.inference_id
            ctx.tx.after_commit(lambda: self._output.pop(inf, None))
            return
        run_id, turn_id = ctx.run_id, ctx.turn_id
        ctx.tx.after_commit(lambda: self._chat_span(ctx.agent_id, ctx.agent_name, run_id, turn_id, info))

    def _chat_span(
        self,
        agent_id: str,
        agent_name: str | None,
        run_id: str | None,
        turn_id: str | None,
        info: ResponseInfo,
    ) -> None:
        self._inference_start.pop(info.inference_id, None)
        run = self._runs.get(run_id) if run_id else None
        attrs = self._common(agent_id, agent_name, run_id)
        attrs.update(
            {
                OP: "chat",
                "gen_ai.provider.name": info.provider,
                "gen_ai.request.model": info.model,
                "gen_ai.response.finish_reasons": [info.reason],
                "stead.inference.id": info.inference_id,
                "stead.step.id": info.inference_id,
            }
        )
        if turn_id:
            attrs["stead.turn.id"] = turn_id
        if run is not None and run.resumed_inference == info.inference_id:
            attrs["stead.resumed"] = True
        u = info.usage
        if u is not None:
            attrs["gen_ai.usage.input_tokens"] = u.input_tokens
            attrs["gen_ai.usage.output_tokens"] = u.output_tokens
            if u.cached_tokens:
                attrs["gen_ai.usage.cache_read.input_tokens"] = u.cached_tokens
            if u.cost is not None:
                attrs["stead.usage.cost"] = u.cost
        if info.first_token_at is not None:
            attrs["stead.ttft_ms"] = round((info.first_token_at - info.started_at) * 1000, 3)
        texts = self._output.pop(info.inference_id, None)
        if self.capture_content and texts:
            attrs["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": t} for t in texts]}]
            )
        span = self.tracer.start_span(
            f"chat {info.model}",
            context=run.context if run is not None else None,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=_ns(info.started_at),
        )
        if info.error is not None or info.reason in ("error", "cancelled"):
            span.set_attribute("error.type", "cancelled" if info.reason == "cancelled" else "_OTHER")
            span.set_status(Status(StatusCode.ERROR, info.error or info.reason))
        span.end(end_time=_ns(info.ended_at))

    # -- tools -----------------------------------------------------------------------------------
    async def tool_dispatched_tx(self, ctx: HookContext, info: ToolDispatchedInfo) -> None:
        if ctx.tx is None or ctx.run_id is None:
            return
        run_id, turn_id, at = ctx.run_id, ctx.turn_id, time.time_ns()
        batch = [c for c in info.calls if c.id]

        def published() -> None:
            for c in batch:
                assert c.id is not None
                self._dispatched[c.id] = _Dispatched(run_id, c, turn_id, at)

        ctx.tx.after_commit(published)

    def _known_call(self, agent_id: str, call: ToolCall) -> None:
        """A call seen for the first time after a restart (dispatched by an earlier process)."""
        if call.id is None or call.id in self._dispatched:
            return
        run_id = self._agent_run.get(agent_id)
        if run_id is not None:
            self._dispatched[call.id] = _Dispatched(run_id, call, None, time.time_ns(), here=False)

    async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
        call = info.call
        # resumed calls that never start (in doubt) still get a span, ended on ToolFinished
        if call.id is not None and call.id not in self._dispatched and ctx.tx is not None:
            agent_id = ctx.agent_id
            ctx.tx.after_commit(lambda: self._known_call(agent_id, call))

    # -- events (after commit) -------------------------------------------------------------------
    def on_event(self, agent_id: str, event: Event) -> None:
        if isinstance(event, ToolStarted):
            cid = event.call.id
            if cid is not None and cid not in self._tools:
                self._known_call(agent_id, event.call)
                self._start_tool(cid, time.time_ns())
        elif isinstance(event, ToolFinished):
            self._end_tool(event.result)
        elif isinstance(event, Done):
            if event.reason == "cancelled" and event.inference_id is not None:
                self._cancelled_inference(agent_id, event.inference_id)
        elif isinstance(event, Settled):
            self._end_run(agent_id, event.run_id, event.error, event.outcome)

    def _end_tool(self, result: ToolResult) -> None:
        cid = result.call_id
        ts = self._tools.pop(cid, None)
        if ts is None:
            d = self._dispatched.get(cid)
            ts = self._start_tool(cid, d.at_ns if d is not None else time.time_ns())
            self._tools.pop(cid, None)
        self._dispatched.pop(cid, None)
        if ts is None:
            return
        if self.capture_content:
            ts.span.set_attribute("gen_ai.tool.call.result", result.output)
        if result.is_error:
            ts.span.set_attribute("error.type", "tool_error")
            ts.span.set_status(Status(StatusCode.ERROR, result.output[:200]))
        ts.span.end()

    def _cancelled_inference(self, agent_id: str, inference_id: str) -> None:
        start = self._inference_start.pop(inference_id, None)
        if start is None:
            return
        run_id = self._agent_run.get(agent_id)
        run = self._runs.get(run_id) if run_id else None
        attrs = self._common(agent_id, run.agent_name if run else None, run_id)
        attrs.update(
            {
                OP: "chat",
                "stead.inference.id": inference_id,
                "stead.step.id": inference_id,
                "error.type": "cancelled",
            }
        )
        span = self.tracer.start_span(
            "chat",
            context=run.context if run is not None else None,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=start,
        )
        span.set_status(Status(StatusCode.ERROR, "cancelled"))
        span.end()

    def _end_run(self, agent_id: str, run_id: str, error: str | None, outcome: Outcome) -> None:
        run = self._runs.pop(run_id, None)
        if self._agent_run.get(agent_id) == run_id:
            del self._agent_run[agent_id]
        for cid in [c for c, d in self._dispatched.items() if d.run_id == run_id]:
            self._dispatched.pop(cid, None)
        for cid in [c for c, t in self._tools.items() if t.run_id == run_id]:
            t = self._tools.pop(cid)
            t.span.set_status(Status(StatusCode.ERROR, "the run ended before the call finished"))
            t.span.end()
        if run is None:
            return
        status = outcome.value
        run.span.set_attribute("stead.run.status", status)
        if error is not None:
            run.span.set_attribute("error.type", "cancelled" if outcome is Outcome.CANCELLED else "_OTHER")
            run.span.set_status(Status(StatusCode.ERROR, error))
        run.span.end()

    # -- settlement ------------------------------------------------------------------------------
    async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
        if ctx.tx is not None and ctx.run_id is not None:
            await ctx.tx.execute("DELETE FROM stead_trace_runs WHERE run_id = ?", (ctx.run_id,))
