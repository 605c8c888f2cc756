"""Held and refused tool calls: the batch-entry state through which a layer above the kernel gates calls.

At dispatch (T1), inside the batch's own transaction, the `gate_call_tx` hooks may answer each call with a
`Gate`: `ask` (hold the call for a decision: a human approval) or `deny` (refuse it: its error result
commits in call order and it never runs). The gate is stored on the call's batch entry, so it is exactly as
durable as the batch:

    absent   the call runs as usual (T2–T5)
    ask      held: the call has not started and never starts before a decision; after a crash it is still
             held (it cannot be in doubt, because it never began)
    deny     refused: the error result `text`, committed in call order without running
    go       approved and not started: the next stage claims it (one commit, state `run`) and runs it once
             under the tool's own flags; a crash before the claim leaves it `go`
    run      approved and claimed: an ordinary unfinished call from then on (in doubt after a crash unless
             the tool is durable or transactional); `note` prefixes its result (edited arguments)

The decisions that move a held call on (`stead.core.decide`) run in the decider's transaction: a release
makes it `go`; a refusal (reject, expiry, a steered message, an abort) commits its one error result (T3).
The kernel knows nothing of policies or approvals beyond this state; `stead.policy` decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from stead.core.codec import decode_fields, encode_fields, stored
from stead.core.records import TOOL
from stead.messages import ToolCall, dumps, encode_block
from stead.store.base import Tx

__all__ = ["GATE_KEY", "Gate", "GateState", "call_gates", "decode_gates", "encode_entry"]

GateState = Literal["ask", "deny", "go", "run"]
GATE_KEY = "w"
"""The field of a batch entry (an encoded tool call) that holds its gate."""


@dataclass(frozen=True, slots=True)
class Gate:
    """How the layer above gates one call of a batch. Build with `Gate.ask(...)` or `Gate.deny(...)`."""

    state: GateState = stored("s")
    text: str = stored("x", default="", decode=str, omit_empty=True)
    """`deny`: the error result the call gets. `ask`: why a decision is needed (shown to reviewers)."""
    ref: str | None = stored("r", default=None)
    """The deciding layer's own id for this call (an approval id); carried on events."""
    note: str | None = stored("n", default=None)
    """`go`/`run`: a line the result starts with (e.g. that a reviewer edited the arguments)."""

    @staticmethod
    def ask(reason: str, ref: str | None = None) -> Gate:
        """Hold the call until a decision (`Agent.release_call` / `Agent.refuse_call`)."""
        return Gate("ask", reason, ref)

    @staticmethod
    def deny(text: str) -> Gate:
        """Refuse the call: `text` becomes its error result, committed in call order; it never runs."""
        return Gate("deny", text)

    @property
    def held(self) -> bool:
        return self.state == "ask"

    def but(self, **changes: Any) -> Gate:
        return replace(self, **changes)

    def encode(self) -> dict[str, Any]:
        return encode_fields(self)

    @staticmethod
    def decode(data: Any) -> Gate | None:
        if not isinstance(data, dict) or data.get("s") not in ("ask", "deny", "go", "run"):
            return None
        return decode_fields(Gate, data)


def encode_entry(call: ToolCall, gate: Gate | None) -> str:
    """The stored batch entry of `call` (its encoded block, plus its gate if any)."""
    d = encode_block(call)
    if gate is not None:
        d[GATE_KEY] = gate.encode()
    return dumps(d)


def decode_gates(entries: list[tuple[str, str]]) -> dict[str, Gate]:
    """Call id → gate, for the gated entries of a stored batch (most batches have none)."""
    out: dict[str, Gate] = {}
    for _key, raw in entries:
        if f'"{GATE_KEY}":' not in raw:
            continue
        d = json.loads(raw)
        gate = Gate.decode(d.get(GATE_KEY))
        if gate is not None and d.get("i"):
            out[str(d["i"])] = gate
    return out


async def call_gates(tx: Tx, agent_id: str) -> dict[str, Gate]:
    """Call id → gate of every gated call in `agent_id`'s current batch, read inside `tx`: what a layer above
    the kernel (the HTTP service) asks of held calls without parsing the kernel's batch entries itself."""
    return decode_gates(await tx.read_prefix(agent_id, TOOL))
