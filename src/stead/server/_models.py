"""Request and response models of the HTTP service (they are its OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AbortOut",
    "Accepted",
    "AgentList",
    "AgentOut",
    "AgentSummary",
    "ApprovalList",
    "ApprovalOut",
    "BatchAccepted",
    "BatchIn",
    "BlockOut",
    "CreateAgent",
    "DecisionIn",
    "DecisionOut",
    "Health",
    "MessageIn",
    "MessageList",
    "MessageOut",
    "QueueOut",
    "QueuedOut",
    "RunList",
    "RunOut",
    "RunTree",
    "SessionIn",
    "SessionOut",
    "Settings",
    "StepList",
    "StepOut",
]

ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,128}$"
Id = Annotated[str, Field(pattern=ID_PATTERN, min_length=1, max_length=128)]
AgentState = Literal["idle", "working", "waiting", "blocked", "stopped"]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Settings(_In):
    """Per-message settings: they take effect when the message is consumed (C3)."""

    provider: str | None = Field(default=None, max_length=200)
    model: str | list[str] | None = Field(default=None, description="A model string, or candidates.")
    effort: str | None = Field(default=None, max_length=50)
    permission_mode: str | None = Field(default=None, max_length=50)
    profile: str | None = Field(default=None, max_length=200)


class CreateAgent(_In):
    """Create an agent from a definition (`definition`, `data`) or from settings (`model`, `instructions`,
    `tools`, …). With `id`, the same id and the same body again is 200 with the existing agent; the same id
    with another body is 409."""

    id: Id | None = None
    definition: str | None = Field(default=None, min_length=1, max_length=200)
    data: dict[str, Any] | None = None
    name: str | None = Field(default=None, max_length=200)
    provider: str | None = Field(default=None, max_length=200)
    model: str | list[str] | None = None
    instructions: str | None = None
    tools: list[str] | None = None
    steering_mode: Literal["one-at-a-time", "all"] | None = None
    send_mode: Literal["one-at-a-time", "all"] | None = None
    permission_mode: str | None = Field(default=None, max_length=50)


class AgentSummary(BaseModel):
    id: str
    name: str | None
    active: bool = Field(description="Whether the agent owes work.")
    created_at: float


class AgentList(BaseModel):
    items: list[AgentSummary]
    next_cursor: str | None = Field(description="Pass as `after` for the next page; null on the last.")


class AgentOut(BaseModel):
    id: str
    name: str | None
    tenant: str
    state: AgentState
    active: bool
    created_at: float
    provider: str
    model: str | list[str]
    instructions: str
    tools: list[str]
    definition: str | None = Field(description="The definition it was built from, if any.")
    settings: dict[str, Any] = Field(description="The effective settings (provider, model, …).")
    event_seq: int = Field(description="The last durable event's `seq` (0: none yet).")


class TextIn(_In):
    type: Literal["text", "reasoning"]
    text: str


class MessageIn(_In):
    """One message. `id` (or the `Idempotency-Key` header) makes retries safe: a repeated id is
    200 `created:false`; the same id with another body is 422."""

    id: Id | None = None
    mode: Literal["send", "steer"] = Field(
        default="send", description="`send`: when the agent would stop; `steer`: at the next boundary."
    )
    role: Literal["user", "system"] = "user"
    content: str | list[TextIn] = Field(description="Text, or text blocks.")
    metadata: dict[str, Any] | None = None
    settings: Settings | None = None
    if_busy: Literal["queue", "reject"] = Field(
        default="queue", description="`reject`: 409 `agent_busy` if the agent owes work."
    )


class BatchItem(_In):
    id: Id | None = None
    mode: Literal["send", "steer"] = "send"
    role: Literal["user", "system"] = "user"
    content: str | list[TextIn]
    metadata: dict[str, Any] | None = None
    settings: Settings | None = None


class BatchIn(_In):
    """Several messages accepted in one transaction: all of them or none (A1)."""

    messages: list[BatchItem] = Field(min_length=1, max_length=100)
    if_busy: Literal["queue", "reject"] = "queue"


class Accepted(BaseModel):
    message_id: str
    created: bool = Field(description="False: this id was accepted before (a retry); nothing new queued.")
    mode: Literal["send", "steer"]
    agent_state: AgentState
    events_after: int = Field(
        description="Stream `/events?after=` this value to see everything this message causes."
    )


class BatchResult(BaseModel):
    message_id: str
    created: bool
    mode: Literal["send", "steer"]


class BatchAccepted(BaseModel):
    messages: list[BatchResult]
    agent_state: AgentState
    events_after: int


class TextBlock(BaseModel):
    type: Literal["text"]
    text: str


class ReasoningBlock(BaseModel):
    type: Literal["reasoning"]
    text: str
    redacted: bool = False


class ToolCallBlock(BaseModel):
    type: Literal["tool_call"]
    id: str | None
    name: str
    arguments: dict[str, Any] | str


class ToolResultBlock(BaseModel):
    type: Literal["tool_result"]
    call_id: str
    output: str
    is_error: bool


BlockOut = Annotated[
    TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock, Field(discriminator="type")
]
"""A content block: `text`, `reasoning`, `tool_call` or `tool_result`."""


class UsageOut(BaseModel):
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float | None


class MessageOut(BaseModel):
    index: int = Field(description="Position in the history (pass as `after` to page).")
    id: str | None
    role: Literal["user", "assistant", "tool", "system"]
    content: list[BlockOut]
    text: str
    metadata: dict[str, Any] | None
    usage: UsageOut | None


class MessageList(BaseModel):
    items: list[MessageOut]
    next_cursor: int | None


class QueuedOut(BaseModel):
    id: str
    mode: Literal["send", "steer"]
    role: Literal["user", "system"]
    content: list[BlockOut]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]


class QueueOut(BaseModel):
    items: list[QueuedOut] = Field(description="In the order the agent takes them.")


class AbortOut(BaseModel):
    agent_state: AgentState
    events_after: int


class StepOut(BaseModel):
    id: str
    run_id: str
    number: int
    type: str
    name: str | None
    status: str
    started_at: float
    completed_at: float | None
    duration: float | None
    target: str | None
    target_run_id: str | None
    error: str | None
    input: Any = None
    output: Any = None


class RunOut(BaseModel):
    id: str
    agent_id: str
    agent_name: str | None
    parent_run_id: str | None
    parent_step_id: str | None
    status: str
    started_at: float
    completed_at: float | None
    duration: float | None
    error: str | None
    final_message: str | None
    input_tokens: int = Field(description="Including descendants.")
    output_tokens: int
    cached_tokens: int
    cost: float
    own_input_tokens: int
    own_output_tokens: int
    own_cost: float
    iterations: int
    restarts: int
    breadcrumb: str | None


class RunList(BaseModel):
    items: list[RunOut]
    next_cursor: str | None


class StepList(BaseModel):
    items: list[StepOut]


class RunTree(RunOut):
    steps: list[StepOut]
    children: list[RunTree]


class SessionIn(_In):
    token: str = Field(min_length=1, max_length=4096)


class SessionOut(BaseModel):
    tenant: str
    scopes: list[str]
    auth_required: bool


class Health(BaseModel):
    status: Literal["ok"]
    checks: dict[str, str] = Field(default_factory=dict)


ApprovalStatusOut = Literal["pending", "approved", "rejected", "expired", "cancelled"]


class ApprovalOut(BaseModel):
    """One request for a human decision on one tool call (`stead.Approval`). While `status` is `pending`
    the call has not started."""

    id: str
    agent_id: str
    run_id: str
    root_run_id: str = Field(description="The root run of the delegation tree (the run itself for a root).")
    call_id: str
    tool: str
    arguments: Any = Field(description="The model's arguments.")
    effects: str = Field(description="`read`, `write` or `external`: what the tool declares it touches.")
    destructive: bool
    mode: str = Field(description="The permission mode the call was dispatched under.")
    reason: str = Field(description="Why the policy asked.")
    status: ApprovalStatusOut
    note: str | None = Field(description="The decision's reason (or the kernel's, for a steer or abort).")
    edited_arguments: Any = Field(
        default=None, description="The reviewer's arguments, when approved with changes."
    )
    decided_by: str | None
    created_at: float
    decided_at: float | None
    expires_at: float | None


class ApprovalList(BaseModel):
    items: list[ApprovalOut]
    next_cursor: str | None = Field(description="Pass as `after` for the next page; null on the last.")


class DecisionIn(_In):
    """Decide a pending approval: `approve` (the call runs once, with `edited_arguments` instead of the
    model's when given — validated against the tool's schema first) or `deny` (the call's error result
    "rejected by reviewer: <reason>" commits with the decision)."""

    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=4000, description="Kept as the decision's note.")
    edited_arguments: dict[str, Any] | None = Field(
        default=None, description="Only with `approve`: the arguments the call runs with."
    )


class DecisionOut(BaseModel):
    approval: ApprovalOut
    decided: bool = Field(
        description="True: this request made the decision. False: the same decision had been made before "
        "(a retry); `approval` is the stored one."
    )
