"""Scripted model files: a YAML script that plays the part of a model, for demos, tests and benchmarks.

A scripted model is NOT a language model. It answers from a fixed script, and says so: the file must start
with `scripted: true`. Example::

    # SCRIPTED MODEL — not a real LLM; replays the responses below.
    scripted: true
    chunk: 8                      # stream text in deltas of 8 characters (0: one delta per block)
    rules:
      - when: {user_contains: "hello"}
        responses:
          - text: "Hello! You said: {user}"
      - responses:                # no `when`: matches any message
          - tool_call: {name: add, arguments: {a: 2, b: 3}}
          - text: "The sum is {last_tool_result}."

The answer is a pure function of the request, so a process restarted mid-conversation continues exactly
where the previous one stopped: the first rule whose `when` matches the latest user message is chosen, and
its N-th response is played, N being the number of assistant messages since that user message. Summary
requests of context compaction match only rules with `when: {purpose: compaction}`; without one they get
a fixed one-line summary.

A response has `text`, `tool_call` (one call) or `tool_calls` (several calls in one response, run as a
parallel batch) — text may come before calls — or `error` (the model fails; `retryable: true` makes it a
transient failure that is retried). `{user}` and `{last_tool_result}` are replaced in texts and in string
arguments; an argument that is exactly `"{last_tool_result}"` becomes that result's JSON value when it is
one (so `5` stays a number). `chunk`, `delay` and `delay_between` may be set per file or per response.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from stead._yaml import load_yaml_model
from stead.messages import Block, Reasoning, Text, ToolCall, ToolResult, text_of
from stead.providers.base import ProviderRequest
from stead.providers.scripted import ScriptedProvider, ScriptedResponse

__all__ = [
    "ScriptedFileOf",
    "ScriptedModelFile",
    "ScriptedReply",
    "ScriptedRule",
    "ScriptedRuleOf",
    "ScriptedStep",
    "ScriptedToolCall",
    "ScriptedWhen",
    "load_scripted_model",
    "scripted_responder",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedToolCall(_Strict):
    """One tool call the script makes."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedReply(_Strict):
    """What every scripted response may hold: text, one tool call or several, and how it is paced. The schema
    shared by scripted model files (`ScriptedStep`) and scripted realtime scripts (`stead.realtime`'s
    text-duplex driver), each of which adds its own fields."""

    text: str | None = None
    tool_call: ScriptedToolCall | None = None
    tool_calls: list[ScriptedToolCall] | None = Field(default=None, min_length=1)
    chunk: int | None = Field(default=None, ge=0)
    delay: float | None = Field(default=None, ge=0)
    delay_between: float | None = Field(default=None, ge=0)

    ALONE: ClassVar[str] = ""
    """The field that makes a response without text or calls (`error`, `fatal`), named when none is given."""

    def stands_alone(self) -> bool:
        """Whether `ALONE` is set (a response then needs no text and no calls)."""
        return False

    @pydantic.model_validator(mode="after")
    def _one_kind(self) -> ScriptedReply:
        if self.tool_call is not None and self.tool_calls is not None:
            raise ValueError("use either tool_call or tool_calls, not both")
        empty = self.text is None and self.tool_call is None and self.tool_calls is None
        if empty and not self.stands_alone():
            raise ValueError(f"a response needs text, tool_call, tool_calls or {self.ALONE}")
        return self

    def calls(self) -> list[ScriptedToolCall]:
        if self.tool_call is not None:
            return [self.tool_call]
        return list(self.tool_calls or [])


class ScriptedStep(ScriptedReply):
    """One scripted response of a scripted model file."""

    reasoning: str | None = None
    error: str | None = None
    retryable: bool = False

    ALONE: ClassVar[str] = "error"

    def stands_alone(self) -> bool:
        return self.error is not None


class ScriptedWhen(_Strict):
    """When a rule applies, judged on the latest user message (all given conditions must hold)."""

    user_contains: str | None = None
    user_matches: str | None = None
    purpose: Literal["turn", "compaction"] = "turn"
    """`compaction`: the rule answers summary requests of context compaction (`{user}` is then the text
    to summarize). Rules without it answer the agent's own turns only."""

    @pydantic.field_validator("user_matches")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return value

    def matches(self, user: str, purpose: str = "turn") -> bool:
        if purpose != self.purpose:
            return False
        if self.user_contains is not None and self.user_contains.lower() not in user.lower():
            return False
        return not (self.user_matches is not None and re.search(self.user_matches, user) is None)


StepT = TypeVar("StepT", bound=ScriptedReply)


class ScriptedRuleOf(_Strict, Generic[StepT]):
    """A rule: when it applies, and its responses in order (of a scripted model file, or of another script
    built on the same schema)."""

    when: ScriptedWhen | None = None
    responses: list[StepT] = Field(min_length=1)


class ScriptedRule(ScriptedRuleOf[ScriptedStep]):
    """A rule of a scripted model file."""


RuleT = TypeVar("RuleT", bound=ScriptedRuleOf[Any])


class ScriptedFileOf(_Strict, Generic[RuleT]):
    """A script file: `scripted: true`, the file-wide pacing, its rules (see the module docstring)."""

    scripted: Literal[True]
    description: str | None = None
    chunk: int = Field(default=0, ge=0)
    delay: float = Field(default=0.0, ge=0)
    delay_between: float = Field(default=0.0, ge=0)
    rules: list[RuleT] = Field(min_length=1)


class ScriptedModelFile(ScriptedFileOf[ScriptedRule]):
    """A scripted model file (see the module docstring)."""


def _position(request: ProviderRequest) -> tuple[str, int, str]:
    """(latest user text, assistant messages since it, latest tool result since it)."""
    user, n, last_result = "", 0, ""
    found_result = False
    for m in reversed(request.messages):
        if m.role == "user":
            user = text_of(m.content)
            break
        if m.role == "assistant":
            n += 1
        elif m.role == "tool" and not found_result:
            results = [b for b in m.content if isinstance(b, ToolResult)]
            if results:
                last_result, found_result = results[-1].output, True
    return user, n, last_result


def _fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


def _fill_value(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for k, v in values.items():
            if value == "{" + k + "}":
                try:
                    return json.loads(v)
                except ValueError:
                    return v
        return _fill(value, values)
    if isinstance(value, list):
        return [_fill_value(x, values) for x in value]
    if isinstance(value, dict):
        return {k: _fill_value(x, values) for k, x in value.items()}
    return value


def scripted_responder(
    script: ScriptedModelFile, *, source: str = "scripted model"
) -> Callable[[ProviderRequest], ScriptedResponse]:
    """The `respond(request)` function a `ScriptedProvider` calls for `script`."""

    def respond(request: ProviderRequest) -> ScriptedResponse:
        user, n, last_result = _position(request)
        purpose = request.purpose
        rule_no, rule = next(
            (
                (i, r)
                for i, r in enumerate(script.rules)
                if (r.when is None and purpose == "turn")
                or (r.when is not None and r.when.matches(user, purpose))
            ),
            (-1, None),
        )
        if rule is None and purpose == "compaction":
            # no rule for summaries: a plain, deterministic one (a scripted model is not a language model)
            return ScriptedResponse(blocks=[Text(f"(scripted summary of {len(user):,} characters)")])
        if rule is None:
            return ScriptedResponse(error=f"{source}: no rule matches the message {user!r}")
        if n >= len(rule.responses):
            return ScriptedResponse(
                error=f"{source}: rule {rule_no + 1} has {len(rule.responses)} response(s) "
                f"and all were used; add more responses or a rule for this message"
            )
        step = rule.responses[n]
        values = {"user": user, "last_tool_result": last_result}
        blocks: list[Block] = []
        if step.reasoning is not None:
            blocks.append(Reasoning(_fill(step.reasoning, values)))
        if step.text is not None:
            blocks.append(Text(_fill(step.text, values)))
        for call in step.calls():
            blocks.append(ToolCall(name=call.name, arguments=_fill_value(call.arguments, values)))
        return ScriptedResponse(
            blocks=[] if step.error is not None else blocks,
            error=step.error,
            retryable=step.retryable,
            chunk=step.chunk if step.chunk is not None else script.chunk,
            delay=step.delay if step.delay is not None else script.delay,
            delay_between=step.delay_between if step.delay_between is not None else script.delay_between,
        )

    return respond


def load_scripted_model(path: str | Path) -> ScriptedProvider:
    """Load a scripted model file as a `ScriptedProvider`; raise `DefinitionError` (`file:line:`)."""
    script, _ = load_yaml_model(path, ScriptedModelFile, what="scripted model file")
    return ScriptedProvider(scripted_responder(script, source=f"scripted model {path}"), name="scripted")
