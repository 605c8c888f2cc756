"""The agent definition schema (docs/orchestration.md): what an agent *is*, as written in a YAML file.

`loop`, `flow` and `realtime` are the implemented types. Unknown keys are refused, so a typo never
silently does nothing. The flow keys (`steps`, `paths`, `result`) and `payload` have their shapes in
`stead.flows._schema`; a flow's expressions and names are checked when the file loads
(`stead.flows._loader`). A `realtime` definition (docs/realtime.md) names the durable agents it hands work
to (`target_agents`) and its voice and narration settings (`realtime:`); any definition's `realtime:`
section is a layer of the effective settings of a realtime agent that targets it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from stead.extend import Provider, Tool
from stead.flows import FlowPath, FlowStep, PayloadRules
from stead.mcp import McpServer

__all__ = [
    "AgentDefinition",
    "ContextSection",
    "Limits",
    "MemorySettings",
    "NarrationSettings",
    "Permissions",
    "RealtimeSettings",
]

_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")


def _split(candidate: str) -> tuple[str, str]:
    """(prefix, rest) of `prefix:rest`; ("catalog", name) for a bare catalog name."""
    prefix, sep, rest = candidate.partition(":")
    if sep and prefix and rest:
        return prefix, rest
    return "catalog", candidate


class Limits(BaseModel):
    """Per-run limits (guardrails). Exceeding one ends the run `failed` with the limit recorded."""

    model_config = ConfigDict(extra="forbid")

    max_iterations: int | None = Field(default=None, ge=1)
    """Model requests (inferences) per run."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Input + output tokens per run."""
    max_cost: float | None = Field(default=None, gt=0)
    """USD per run (needs a provider that reports cost)."""
    max_wall_seconds: float | None = Field(default=None, gt=0)
    """Seconds since the run started (its activation)."""
    max_calls: dict[str, int] = Field(default_factory=dict)
    """Tool (or sub-agent) name → the most calls of it per run; further calls get an error result."""

    @pydantic.field_validator("max_calls")
    @classmethod
    def _positive(cls, value: dict[str, int]) -> dict[str, int]:
        for name, n in value.items():
            if n < 0:
                raise ValueError(f"max_calls[{name!r}] must be 0 or more, not {n}")
        return value

    @property
    def empty(self) -> bool:
        return (
            self.max_iterations is None
            and self.max_tokens is None
            and self.max_cost is None
            and self.max_wall_seconds is None
            and not self.max_calls
        )


class MemorySettings(BaseModel):
    """What long-term memory does for the agent (a definition with it turns memory on in the system that
    loads it, as `stead.open(..., memory=True)`; docs/memory.md):
    before each run, up to `notes` notes and `examples` examples chosen by `strategy` for the run's user,
    plus passages from the pre-execution `sources`, injected as quoted data after the instructions;
    `write: true` offers the guarded `remember` tool."""

    model_config = ConfigDict(extra="forbid")

    notes: int = Field(default=5, ge=0, le=50)
    examples: int = Field(default=3, ge=0, le=20)
    strategy: Literal["relevant", "recent", "priority"] = "relevant"
    write: bool = False
    sources: list[str] = Field(default_factory=list)
    """Names of retrieval sources given to `stead.open(memory=MemoryConfig(sources={...}))`."""


class Permissions(BaseModel):
    """Allow / ask / deny rules by tool name (shell patterns), over the permission-mode table: deny wins,
    then ask, then allow (docs/approvals.md)."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)


class ContextSection(BaseModel):
    """How the agent keeps its conversation inside the model's window (docs/context.md)."""

    model_config = ConfigDict(extra="forbid")

    window: int | None = Field(default=None, ge=256)
    """The model's window in tokens (default: the catalog's `context_window`)."""
    reserve: int | None = Field(default=None, ge=0)
    """Tokens kept free for the answer: compact when a request would exceed window − reserve."""
    keep_recent_tokens: int | None = Field(default=None, ge=1)
    """Recent history kept verbatim after a summary (default: a quarter of the window)."""
    compaction_model: str | None = None
    """A model string of the one grammar that writes the summaries (default: the agent's own model)."""
    expire_tool_results_after_turns: int | None = Field(default=None, ge=0)
    """Tool results older than this many responses become stubs (`recall_tool_result` expands them)."""
    max_tool_result_chars: int | None = Field(default=None, ge=1)
    """Tool results longer than this are cut when they enter the conversation."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """The cap of each of the agent's responses (default: the catalog's output limit for its model; never
    more than the window minus the request)."""

    @pydantic.model_validator(mode="after")
    def _reserve_fits(self) -> ContextSection:
        if self.window is not None and self.reserve is not None and self.reserve >= self.window:
            raise ValueError(f"reserve ({self.reserve}) must be less than the window ({self.window})")
        return self


class NarrationSettings(BaseModel):
    """Spoken progress of running delegations: deduplicated digests of at most `max_items` updates, the
    first no earlier than `first_after` seconds into a burst of progress, then at least `every` apart."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    first_after: float = Field(default=5.0, ge=0)
    every: float = Field(default=8.0, ge=0)
    max_items: int = Field(default=4, ge=1)


class DelegationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cancel_on_interruption: bool = True
    """Barge-in (the user starts speaking, or types while the agent speaks) aborts running delegations."""


class RealtimeSettings(BaseModel):
    """A layer of a realtime agent's settings (definition < target agent < runtime override; objects merge
    key by key, lists and values replace)."""

    model_config = ConfigDict(extra="forbid")

    model: str | list[str] | None = None
    """A model preference that overrides the definition's `model` (same grammar)."""
    voice: str | None = None
    """The model's voice (OpenAI: `marin`, `cedar`, ...)."""
    output: Literal["text", "audio"] = "text"
    """What the model answers with; audio responses also carry their transcript."""
    transcription: str | None = "gpt-4o-mini-transcribe"
    """The model transcribing the user's speech (None: no user transcripts of audio)."""
    turn_detection: dict[str, Any] | None = None
    """Server turn detection (OpenAI `turn_detection` object); None: the model's default."""
    narration: NarrationSettings = Field(default_factory=NarrationSettings)
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)
    session: dict[str, Any] = Field(default_factory=dict)
    """Further session fields passed to the model as they are (e.g. `max_output_tokens`)."""


class AgentDefinition(BaseModel):
    """An agent definition. Build it with `stead.definitions.load_definition(path)` (one file) or
    `stead.definitions.load_registry(directory)` (a team whose members reference each other)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Lowercase letters, digits, `_` and `-` (at most 64)."""
    description: str | None = None
    type: Literal["loop", "flow", "realtime"] = "loop"
    """`loop`: the model decides, calling tools until it answers. `flow`: a deterministic graph of `steps`
    and `paths` (docs/flows.md). `realtime`: a duplex voice or text session
    (`system.realtime(definition=...)`) that hands work to its `target_agents`."""
    instructions: str = ""
    """A Jinja2 template (sandboxed, undefined names are errors). It sees `agent.name`,
    `agent.description`, `tools` and `sub_agents` (each with `name` and `description`) and `data` (the
    runtime data given to `system.create(definition=..., data=...)`)."""
    model: str | list[str] | None = Field(default=None, validate_default=True)
    """A model string of the one grammar (`stead.providers.router`): `scripted:model.yaml` (a scripted model
    file, relative to the definition), `openai:gpt-4.1-mini`, `ollama:llama3.2`,
    `openai-compatible:MODEL@URL`, a bare catalog name (`claude-sonnet-4-6`), or `NAME:MODEL` for a
    provider registered with `stead.open(providers={NAME: ...})` — or a list of them: ordered candidates,
    the first usable when the agent is created is used. Checked against that grammar when the file is
    loaded; keys are checked when an agent is created. Required, except for a flow without prompt steps."""
    tools: list[str] = Field(default_factory=list)
    """Import paths: `package.module:name` or `file.py:name` (relative to the definition file)."""
    sub_agents: list[str] = Field(default_factory=list)
    """Names of other definitions (in the same registry) this agent may delegate to; each appears to the
    model as a tool named after it."""
    target_agents: list[str] = Field(default_factory=list)
    """`realtime` only: the durable agents (definition names) the session may hand work to with
    `invoke_target_agent`."""
    realtime: RealtimeSettings | None = None
    """Realtime settings: on a `realtime` definition its own; on a target agent a layer over them."""
    limits: Limits = Field(default_factory=Limits)
    memory: MemorySettings | None = None
    """Long-term memory settings (absent: the system's memory defaults, which give none by default)."""
    permissions: Permissions = Field(default_factory=Permissions)
    """Rules over the permission-mode policy for this agent's tool calls (docs/approvals.md)."""
    mcp: list[McpServer] = Field(default_factory=list)
    """MCP servers whose tools this agent is offered as `SERVER__TOOL` (docs/mcp.md)."""
    context: ContextSection = Field(default_factory=ContextSection)
    model_options: dict[str, Any] = Field(default_factory=dict)
    """Request options sent with every model request, mapped per vendor (docs/providers.md "Model
    options"): `tool_choice` (`auto`, `required`, `none` or one of the agent's tools), `temperature`,
    `top_p`, `top_k`, `max_tokens`, `seed`, `stop`, `presence_penalty`, `frequency_penalty`. Unknown keys,
    wrong types and options a candidate's vendor does not take are refused when the file loads."""
    output: dict[str, Any] | None = None
    """`loop` only: a JSON schema (type, required, properties, items, enum, additionalProperties) of every
    run's result (typed results): asked of the model as the vendor's native structured output; an answer
    that does not fit fails the run; `RunResult.output` is the parsed value."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form data kept with the definition (not shown to the model)."""
    # ---- flows (type: flow), payloads and built-in tools: docs/flows.md
    steps: list[FlowStep] = Field(default_factory=list, validate_default=True)
    """`type: flow`: the steps (tool, sub_agent, prompt, for_each, while)."""
    paths: list[FlowPath] = Field(default_factory=list)
    """`type: flow`: the paths between steps (`from`, `to`, optional `when`, `priority`)."""
    result: str | None = None
    """`type: flow`: an expression for the run's final text (default: the last step's output)."""
    payload: PayloadRules | None = None
    """Which payload paths this agent's prompt sees (`read`) and which it may change (`write`)."""
    builtin_tools: list[Literal["scratchpad", "pipeline", "artifacts", "payload"]] = Field(
        default_factory=list
    )
    """Opt-in built-in tools for a loop agent: `scratchpad` (private notes and tasks), `pipeline`
    (server-side dataflows), `artifacts` (large outputs paged by id), `payload` (read and change the
    payload)."""

    _source: Path | None = PrivateAttr(default=None)
    _tools: list[Tool] = PrivateAttr(default_factory=list)
    _providers: dict[str, Provider] = PrivateAttr(default_factory=dict)
    """The scripted model files among the candidates, loaded with the definition (by candidate)."""
    _template: Any = PrivateAttr(default=None)
    _instructions_line: int = PrivateAttr(default=1)
    _result: Any = PrivateAttr(default=None)
    _compiled: bool = PrivateAttr(default=False)
    """Whether the flow parts (expressions, payload rules) were compiled (`stead.flows._loader`)."""

    @pydantic.field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a valid name: use 1-64 lowercase letters, digits, '_' or '-'")
        return value

    @pydantic.field_validator("type", mode="before")
    @classmethod
    def _check_type(cls, value: Any) -> Any:
        if value not in ("loop", "flow", "realtime"):
            raise ValueError(f"unknown agent type {value!r}; use 'loop', 'flow' or 'realtime'")
        return value

    # Checks that depend on the type are field validators (they see the fields declared before them in
    # `info.data`), so that an error points at the line of the key it is about.
    @pydantic.field_validator("steps", "paths", "result", "builtin_tools", "instructions")
    @classmethod
    def _check_for_type(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        kind = info.data.get("type")
        name = info.field_name
        if name in ("steps", "paths", "result") and value and kind not in (None, "flow"):
            raise ValueError(f"only a flow (type: flow) has {name}")
        if kind == "flow":
            if name == "steps" and not value:
                raise ValueError("a flow (type: flow) needs at least one step")
            if name == "instructions" and value:
                raise ValueError(
                    "a flow has no instructions of its own: each prompt step has its own 'prompt'"
                )
            if name == "builtin_tools" and value:
                raise ValueError("built-in tools are for loop agents (a flow calls tools from its steps)")
        return value

    @pydantic.field_validator("model")
    @classmethod
    def _check_model(
        cls, value: str | list[str] | None, info: pydantic.ValidationInfo
    ) -> str | list[str] | None:
        if value is None:
            if info.data.get("type") not in (None, "flow"):
                raise ValueError("required field is missing")
            return value
        candidates = [value] if isinstance(value, str) else value
        if not candidates:
            raise ValueError("needs at least one model candidate (e.g. 'openai:gpt-4.1-mini')")
        for candidate in candidates:
            if not candidate.strip():
                raise ValueError("a model candidate is empty")
        return value

    @pydantic.field_validator("model_options", mode="before")
    @classmethod
    def _check_model_options(cls, value: Any) -> Any:
        # the keys and values are checked by the loader (each error at its key's line)
        return {} if value is None else value

    @pydantic.field_validator("output")
    @classmethod
    def _check_output(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if value is not None and info.data.get("type") not in (None, "loop"):
            raise ValueError("output (a typed result's schema) is for loop agents; a flow has result")
        return value

    @pydantic.model_validator(mode="after")
    def _check_realtime(self) -> AgentDefinition:
        if self.type == "realtime":
            if not self.target_agents:
                raise ValueError("a realtime agent needs target_agents (the agents it hands work to)")
            if self.sub_agents:
                raise ValueError("a realtime agent hands work to target_agents, not sub_agents")
        elif self.target_agents:
            raise ValueError("target_agents is for realtime agents (type: realtime)")
        return self

    @pydantic.field_validator("sub_agents")
    @classmethod
    def _check_sub_agents(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a valid agent name")
            if name in seen:
                raise ValueError(f"{name!r} is listed twice")
            seen.add(name)
        return value

    # ------------------------------------------------------------------ resolved by the loader
    @property
    def source(self) -> Path | None:
        """The file this definition was loaded from."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """The directory relative paths (tools, scripted models) resolve against."""
        return self._source.parent if self._source is not None else Path.cwd()

    @property
    def candidates(self) -> list[str]:
        """The model candidates in order of preference (none for a flow without a model)."""
        if self.model is None:
            return []
        return [self.model] if isinstance(self.model, str) else list(self.model)

    @property
    def provider_name(self) -> str:
        """The prefix of the first (preferred) model candidate (`catalog` for a bare catalog name)."""
        return _split(self.candidates[0])[0]

    @property
    def model_name(self) -> str:
        """What follows that prefix in the first candidate (the whole name for a bare catalog name)."""
        return _split(self.candidates[0])[1]

    @property
    def resolved_tools(self) -> list[Tool]:
        """The imported tools, in the order the definition lists them."""
        return list(self._tools)
