"""The request checker of every chaos mode (docs/chaos.md, "The request checker").

Every provider request is logged as it is made (`RequestLog`, called by the scripted model before it
answers: one JSON line per request, one `write` to an `O_APPEND` file: it is in the kernel's page cache
when the call returns, so it survives the `kill -9` or `SIGSTOP` that may follow — no fsync, which only an
operating-system crash would need, and which slowed every seed by a quarter) and checked after the run
against the final store (`check_requests`):

- every tool call of an assistant message is answered by exactly one result, in call order, in the tool
  message right after it (a user or system message, another assistant message or the end of the request
  before the results is a missing result; R2: results come before new messages);
- no call and no result appears twice in one request; no result without its call;
- every call and every result of the request is committed in the store, and the result equals a version
  the store holds for that call (the original, or a copy a compaction kept and shortened: K1).

A request is logged in a compact form (`encode_request`): per message its role and, for assistant messages
the (id, name) of each call, for tool messages the (call id, output, is_error) of each result.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stead.messages import ToolCall, ToolResult
from stead.providers.base import ProviderRequest

__all__ = [
    "RequestLog",
    "Stored",
    "check_request",
    "check_requests",
    "encode_request",
    "read_requests",
    "stored_from_records",
]


def encode_request(request: ProviderRequest, who: str) -> dict[str, Any]:
    """The compact form of one request (what the checker needs); `who` names the process."""
    msgs: list[list[Any]] = []
    for m in request.messages:
        if m.role == "assistant":
            msgs.append(["a", [[b.id, b.name] for b in m.content if isinstance(b, ToolCall)]])
        elif m.role == "tool":
            msgs.append(
                ["t", [[b.call_id, b.output, b.is_error] for b in m.content if isinstance(b, ToolResult)]]
            )
        else:
            msgs.append([m.role[0]])
    return {"a": request.agent_id, "i": request.inference_id, "w": who, "m": msgs}


class RequestLog:
    """Appends every turn request to `path` (one JSON line, one O_APPEND write) before the model answers."""

    def __init__(self, path: Path, who: str) -> None:
        self.path = path
        self.who = who

    def __call__(self, request: ProviderRequest) -> None:
        if request.purpose != "turn":
            return  # a compaction summary request carries a transcript, not the conversation
        line = json.dumps(encode_request(request, self.who), ensure_ascii=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write per line: lines of processes never interleave
        finally:
            os.close(fd)


def read_requests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        if path.exists():
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


@dataclass
class Stored:
    """What the store holds: call ids per agent and every stored version of each call's result."""

    calls: dict[str, set[str]] = field(default_factory=dict)
    results: dict[str, dict[str, set[tuple[str, bool]]]] = field(default_factory=dict)


def stored_from_records(records: Iterable[tuple[str, dict[str, Any]]]) -> Stored:
    """`records`: (agent id, history record) of the current history and the archive (every copy)."""
    s = Stored()
    for aid, rec in records:
        if rec.get("k") == "b" and rec["b"].get("t") == "c":
            s.calls.setdefault(aid, set()).add(str(rec["b"].get("i")))
        elif rec.get("k") == "t":
            b = rec["b"]
            s.results.setdefault(aid, {}).setdefault(str(b["i"]), set()).add((str(b["o"]), bool(b.get("e"))))
    return s


def check_request(
    req: dict[str, Any], stored: Stored | None, held: frozenset[str] = frozenset()
) -> list[str]:
    """The violations of one logged request (`stored=None`: the structure only). `held`: names of tools
    whose calls may be held for approval — T2: their results commit with the decision, so they may follow
    the results of later calls of the batch; every other result is in call order."""
    where = f"request {req.get('i')} of {req.get('a')} (by {req.get('w')})"
    out: list[str] = []
    open_calls: list[str] = []  # the calls of the last assistant message, not yet answered
    names: dict[str, str] = {}
    seen_calls: Counter[str] = Counter()
    seen_results: Counter[str] = Counter()

    def missing(before: str) -> None:
        if open_calls:
            out.append(f"{where}: call(s) {open_calls} have no result before {before}")
            open_calls.clear()

    for n, msg in enumerate(req["m"]):
        kind = msg[0]
        if kind == "a":
            missing(f"the next assistant message (message {n})")
            ids = [str(c[0]) for c in msg[1]]
            names.update((str(c[0]), str(c[1])) for c in msg[1])
            for cid in ids:
                seen_calls[cid] += 1
                if seen_calls[cid] == 2:
                    out.append(f"{where}: call {cid} appears twice")
            open_calls = ids
        elif kind == "t":
            got = [str(r[0]) for r in msg[1]]
            for cid in got:
                seen_results[cid] += 1
                if seen_results[cid] == 2:
                    out.append(f"{where}: the result of call {cid} appears twice")
            once = list(dict.fromkeys(got))
            unknown = [c for c in once if c not in seen_calls]
            if unknown:
                out.append(f"{where}: result(s) for call(s) {unknown}, which the request does not contain")
            stray = [c for c in once if c in seen_calls and c not in open_calls]
            if stray:
                out.append(
                    f"{where}: result(s) {stray} do not answer the calls right before them {open_calls}"
                )
            lost = [c for c in open_calls if c not in got]
            if lost:
                out.append(f"{where}: call(s) {lost} have no result (message {n} answers {got})")
            ordered = [c for c in open_calls if c in got and names.get(c) not in held]
            if [c for c in once if c in ordered] != ordered:
                out.append(f"{where}: results {got} are not in call order {open_calls}")
            open_calls = []
            if stored is not None:
                for cid, output, is_error in msg[1]:
                    versions = stored.results.get(str(req["a"]), {}).get(str(cid))
                    if versions is None:
                        out.append(f"{where}: the result of call {cid} is not committed: {output!r}"[:400])
                    elif (str(output), bool(is_error)) not in versions:
                        out.append(
                            f"{where}: the result of call {cid} {(output, bool(is_error))!r} differs from "
                            f"the committed {sorted(versions)!r}"[:600]
                        )
        else:
            missing(f"a {'user' if kind == 'u' else 'system'} message (message {n})")
    missing("the end of the request (the model is asked without them)")
    if stored is not None:
        calls = stored.calls.get(str(req["a"]), set())
        uncommitted = [c for c in seen_calls if c not in calls]
        if uncommitted:
            out.append(f"{where}: call(s) {uncommitted} are not committed")
    return out


def check_requests(
    requests: Iterable[dict[str, Any]], stored: Stored, held: frozenset[str] = frozenset(), limit: int = 20
) -> list[str]:
    """Every logged request against the final store (at most `limit` violations are reported in full)."""
    out: list[str] = []
    n = 0
    for req in requests:
        v = check_request(req, stored, held)
        if v:
            n += 1
            if len(out) < limit:
                out.extend(v)
    if n and len(out) >= limit:
        out.append(f"... {n} request(s) with violations in all")
    return out
