"""One of each (issue 22, item 6): the typed history-record codec, the one readable block/message form (the
CLI's `history --json` and the HTTP service agree, also on redacted reasoning), the one run JSON, the one
provider stream-error wrapper, the one scripted-file schema."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import stead
from stead.cli._runs import _run_json
from stead.core import records as R
from stead.core.outcome import Outcome
from stead.core.response import block_records
from stead.core.results import run_state
from stead.core.state import Turn
from stead.extend import block_json, message_json, run_json, step_json
from stead.messages import Reasoning, Text, ToolCall, ToolResult, Usage, encode_block
from stead.providers import _errors
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from stead.providers.scripted_file import ScriptedModelFile, ScriptedRuleOf
from stead.realtime import DuplexScript
from stead.server import _wire
from stead.server._models import RunOut, StepOut
from stead.server._routes_runs import run_fields, step_out
from tests.fakes.cli import invoke
from tests.fakes.context import WindowModel, fetch, stored

TYPED = (R.InputRecord, R.BlockRecord, R.ResultRecord, R.NoteRecord, R.EndRecord, R.CompactionRecord)


# ------------------------------------------------------------------------------------------ typed records
def _round_trips(raw: dict[str, Any]) -> R.HistoryRecord:
    rec = R.decode_record(raw)
    assert isinstance(rec, TYPED), raw
    assert rec.encode() == raw
    assert raw["k"] == rec.KIND
    return rec


async def test_every_record_of_a_compacted_history_round_trips(db_url: str) -> None:
    """Input, blocks, results (stubbed and clamped by compactions too), end and compaction records: each
    decodes to its typed record, whose `encode()` is the stored dict again."""
    model = WindowModel(window=3000, rounds=30)
    async with await stead.open(db_url, providers={"m": model.provider}, tools=[fetch]) as system:
        agent = await system.create(provider="m", tools=["fetch"], context_window=3000)
        await agent.run("read thirty pages", check=True)
        current, archive = await stored(system, agent.id)
    everything = [json.loads(raw) for _, raw in archive] + current
    kinds = {type(_round_trips(r)) for r in everything}
    assert kinds == {R.InputRecord, R.BlockRecord, R.ResultRecord, R.EndRecord, R.CompactionRecord}
    assert any("cut" in r for r in current)  # a shortened record round-trips with its `cut`
    head = R.decode_record(current[0])
    assert isinstance(head, R.CompactionRecord) and head.summary and head.tokens_before is not None


def test_the_kernels_writers_are_the_typed_encoders() -> None:
    """The hot path writes records without building the typed objects: its dicts are exactly theirs."""
    result = ToolResult("call-1", "boom", is_error=True, repaired=True)
    assert R.result_record(result) == R.ResultRecord(result).encode()
    queued = R.Queued(
        "q.send.1", "m1", "user", [encode_block(Text("hi"))], {"a": 1}, {}, user="u-1", tenant="t-1"
    )
    rec = R.decode_record(queued.history_record("run-1"))
    assert rec == R.InputRecord("m1", "user", [Text("hi")], {"a": 1}, "run-1", "u-1", "t-1")
    assert rec.encode() == queued.history_record("run-1")
    assert R.end_record("run-1", Outcome.FAILED, "it broke", {"p": 1}) == (
        R.EndRecord("run-1", Outcome.FAILED, "it broke", {"p": 1}).encode()
    )
    blocks: list[stead.Block] = [
        Reasoning("why", "sig"),
        Reasoning("ENCRYPTED", redacted=True),
        ToolCall("add", {"a": 1}, "c1"),
    ]
    usage = Usage(10, 2, 1, 0.5, estimated=True)
    turn = Turn("inf-1", R.Pending("inference", "run-1"), [])
    written = block_records(turn, blocks, usage, "length")
    typed = [R.BlockRecord("inf-1", b) for b in blocks[:-1]] + [
        R.BlockRecord("inf-1", blocks[-1], usage, "length")
    ]
    assert written == [t.encode() for t in typed]
    assert [R.decode_record(w) for w in written] == typed


def test_records_written_before_their_fields_existed_still_decode() -> None:
    old_input = {"k": "u", "id": "m1", "r": "user", "c": [{"t": "x", "x": "hi"}]}  # no run id
    assert _round_trips(old_input) == R.InputRecord("m1", "user", [Text("hi")])
    old_usage = {"k": "b", "i": "inf", "b": {"t": "x", "x": "ok"}, "u": [3, 4, 0, None]}  # four elements
    assert _round_trips(old_usage) == R.BlockRecord("inf", Text("ok"), Usage(3, 4, 0, None))
    assert R.decode_record({"k": "e", "run": "r1"}) == R.EndRecord("r1", Outcome.COMPLETED)
    assert R.decode_record({"k": "c", "id": "cmp"}) == R.CompactionRecord("cmp", n=1)
    assert R.CompactionRecord("cmp").message() is None
    summary = R.CompactionRecord("cmp", 2, "auto", "the gist").message()
    assert summary is not None and summary.role == "system" and "the gist" in summary.text


def test_an_unknown_record_kind_is_kept_as_it_is() -> None:
    raw = {"k": "zz", "anything": [1, 2]}
    rec = R.decode_record(raw)
    assert isinstance(rec, R.OtherRecord) and rec.encode() is raw
    records: list[dict[str, Any]] = [
        {"k": "u", "id": "m1", "r": "user", "c": [{"t": "x", "x": "hi"}], "run": "r1"},
        raw,
        {"k": "b", "i": "inf", "b": {"t": "x", "x": "hello"}},
        {"k": "e", "run": "r1", "o": "completed"},
    ]
    state = run_state(records, "m1")
    assert state is not None and state.result is not None and state.result.text == "hello"


def test_typed_records_are_offered_to_plugins() -> None:
    for name in ("decode_record", "InputRecord", "BlockRecord", "ResultRecord", "NoteRecord", "EndRecord"):
        assert getattr(stead.extend, name) is getattr(R, name)


# --------------------------------------------------------------------------------- the readable form
def test_redacted_reasoning_shows_no_vendor_data() -> None:
    """A redacted block's text is the vendor's encrypted data, kept for replay only: never shown."""
    assert block_json(Reasoning("ENCRYPTED", redacted=True)) == {
        "type": "reasoning",
        "text": "",
        "redacted": True,
    }
    assert block_json(Reasoning("plain", "signature")) == {"type": "reasoning", "text": "plain"}


def test_the_sparse_form_is_the_full_form_without_unset_fields() -> None:
    m = stead.Message("assistant", [Text("a"), ToolCall("f", {}, "c1")], usage=Usage(1, 2, 0, None))
    full, sparse = message_json(m, 3), message_json(m, sparse=True)
    assert full["index"] == 3 and full["text"] == "a" and full["id"] is None and full["metadata"] is None
    assert sparse == {"role": "assistant", "content": full["content"], "usage": full["usage"]}
    assert _wire.message_json is message_json and _wire.block_json is block_json


def test_cli_history_and_the_service_show_the_same_blocks(tmp_path: Path) -> None:
    db = tmp_path / "stead.db"
    provider = ScriptedProvider(
        lambda _: ScriptedResponse(
            blocks=[Reasoning("ENCRYPTED", redacted=True), Reasoning("hm", "s"), Text("ok")]
        )
    )

    async def make() -> list[stead.Message]:
        async with await stead.open(f"sqlite:///{db}", providers={"p": provider}, records=False) as system:
            agent = await system.create(provider="p", agent_id="a1")
            await agent.run("hi", check=True)
            return await agent.history()

    history = asyncio.run(make())
    code, out, err = invoke("history", "a1", "--db", str(db), "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert [m["content"] for m in shown] == [_wire.message_json(m)["content"] for m in history]
    assert shown[1]["content"][0] == {"type": "reasoning", "text": "", "redacted": True}


# ---------------------------------------------------------------------------------------------- run JSON
def _run(**changes: Any) -> stead.Run:
    step = stead.Step(
        "s1", "r1", 1, "tool", "add", "completed", 1.0, 1.5, "add", None, None, None, None, {"a": 1}, "3"
    )
    fields: dict[str, Any] = {
        "id": "r1",
        "agent_id": "a1",
        "agent_name": "calc",
        "parent_run_id": None,
        "parent_step_id": None,
        "session_id": None,
        "conversation_id": None,
        "status": "failed",
        "started_at": 1.0,
        "completed_at": 3.0,
        "error": "read /srv/secret/file.txt: boom",
        "final_message": None,
        "input_tokens": 10,
        "output_tokens": 5,
        "cached_tokens": 0,
        "cost": 0.0,
        "own_input_tokens": 10,
        "own_output_tokens": 5,
        "own_cached_tokens": 0,
        "own_cost": 0.0,
        "iterations": 1,
        "restarts": 0,
        "breadcrumb": None,
        "steps": [step],
    }
    fields.update(changes)
    return stead.Run(**fields)


def test_the_cli_and_the_service_show_one_run_json() -> None:
    run = _run()
    full = run_json(run)
    served = RunOut(**run_fields(run)).model_dump()
    shown = _run_json(run)
    assert served["error"] != run.error and "/srv/secret" not in str(served["error"])  # SEC7e, served only
    for key, value in shown.items():
        if key in ("steps", "children"):
            continue
        assert value == (None if key == "cost" else full[key]), key  # `cost` null, never a false 0
        if key in served and key not in ("error", "cost"):
            assert served[key] == value, key
    assert shown["duration"] == 2.0 and shown["usage_unknown"] is False
    (step,) = shown["steps"]
    assert step == {k: step_json(run.steps[0])[k] for k in step}
    assert StepOut.model_validate(step_out(run.steps[0])).input == {"a": 1}


# -------------------------------------------------------------------------------- provider stream errors
class _Response:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.closed = False

    async def _gen(self) -> AsyncIterator[Any]:
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen()

    async def close(self) -> None:
        self.closed = True


class _SdkError(Exception):
    pass


def _map(exc: BaseException) -> stead.ProviderError | None:
    return stead.ProviderError(f"mapped: {exc}", retryable=True) if isinstance(exc, _SdkError) else None


async def test_a_stream_error_is_mapped_and_the_response_closed() -> None:
    response = _Response([1, _SdkError("dropped")])
    seen: list[Any] = []
    with pytest.raises(stead.ProviderError, match="mapped: dropped") as caught:
        async for item in _errors.read_stream(response, _map):
            seen.append(item)
    assert seen == [1] and response.closed and isinstance(caught.value.__cause__, _SdkError)

    other = _Response([KeyError("not the SDK's")])
    with pytest.raises(KeyError):
        async for _ in _errors.read_stream(other, _map):
            pass
    assert other.closed

    async def fails() -> Any:
        raise _SdkError("refused")

    with pytest.raises(stead.ProviderError, match="mapped: refused"):
        await _errors.open_stream(fails(), _map)


async def test_a_reader_that_stops_early_closes_the_response() -> None:
    import contextlib

    response = _Response([1, 2, 3])
    async with contextlib.aclosing(_errors.read_stream(response, _map)) as items:
        async for _ in items:
            break
    assert response.closed


# ------------------------------------------------------------------------------------ scripted schema
def test_the_realtime_script_is_the_scripted_model_schema() -> None:
    script = DuplexScript.model_validate({"scripted": True, "rules": [{"responses": [{"text": "x"}]}]})
    assert isinstance(script.rules[0], ScriptedRuleOf)
    shared = {"scripted", "description", "chunk", "delay", "delay_between", "rules"}
    assert shared <= set(DuplexScript.model_fields) and shared == set(ScriptedModelFile.model_fields)
    for model, alone in ((DuplexScript, "fatal"), (ScriptedModelFile, "error")):
        with pytest.raises(pydantic.ValidationError, match=f"needs text, tool_call, tool_calls or {alone}"):
            model.model_validate({"scripted": True, "rules": [{"responses": [{"delay": 1}]}]})
        with pytest.raises(pydantic.ValidationError, match="either tool_call or tool_calls"):
            model.model_validate(
                {
                    "scripted": True,
                    "rules": [{"responses": [{"tool_call": {"name": "a"}, "tool_calls": [{"name": "b"}]}]}],
                }
            )
