"""The kernel's durable layout: per-agent keys, the pending record, and history records.

Keys (per agent, sorted):
    pending                       present iff the agent owes work (the one liveness signal, R1)
    msg.<id>                      acceptance identity: a repeated id is ignored (A3)
    q.<kind>.<slot:014>.<seq:06>  queued input; kind is `steer` or `send` (C2)
    settings                      effective per-message settings (C3)
    usage                         the last inference's usage (S4)
    tool.<index:04>.<call id>     one entry per call of the dispatched batch (T1)
    kv.c.<call id>.<key>          call-bound KV (T7); kv.r.<key> run KV; kv.a.<key> agent KV

History records (JSON, append-only):
    {"k":"u","id":..,"r":"user"|"system","c":[blocks],"m":metadata}   consumed input
    {"k":"b","i":inference id,"b":block[,"u":usage]}                    one completed assistant block
    {"k":"t","b":tool result block}                                     one tool result
    {"k":"s","x":text}                                                  a system note (e.g. a failed turn)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from stead.messages import (
    Block,
    Message,
    Role,
    Text,
    ToolResult,
    Usage,
    decode_block,
    decode_usage,
    dumps,
)

__all__ = ["PENDING", "Pending", "Queued", "build_messages", "queue_key"]

PENDING = "pending"
SETTINGS = "settings"
USAGE = "usage"
QUEUE = "q."
STEER = "q.steer."
SEND = "q.send."
TOOL = "tool."
CALL_KV = "kv.c."
RUN_KV = "kv.r."


def msg_key(message_id: str) -> str:
    return f"msg.{message_id}"


def queue_key(prefix: str, slot: int, seq: int) -> str:
    return f"{prefix}{slot:014d}.{seq:06d}"


def tool_key(index: int, call_id: str) -> str:
    return f"{TOOL}{index:04d}.{call_id}"


@dataclass(frozen=True, slots=True)
class Pending:
    """The durable "owes work" record. `inference` is set when a response is owed (R2)."""

    stage: str
    run_id: str
    turn_id: str | None = None
    inference_id: str | None = None
    activated_at: float = 0.0

    def encode(self) -> str:
        return dumps(
            {
                "st": self.stage,
                "run": self.run_id,
                "turn": self.turn_id,
                "inf": self.inference_id,
                "at": self.activated_at,
            }
        )

    @staticmethod
    def decode(raw: str | None) -> Pending | None:
        """An unreadable record counts as absent (R1)."""
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            return Pending(str(d["st"]), str(d["run"]), d.get("turn"), d.get("inf"), float(d.get("at", 0.0)))
        except (ValueError, KeyError, TypeError):
            return None

    def but(self, **changes: Any) -> Pending:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Queued:
    """A message waiting in a queue."""

    key: str
    id: str
    role: Role
    content: list[dict[str, Any]]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]

    @property
    def delivery(self) -> str:
        return "steer" if self.key.startswith(STEER) else "send"

    def encode(self) -> str:
        d: dict[str, Any] = {"id": self.id, "r": self.role, "c": self.content}
        if self.metadata:
            d["m"] = self.metadata
        if self.settings:
            d["s"] = self.settings
        return dumps(d)

    @staticmethod
    def decode(key: str, raw: str) -> Queued:
        d = json.loads(raw)
        return Queued(key, d["id"], d["r"], d["c"], d.get("m"), d.get("s") or {})

    def history_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"k": "u", "id": self.id, "r": self.role, "c": self.content}
        if self.metadata:
            rec["m"] = self.metadata
        return rec


def build_messages(records: list[dict[str, Any]]) -> list[Message]:
    """Rebuild the conversation from history records: consecutive blocks of one inference form one
    assistant message; consecutive tool results form one tool message."""
    out: list[Message] = []
    blocks: list[Block] = []
    block_inf: str | None = None
    usage: Usage | None = None
    results: list[Block] = []

    def flush() -> None:
        nonlocal blocks, block_inf, usage, results
        if blocks:
            out.append(Message("assistant", blocks, usage=usage))
        if results:
            out.append(Message("tool", results))
        blocks, block_inf, usage, results = [], None, None, []

    for rec in records:
        kind = rec["k"]
        if kind == "b":
            if results or (blocks and rec["i"] != block_inf):
                flush()
            block_inf = rec["i"]
            blocks.append(decode_block(rec["b"]))
            if "u" in rec:
                usage = decode_usage(rec["u"])
        elif kind == "t":
            if blocks:
                out.append(Message("assistant", blocks, usage=usage))
                blocks, block_inf, usage = [], None, None
            results.append(decode_block(rec["b"]))
        else:
            flush()
            if kind == "u":
                out.append(
                    Message(
                        rec["r"], [decode_block(b) for b in rec["c"]], id=rec["id"], metadata=rec.get("m")
                    )
                )
            elif kind == "s":
                out.append(Message("system", [Text(rec["x"])]))
    flush()
    return out


def result_record(result: ToolResult) -> dict[str, Any]:
    d: dict[str, Any] = {"k": "t", "b": {"t": "r", "i": result.call_id, "o": result.output}}
    if result.is_error:
        d["b"]["e"] = 1
    return d
