"""The kernel's durable layout: per-agent keys, the pending record, and history records.

Keys (per agent, sorted):
    pending                       present iff the agent owes work (the one liveness signal, R1); stage
                                  `inference`, `tools` or `compaction` (with the compaction's reason)
    msg.<id>                      acceptance identity: a repeated id is ignored (A3)
    q.<kind>.<slot:014>.<seq:06>  queued input; kind is `steer` or `send` (C2)
    q.compact                     a requested compaction (`agent.compact()`), until carried out or rejected
    compaction                    consecutive failed compactions (the circuit breaker, K1)
    settings                      effective per-message settings (C3)
    usage                         the last inference's usage (S4)
    tool.<index:04>.<call id>     one entry per call of the dispatched batch (T1)
    kv.c.<call id>.<key>          call-bound KV (T7); kv.r.<key> run KV; kv.a.<key> agent KV
    kv.r.payload                  the run's JSON payload (from the activating message's `stead.payload`)
    kv.r.output_schema            the run's output schema (the activating message's `stead.output_schema`)
    kv.r.context                  the run's context from the `run_context` hooks (R4), erased at settlement

History records (JSON, append-only):
    {"k":"u","id":..,"r":"user"|"system","c":[blocks],"m":metadata,"run":run id[,"us":user,"tn":tenant]}
                                                                        consumed input
    {"k":"b","i":inference id,"b":block[,"u":usage][,"f":"length"]}     one completed assistant block
    {"k":"t","b":tool result block}                                     one tool result
    {"k":"s","x":text}                                                  a system note (e.g. a failed turn)
    {"k":"e","run":run id,"o":outcome[,"x":error][,"p":payload]}        the end of a run (settlement)
    {"k":"c","id":compaction id,"n":records written,[,"x":summary],...} the first record after a compaction

A compaction (`stead.core.compaction`) moves the whole history to the archive and writes `[c, *kept]`;
`n` counts those records, so the archive plus the current history give back every record in its original
order (`full_records`). A kept record a compaction shortened carries `"cut"` (the original's length).

The end-of-run record and the run id on consumed input are the kernel's durable link message → run →
outcome (`stead.core.results`); they are not part of the conversation: `build_messages` skips end records
and ignores the run id, so the provider context is what it was without them (R4). Records written before
they existed (no `run`, no end record) still load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from stead.core.codec import Stored, encode_fields, stored
from stead.core.outcome import Outcome
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
    encode_block,
    encode_usage,
)

__all__ = [
    "PENDING",
    "BlockRecord",
    "CompactionRecord",
    "EndRecord",
    "HistoryRecord",
    "InputRecord",
    "MessageBuilder",
    "NoteRecord",
    "OtherRecord",
    "Pending",
    "Queued",
    "ResultRecord",
    "build_messages",
    "decode_record",
    "end_record",
    "full_records",
    "input_record",
    "queue_key",
]

PENDING = "pending"
SETTINGS = "settings"
USAGE = "usage"
QUEUE = "q."
STEER = "q.steer."
SEND = "q.send."
TOOL = "tool."
CALL_KV = "kv.c."
RUN_KV = "kv.r."
COMPACT = "q.compact"
COMPACTION = "compaction"
SUMMARY_HEADING = "Summary of the earlier conversation (older messages were compacted):"
PAYLOAD = "kv.r.payload"
"""The run's payload (a JSON object): written at activation from the activating message's metadata
(`PAYLOAD_METADATA`), changed by higher layers (flows, payload tools) in the transactions of their steps, and
copied into the end-of-run record at settlement (`RunResult.payload`)."""
PAYLOAD_METADATA = "stead.payload"
"""Message metadata key carrying a run's starting payload (`agent.send(..., payload=...)`)."""
OUTPUT_SCHEMA = "kv.r.output_schema"
"""The run's own output schema (from the activating message's `stead.output_schema`), erased at
settlement."""
RUN_CONTEXT = "kv.r.context"
"""The run's context (`stead.RunContext`, written with the first durable write of its first inference)."""


def msg_key(message_id: str) -> str:
    return f"msg.{message_id}"


def queue_key(prefix: str, slot: int, seq: int) -> str:
    return f"{prefix}{slot:014d}.{seq:06d}"


def tool_key(index: int, call_id: str) -> str:
    return f"{TOOL}{index:04d}.{call_id}"


@dataclass(frozen=True, slots=True)
class Pending:
    """The durable "owes work" record. `inference` is set when a response is owed (R2). In stage
    `compaction`, `compaction` is why (`auto`, `requested`, `overflow`).

    `user` and `tenant` are those of the message whose acceptance activated the run (the run's first
    message): every hook and tool of the run sees them, before and after a restart."""

    stage: str
    run_id: str
    turn_id: str | None = None
    inference_id: str | None = None
    activated_at: float = 0.0
    compaction: str | None = None
    user: str | None = None
    tenant: str | None = None
    structured: bool = False
    """The run has its own output schema (`OUTPUT_SCHEMA`, from the activating message)."""

    def encode(self) -> str:
        d: dict[str, Any] = {
            "st": self.stage,
            "run": self.run_id,
            "turn": self.turn_id,
            "inf": self.inference_id,
            "at": self.activated_at,
        }
        if self.compaction is not None:
            d["cm"] = self.compaction
        if self.user is not None:
            d["us"] = self.user
        if self.tenant is not None:
            d["tn"] = self.tenant
        if self.structured:
            d["os"] = 1
        return dumps(d)

    @staticmethod
    def decode(raw: str | None) -> Pending | None:
        """An unreadable record counts as absent (R1)."""
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            return Pending(
                str(d["st"]),
                str(d["run"]),
                d.get("turn"),
                d.get("inf"),
                float(d.get("at", 0.0)),
                d.get("cm"),
                d.get("us"),
                d.get("tn"),
                bool(d.get("os")),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def but(self, **changes: Any) -> Pending:
        # `dataclasses.replace` re-validates every field by name on each call: this runs several times a
        # response, so copy the fields directly (an unknown name still raises TypeError)
        fields: dict[str, Any] = {
            "stage": self.stage,
            "run_id": self.run_id,
            "turn_id": self.turn_id,
            "inference_id": self.inference_id,
            "activated_at": self.activated_at,
            "compaction": self.compaction,
            "user": self.user,
            "tenant": self.tenant,
            "structured": self.structured,
        }
        fields.update(changes)
        return Pending(**fields)


@dataclass(frozen=True, slots=True)
class Queued:
    """A message waiting in a queue."""

    key: str
    id: str
    role: Role
    content: list[dict[str, Any]]
    metadata: dict[str, Any] | None
    settings: dict[str, Any]
    user: str | None = None
    tenant: str | None = None

    @property
    def delivery(self) -> str:
        return "steer" if self.key.startswith(STEER) else "send"

    def encode(self) -> str:
        d: dict[str, Any] = {"id": self.id, "r": self.role, "c": self.content}
        if self.metadata:
            d["m"] = self.metadata
        if self.settings:
            d["s"] = self.settings
        if self.user is not None:
            d["us"] = self.user
        if self.tenant is not None:
            d["tn"] = self.tenant
        return dumps(d)

    @staticmethod
    def decode(key: str, raw: str) -> Queued:
        d = json.loads(raw)
        return Queued(key, d["id"], d["r"], d["c"], d.get("m"), d.get("s") or {}, d.get("us"), d.get("tn"))

    def message(self) -> Message:
        """The queued input as a message (what the model and the hooks see of it)."""
        return Message(
            self.role,
            [decode_block(b) for b in self.content],
            id=self.id,
            metadata=self.metadata,
            user=self.user,
            tenant=self.tenant,
        )

    def history_record(self, run_id: str | None = None) -> dict[str, Any]:
        """The consumed-input record; `run_id` is the run that consumed it (the link `agent.run` reads)."""
        return input_record(self.id, self.role, self.content, self.metadata, run_id, self.user, self.tenant)


class MessageBuilder:
    """Builds the conversation from history records, one record at a time.

    Consecutive blocks of one inference form one assistant message; consecutive tool results form one tool
    message; end-of-run records are skipped. Feeding records one by one gives exactly what
    `build_messages` gives for the whole list, so the runtime's mirror can extend the conversation as
    records commit instead of rebuilding it for every inference."""

    __slots__ = ("_blocks", "_cut", "_inf", "_out", "_results", "_usage")

    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self._out: list[Message] = []
        self._blocks: list[Block] = []
        self._inf: str | None = None
        self._usage: Usage | None = None
        self._cut = False
        self._results: list[Block] = []
        for rec in records or ():
            self.add(rec)

    def _assistant(self, blocks: list[Block]) -> Message:
        """An assistant message; one whose response was cut by its output cap says so in its metadata
        (`{"finish_reason": "length"}`, MR2)."""
        meta = {"finish_reason": "length"} if self._cut else None
        return Message("assistant", blocks, usage=self._usage, metadata=meta)

    def add(self, rec: dict[str, Any]) -> None:
        kind = rec["k"]
        if kind == "b":
            if self._results or (self._blocks and rec["i"] != self._inf):
                self._flush()
            self._inf = rec["i"]
            self._blocks.append(decode_block(rec["b"]))
            if "u" in rec:
                self._usage = decode_usage(rec["u"])
            if "f" in rec:
                self._cut = rec["f"] == "length"
        elif kind == "t":
            if self._blocks:
                self._out.append(self._assistant(self._blocks))
                self._blocks, self._inf, self._usage, self._cut = [], None, None, False
            self._results.append(decode_block(rec["b"]))
        elif kind == "e":
            return  # the end of a run: not part of the conversation
        else:
            self._flush()
            if kind == "c":
                if rec.get("x"):
                    self._out.append(summary_message(rec))
            elif kind == "u":
                self._out.append(
                    Message(
                        rec["r"],
                        [decode_block(b) for b in rec["c"]],
                        id=rec["id"],
                        metadata=rec.get("m"),
                        user=rec.get("us"),
                        tenant=rec.get("tn"),
                    )
                )
            elif kind == "s":
                self._out.append(Message("system", [Text(rec["x"])]))

    def _flush(self) -> None:
        if self._blocks:
            self._out.append(self._assistant(self._blocks))
        if self._results:
            self._out.append(Message("tool", self._results))
        self._blocks, self._inf, self._usage, self._results = [], None, None, []
        self._cut = False

    def messages(self) -> list[Message]:
        """The conversation so far (a new list; the builder keeps going)."""
        out = list(self._out)
        if self._blocks:
            out.append(self._assistant(list(self._blocks)))
        if self._results:
            out.append(Message("tool", list(self._results)))
        return out


def summary_message(rec: dict[str, Any]) -> Message:
    """The conversation's view of a compaction record with a summary: one system message."""
    return Message(
        "system",
        [Text(f"{SUMMARY_HEADING}\n\n{rec['x']}")],
        metadata={"stead.compaction": rec.get("id")},
    )


def full_records(archive: list[tuple[str, str]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every record the agent's history ever held, in order: the archived records followed by the current
    ones, each original once (the copies a compaction kept, possibly shortened, are replaced by their
    originals; each compaction's `c` record stands where the compaction happened)."""
    if not archive:
        return list(current)
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for cid, raw in archive:
        if not groups or groups[-1][0] != cid:
            groups.append((cid, []))
        groups[-1][1].append(json.loads(raw))
    out = list(groups[0][1])
    for (prev, _), recs in zip(groups, [g[1] for g in groups[1:]] + [current], strict=True):
        head = decode_record(recs[0]) if recs else None
        if isinstance(head, CompactionRecord) and head.id == prev:
            out.append(recs[0])
            out.extend(recs[head.n :])
        else:  # the history was reset (K2) after that compaction: nothing of it was kept
            out.extend(recs)
    return out


def build_messages(records: list[dict[str, Any]]) -> list[Message]:
    """Rebuild the conversation from history records: consecutive blocks of one inference form one
    assistant message; consecutive tool results form one tool message; end-of-run records are skipped."""
    return MessageBuilder(records).messages()


def end_record(run_id: str, outcome: Outcome, error: str | None, payload: Any = None) -> dict[str, Any]:
    """The end-of-run record settlement appends (not part of the conversation); `payload` is the run's
    payload as it ended (kept only when the run had one)."""
    rec: dict[str, Any] = {"k": "e", "run": run_id, "o": outcome.value}
    if error is not None:
        rec["x"] = error
    if payload is not None:
        rec["p"] = payload
    return rec


def result_record(result: ToolResult) -> dict[str, Any]:
    """The tool-result record (the block encoded inline: `encode_block`'s form, written once per result)."""
    d: dict[str, Any] = {"k": "t", "b": {"t": "r", "i": result.call_id, "o": result.output}}
    if result.is_error:
        d["b"]["e"] = 1
    if result.repaired:
        d["b"]["f"] = 1  # S5
    return d


def input_record(
    message_id: str,
    role: Role,
    content: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
    run_id: str | None = None,
    user: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The consumed-input record of stored blocks `content` (`Queued.history_record`, `InputRecord`)."""
    rec: dict[str, Any] = {"k": "u", "id": message_id, "r": role, "c": content}
    if metadata:
        rec["m"] = metadata
    if run_id is not None:
        rec["run"] = run_id
    if user is not None:
        rec["us"] = user
    if tenant is not None:
        rec["tn"] = tenant
    return rec


# ------------------------------------------------------------------------------------- typed records
# One dataclass per record kind, stored by the small codec (`stead.core.codec`): `decode(raw)` from the
# stored dict and `encode()` back to it (the same dict: `decode_record(raw).encode() == raw` for every
# record the kernel writes). For readers of the history off
# the hot path (compaction, run results, recall, plugins through `stead.extend`). The kernel's per-turn
# readers (`MessageBuilder`, the mirror, the context estimate) keep reading the dicts directly, and its
# hot writers build them directly (`result_record`, `input_record`, `stead.core.response.block_records`):
# an object per record there would cost every response; tests pin both to these classes.


class _Record(Stored):
    """A history record kind: `k` first, then its fields (`stead.core.codec`)."""

    __slots__ = ()

    KIND: ClassVar[str]

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"k": self.KIND}
        out.update(encode_fields(self))
        return out


def _blocks(raw: list[dict[str, Any]]) -> list[Block]:
    return [decode_block(b) for b in raw]


def _encoded_blocks(blocks: list[Block]) -> list[dict[str, Any]]:
    return [encode_block(b) for b in blocks]


def _tool_result(raw: dict[str, Any]) -> ToolResult:
    block = decode_block(raw)
    if not isinstance(block, ToolResult):
        raise ValueError(f"a tool-result record holds {block!r}")
    return block


def _value(outcome: Outcome) -> str:
    return outcome.value


@dataclass(frozen=True, slots=True)
class InputRecord(_Record):
    """`u`: consumed input — a user or system message, the run that consumed it, who sent it. `cut`: the
    characters a compaction clamped from its text."""

    id: str = stored("id")
    role: Role = stored("r")
    content: list[Block] = stored("c", encode=_encoded_blocks, decode=_blocks)
    metadata: dict[str, Any] | None = stored("m", default=None, omit_empty=True)
    run_id: str | None = stored("run", default=None)
    user: str | None = stored("us", default=None)
    tenant: str | None = stored("tn", default=None)
    cut: int | None = stored("cut", default=None)

    KIND: ClassVar[str] = "u"

    def message(self) -> Message:
        """The input as the conversation shows it."""
        return Message(
            self.role,
            list(self.content),
            id=self.id,
            metadata=self.metadata,
            user=self.user,
            tenant=self.tenant,
        )


@dataclass(frozen=True, slots=True)
class BlockRecord(_Record):
    """`b`: one completed assistant block of inference `inference_id`; the last block of a response carries
    its `usage` and, when the output cap cut it, `finish="length"`."""

    inference_id: str = stored("i")
    block: Block = stored("b", encode=encode_block, decode=decode_block)
    usage: Usage | None = stored("u", default=None, encode=encode_usage, decode=decode_usage)
    finish: str | None = stored("f", default=None)
    cut: int | None = stored("cut", default=None)

    KIND: ClassVar[str] = "b"


@dataclass(frozen=True, slots=True)
class ResultRecord(_Record):
    """`t`: one tool result. `cut`: the length of the whole output when a compaction shortened it (the
    original stays in the archive: `recall_tool_result`)."""

    result: ToolResult = stored("b", encode=encode_block, decode=_tool_result)
    cut: int | None = stored("cut", default=None)

    KIND: ClassVar[str] = "t"


@dataclass(frozen=True, slots=True)
class NoteRecord(_Record):
    """`s`: a system note (a failed turn, a handoff that opens a reset conversation)."""

    text: str = stored("x")
    cut: int | None = stored("cut", default=None)

    KIND: ClassVar[str] = "s"


@dataclass(frozen=True, slots=True)
class EndRecord(_Record):
    """`e`: the end of run `run_id` (settlement): its outcome, error and final payload."""

    run_id: str = stored("run", decode=str)
    outcome: Outcome = stored("o", default=Outcome.COMPLETED, always=True, encode=_value, decode=Outcome)
    error: str | None = stored("x", default=None)
    payload: Any = stored("p", default=None)

    KIND: ClassVar[str] = "e"


@dataclass(frozen=True, slots=True)
class CompactionRecord(_Record):
    """`c`: the first record after compaction `id`: `n` records were written (itself and the kept ones),
    why (`reason`), the summary when there is one, and the estimated tokens before and after."""

    id: str = stored("id")
    n: int = stored("n", default=1, always=True, decode=int)
    reason: str | None = stored("r", default=None)
    summary: str | None = stored("x", default=None)
    tokens_before: int | None = stored("tb", default=None)
    tokens_after: int | None = stored("ta", default=None)

    KIND: ClassVar[str] = "c"

    def message(self) -> Message | None:
        """The conversation's view of it: one system message with the summary (None without one)."""
        return summary_message(self.encode()) if self.summary else None


@dataclass(frozen=True, slots=True)
class OtherRecord:
    """A record of a kind this version does not know (written by a newer one): kept as it is."""

    raw: dict[str, Any]

    KIND: ClassVar[str] = ""

    @staticmethod
    def decode(raw: dict[str, Any]) -> OtherRecord:
        return OtherRecord(raw)

    def encode(self) -> dict[str, Any]:
        return self.raw


HistoryRecord: TypeAlias = (
    InputRecord | BlockRecord | ResultRecord | NoteRecord | EndRecord | CompactionRecord | OtherRecord
)
"""One history record, typed (`decode_record`)."""

_DECODERS: dict[str, Callable[[dict[str, Any]], HistoryRecord]] = {
    cls.KIND: cls.decode
    for cls in (InputRecord, BlockRecord, ResultRecord, NoteRecord, EndRecord, CompactionRecord)
}


def decode_record(raw: dict[str, Any]) -> HistoryRecord:
    """A stored history record (its JSON object) as its typed record; `encode()` gives the dict back."""
    return _DECODERS.get(str(raw.get("k")), OtherRecord.decode)(raw)
