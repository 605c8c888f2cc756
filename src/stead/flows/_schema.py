"""The YAML schema of flow agents (`type: flow`) and of payload restrictions (`payload:`), as pydantic models.

`stead.definitions.AgentDefinition` uses these for its `steps`, `paths` and `payload` keys. The shapes are
checked here; everything that needs the whole definition (expressions compiled, names resolved, templates
parsed — each error with `file:line`) is checked by `stead.flows._loader.compile_flow` when the file loads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = [
    "MAX_FOR_EACH_ITEMS",
    "MAX_WHILE_ITERATIONS",
    "FlowPath",
    "FlowStep",
    "ForEach",
    "PayloadRules",
    "StepBody",
    "While",
]

MAX_FOR_EACH_ITEMS = 1000
MAX_WHILE_ITERATIONS = 100
MAX_CONCURRENCY = 50
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StepBody(_Strict):
    """What one step does: exactly one of `tool`, `sub_agent` or `prompt`, with its mappings.

    `input`: the step's input — a mapping of argument name to an expression (a string) or a static value
    (anything else), or one expression for the whole input object. `output`: payload path (a trailing `[]`
    appends to a list) → expression, applied when the step completes; in it, `step.output` is the step's
    result."""

    tool: str | None = None
    """A tool the definition lists under `tools:` (by its name)."""
    sub_agent: str | None = None
    """A sub-agent the definition lists under `sub_agents:`."""
    prompt: str | None = None
    """Instructions for one model call (a Jinja2 template seeing payload, input, data and steps). The model
    gets the step's input as JSON and should answer JSON (structured output into the payload)."""
    input: dict[str, Any] | str | None = None
    request: str | None = None
    """For a `sub_agent` step: an expression for the request text (default: the run's input text)."""
    output: dict[str, str] | None = None
    output_schema: dict[str, Any] | None = None
    """For a `prompt` step: a JSON schema the model's JSON answer must satisfy (type, required, properties,
    items, enum); an answer that does not is a failed step."""
    description: str | None = None

    _input: Any = PrivateAttr(default=None)
    _request: Any = PrivateAttr(default=None)
    _output: list[tuple[Any, Any]] = PrivateAttr(default_factory=list)
    _template: Any = PrivateAttr(default=None)

    @property
    def kind(self) -> str:
        kinds = [k for k in ("tool", "sub_agent", "prompt") if getattr(self, k) is not None]
        return kinds[0] if len(kinds) == 1 else ""

    @pydantic.model_validator(mode="after")
    def _one_kind(self) -> StepBody:
        kinds = [k for k in ("tool", "sub_agent", "prompt") if getattr(self, k) is not None]
        loops = [k for k in ("for_each", "while_") if getattr(self, k, None) is not None]
        if len(kinds) + len(loops) != 1:
            found = ", ".join([*kinds, *("while" if k == "while_" else k for k in loops)]) or "none"
            allowed = "tool, sub_agent, prompt" + (", for_each, while" if isinstance(self, FlowStep) else "")
            raise ValueError(f"a step does exactly one of {allowed} (found: {found})")
        if self.request is not None and self.sub_agent is None:
            raise ValueError("'request' is for sub_agent steps")
        if self.output_schema is not None and self.prompt is None:
            raise ValueError("'output_schema' is for prompt steps")
        return self


class ForEach(_Strict):
    """Run `do` once per item of a collection (at most 1,000), one after the other or in parallel."""

    items: str
    """An expression giving the list to iterate over."""
    as_: str = Field(default="item", alias="as")
    """The name the current item has in expressions (`index` is its position)."""
    parallel: bool = False
    """Run up to `concurrency` iterations at a time (each sees the payload as it was when the loop began;
    their output mappings are applied in index order once all iterations have finished)."""
    concurrency: int = Field(default=5, ge=1, le=MAX_CONCURRENCY)
    max_items: int = Field(default=MAX_FOR_EACH_ITEMS, ge=1, le=MAX_FOR_EACH_ITEMS)
    continue_on_error: bool = False
    """Go on after a failed iteration (the loop still completes); otherwise the loop fails."""
    do: StepBody

    _items: Any = PrivateAttr(default=None)

    @pydantic.field_validator("as_")
    @classmethod
    def _check_as(cls, value: str) -> str:
        if not _NAME.match(value) or value in _RESERVED:
            raise ValueError(f"{value!r} cannot name the loop item (reserved names: {', '.join(_RESERVED)})")
        return value


class While(_Strict):
    """Run `do` while a condition holds, at most `max` (≤ 100) times; still holding then is a failure."""

    when: str
    max: int = Field(default=MAX_WHILE_ITERATIONS, ge=1, le=MAX_WHILE_ITERATIONS)
    do: StepBody

    _when: Any = PrivateAttr(default=None)


class FlowStep(StepBody):
    """One step of a flow: a `tool`, `sub_agent` or `prompt` step, or a `for_each` / `while` loop."""

    name: str
    start: bool = False
    """The step the flow begins with (at most one; default: the first step)."""
    for_each: ForEach | None = None
    while_: While | None = Field(default=None, alias="while")

    @property
    def kind(self) -> str:
        if self.for_each is not None:
            return "for_each"
        if self.while_ is not None:
            return "while"
        return super().kind

    @pydantic.field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid step name: start with a letter or '_', then letters, digits, "
                "'_' or '-' (at most 64)"
            )
        return value


class FlowPath(_Strict):
    """A path `from` → `to`, taken after `from` finished when `when` holds (no `when`: always valid).
    Paths are tried by descending `priority`; unconditional paths with priority ≤ 0 are fallbacks, taken
    only when no other path is valid."""

    from_: str = Field(alias="from")
    to: str
    when: str | None = None
    priority: int = 0

    _when: Any = PrivateAttr(default=None)


class PayloadRules(_Strict):
    """Which payload paths an agent's prompt sees (`read`) and which it may change (`write`); absent: all.
    Patterns: `order.status`, `order.*`, `notes.**`, `**`; a write pattern may end in `:add,update,delete`."""

    read: list[str] | None = None
    write: list[str] | None = None

    _read: Any = PrivateAttr(default=None)
    _write: Any = PrivateAttr(default=None)


class FlowDefinition(Protocol):
    """What the flow layer reads and compiles of an agent definition (`stead.definitions.AgentDefinition`
    is one): flows build on no other plugin, so they name only the parts they use."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def model(self) -> str | Sequence[str] | None: ...
    @property
    def sub_agents(self) -> Sequence[str]: ...
    @property
    def steps(self) -> Sequence[FlowStep]: ...
    @property
    def paths(self) -> Sequence[FlowPath]: ...
    @property
    def payload(self) -> PayloadRules | None: ...
    @property
    def result(self) -> str | None: ...
    @property
    def resolved_tools(self) -> Sequence[Any]: ...

    _result: Any
    """The compiled `result` expression (set by `compile_flow`)."""
    _compiled: bool
    """Whether `compile_flow` ran."""


_RESERVED = ("payload", "input", "data", "steps", "step", "flow", "index", "iteration")
