"""A flow agent's provider: the flow engine answering the kernel's inference requests.

To the kernel a flow agent is an ordinary loop agent, so it gets everything the kernel promises for free: the
tool ledger (a batch is durable before any call runs, results commit one by one in call order, a non-durable
call cut off by a crash gets the *in-doubt* result instead of running twice), recovery, abort, drain, run
records with the breadcrumb, guardrails. Only its provider is special: instead of a model, `FlowProvider`
reads the flow state (`stead.flows._state`) and answers with

- the next step's tool call(s) — several in one response for a parallel for-each wave, which the kernel runs
  concurrently and commits individually, in call order — or
- a prompt step's model call: the flow's model is called with the step's own instructions and input, and its
  answer is carried into the ledger by a `flow_prompt` call (checked against the step's `output_schema`
  first, so a bad answer is a failed step), or
- the final text (the flow completed) or an error (the flow failed), ending the run.

Responses that call no model say so (`Done(model_call=False)`), so run records, spans and guardrails count
only real model requests. What the engine decided is held in memory (`FlowRuntime.stash`) and written by
`stead.flows._hooks.FlowHooks` inside the transaction that commits the response — the dispatch of the calls,
or the end of the run — so a crash before that commit leaves nothing behind and the same decision is made
again by the next owner.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stead.extend import PAYLOAD_METADATA_KEY as PAYLOAD_METADATA
from stead.extend import (
    BlockEnd,
    ConfigurationError,
    Done,
    Message,
    Provider,
    ProviderError,
    ProviderRequest,
    StreamEvent,
    Text,
    TextDelta,
    Tool,
    ToolCall,
    Usage,
    UsageEvent,
    answer_errors,
    tool,
)
from stead.flows._engine import PROMPT_TOOL, End, FlowEngine, NewInput, Planned
from stead.flows._paths import Change
from stead.flows._state import FlowTx

if TYPE_CHECKING:
    from stead.extend import AgentSystem

__all__ = ["FLOW_KEY", "INPUT_METADATA", "FlowProvider", "FlowRuntime", "prompt_tool"]

FLOW_KEY = "stead.flow"
"""`AgentConfig.extra` key of a flow agent: `{"provider": ..., "model": ...}` of the model its prompt steps
call (empty for a flow without prompt steps)."""
INPUT_METADATA = "stead.input"
"""Message metadata key carrying structured input for a flow (`input.<key>` in its expressions); the
delegation tool sets it from its `input` argument."""


@dataclass
class Stashed:
    inference_id: str
    kind: str  # "work": flushed with the dispatch; "end": flushed with the end of the response
    ft: FlowTx
    labels: dict[str, str] = field(default_factory=dict)
    """Step id (call id, or the inference id of a prompt) → the flow step it stands for (run records)."""


class FlowRuntime:
    """The flow layer of one system: the engines' pending decisions, until the kernel commits them."""

    def __init__(self, data_key: str) -> None:
        self.data_key = data_key
        self._system: AgentSystem | None = None
        self.stash: dict[str, Stashed] = {}
        """Agent id → the engine's decision for its response in flight (written when that commits)."""
        self.merges: dict[str, tuple[list[Change], list[dict[str, Any]], str]] = {}
        """Delegation call id → (the sub-agent's payload changes, the refused ones, the sub-agent's name),
        merged into the run's payload when the delegation's result commits."""

    def bind(self, system: AgentSystem) -> None:
        self._system = system

    @property
    def system(self) -> AgentSystem:
        if self._system is None:
            raise ConfigurationError("the flow runtime is not bound to an agent system")
        return self._system

    def take(self, agent_id: str, inference_id: str | None, kind: str) -> Stashed | None:
        """The decision stashed for this agent's response `inference_id`, if it is of `kind`."""
        found = self.stash.get(agent_id)
        if found is None or found.inference_id != inference_id or found.kind != kind:
            return None
        del self.stash[agent_id]
        return found


class FlowProvider:
    """The provider of the agents of one flow definition (registered as `flow/<name>`)."""

    def __init__(self, engine: FlowEngine, runtime: FlowRuntime) -> None:
        self.engine = engine
        self.runtime = runtime

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        system = self.runtime.system
        agent = system.loaded(request.agent_id)
        extra = agent.config.extra if agent is not None else {}
        data = extra.get(self.runtime.data_key)
        async with system.store.transaction() as tx:  # reads only: the decision is written on commit
            ft = FlowTx(tx, request.agent_id)
            action = await self.engine.next(
                ft, _new_input(request.messages), data if isinstance(data, dict) else None
            )
        if isinstance(action, End):
            self.runtime.stash[request.agent_id] = Stashed(request.inference_id, "end", ft)
            if action.status == "completed":
                yield TextDelta(action.text)
                yield BlockEnd(Text(action.text))
                yield Done("stop", model_call=False)
            else:
                yield Done("error", error=action.error, model_call=False)
            return
        prompts = [p for p in action.calls if p.prompt is not None]
        usage: Usage | None = None
        if prompts:
            inner = self._inner(extra)
            answers = await asyncio.gather(*(self._prompt(inner, extra, request, p) for p in prompts))
            for p, (arguments, used) in zip(prompts, answers, strict=True):
                p.arguments = arguments
                usage = _add(usage, used)
        labels = {p.call_id: p.label + (" (answer)" if p.prompt is not None else "") for p in action.calls}
        if prompts:
            labels[request.inference_id] = ", ".join(p.label for p in prompts)
        self.runtime.stash[request.agent_id] = Stashed(request.inference_id, "work", ft, labels)
        for p in action.calls:
            yield BlockEnd(ToolCall(p.tool, dict(p.arguments), p.call_id))
        if usage is not None:
            yield UsageEvent(usage)
        yield Done("tool_call", model_call=bool(prompts))

    def _inner(self, extra: dict[str, Any]) -> Provider:
        spec = extra.get(FLOW_KEY) or {}
        provider = self.runtime.system.router.provider_for(spec) if spec.get("provider") else None
        if provider is None:
            raise ProviderError(
                f"flow {self.engine.name!r}: the model of its prompt steps ({spec.get('provider')}:"
                f"{spec.get('model')}) is not available in this process",
                retryable=False,
            )
        return provider

    async def _prompt(
        self, inner: Provider, extra: dict[str, Any], request: ProviderRequest, p: Planned
    ) -> tuple[dict[str, Any], Usage | None]:
        """One prompt step's model call; the `flow_prompt` arguments carrying its answer (or its failure).
        A retryable model error is raised: the kernel retries the whole response, deciding the same again."""
        spec = extra.get(FLOW_KEY) or {}
        req = ProviderRequest(
            model=str(spec.get("model") or request.model),
            instructions=p.prompt or "",
            messages=[Message("user", [Text(p.message)])],
            tools=[],
            agent_id=request.agent_id,
            inference_id=request.inference_id,
            effort=request.effort,
            max_output_tokens=request.max_output_tokens,  # the flow agent's cap (MR1)
            model_options=request.model_options,
            # the schema is asked of the vendor natively (response_format, a forced tool) and checked below
            output_schema=p.schema,
            output_name=_wire_name(p.step),
        )
        text: list[str] = []
        usage: Usage | None = None
        error: str | None = None
        try:
            async for ev in inner.stream(req):
                if isinstance(ev, BlockEnd) and isinstance(ev.block, Text):
                    text.append(ev.block.text)
                elif isinstance(ev, UsageEvent):
                    usage = ev.usage
                elif isinstance(ev, Done):
                    if ev.reason in ("error", "cancelled"):
                        error = ev.error or f"the model's response ended with {ev.reason!r}"
                    break
        except ProviderError as e:
            if e.retryable:
                raise
            error = str(e)
        arguments: dict[str, Any] = {"step": p.step}
        if error is not None:
            arguments["error"] = f"the model failed: {error}"
            return arguments, usage
        answer = "".join(text)
        arguments["text"] = answer
        if p.schema is not None:
            _, problems = answer_errors(answer, p.schema)
            if problems:
                arguments["error"] = "the answer does not match the step's output_schema: " + "; ".join(
                    problems
                )
        return arguments, usage


def _wire_name(step: str) -> str:
    """A step name as a schema name on the wire (letters, digits, `_`, `-`; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", step)[:64] or "result"


def _new_input(messages: list[Message]) -> NewInput | None:
    """The input this response consumes (the last message, when it is one), with its payload."""
    if not messages:
        return None
    last = messages[-1]
    if last.role not in ("user", "system") or last.id is None:
        return None
    metadata = last.metadata or {}
    payload = metadata.get(PAYLOAD_METADATA)
    structured = metadata.get(INPUT_METADATA)
    return NewInput(
        last.text,
        payload if isinstance(payload, dict) else None,
        structured if isinstance(structured, dict) else None,
    )


def _add(a: Usage | None, b: Usage | None) -> Usage | None:
    if a is None:
        return b
    if b is None:
        return a
    cost = None if a.cost is None and b.cost is None else (a.cost or 0.0) + (b.cost or 0.0)
    return Usage(
        a.input_tokens + b.input_tokens,
        a.output_tokens + b.output_tokens,
        a.cached_tokens + b.cached_tokens,
        cost,
    )


class PromptStepFailed(Exception):
    """A prompt step's answer was refused (the model failed, or the answer does not fit the schema)."""


def prompt_tool() -> Tool:
    """`flow_prompt`: carries a prompt step's answer into the tool ledger (durable: it only echoes)."""

    async def flow_prompt(step: str, text: str | None = None, error: str | None = None) -> str:
        """The answer of a flow's prompt step (called by the flow engine, never by a model).

        Args:
            step: The prompt step.
            text: The model's answer.
            error: Why the step failed, when it did.
        """
        if error is not None:
            raise PromptStepFailed(error)
        return text or ""

    return tool(name=PROMPT_TOOL, durable=True)(flow_prompt)
