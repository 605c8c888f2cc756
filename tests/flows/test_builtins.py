"""Built-in tools of loop agents (issue 16): pipelines (operators, only the final value returns, per-stage
records, caps, deadline), the scratchpad (private per run, visible to the instructions template, pruning
over 50 tasks) and artifacts (a 5 MB JSON and a 100,000-line text paged by id, each result capped)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.extend import ToolResultInfo
from stead.flows._artifacts import MAX_RESULT_CHARS
from stead.flows._pipeline import PipelineError, run_pipeline
from stead.flows._scratchpad import MAX_TASKS, TaskUpdate, apply_tasks, empty
from tests.fakes import flows as F

TIMEOUT = 30


def results_of(request: stead.ProviderRequest) -> list[stead.ToolResult]:
    return [
        b for m in request.messages if m.role == "tool" for b in m.content if isinstance(b, stead.ToolResult)
    ]


def script(calls: list[tuple[str, dict[str, Any]]]) -> Callable[[stead.ProviderRequest], list[stead.Block]]:
    """A model that makes `calls` one per response, then answers with every result (JSON list)."""

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = results_of(request)
        if len(done) < len(calls):
            name, args = calls[len(done)]
            return [stead.ToolCall(name, args)]
        return [stead.Text(json.dumps([r.output for r in done]))]

    return respond


def agent_yaml(team: Path, name: str, builtins: list[str], tools: list[str], instructions: str = "") -> None:
    lines = [f"name: {name}", "model: scripted:model.yaml", f"builtin_tools: [{', '.join(builtins)}]"]
    if tools:
        lines.append("tools: [" + ", ".join(f"tests.fakes.flows:{t}" for t in tools) + "]")
    if instructions:
        lines.append(f"instructions: {json.dumps(instructions)}")
    F.write(team, f"{name}.yaml", "\n".join(lines) + "\n")


async def run_script(
    db_url: str, team: Path, name: str, calls: list[tuple[str, dict[str, Any]]], **kw: Any
) -> tuple[list[str], stead.Run, list[stead.ProviderRequest]]:
    provider = stead.testing.ScriptedProvider(script(calls))
    async with await stead.open(
        db_url, definitions=team, providers={f"scripted/{name}": provider}, **kw
    ) as system:
        agent = await system.create(definition=name)
        result = await agent.run("go")
        run = await system.run(result.run_id)
    return json.loads(result.text), run, provider.requests


# ---------------------------------------------------------------------------------------------- pipelines
ROWS = [
    {"id": 1, "name": "ada", "team": "red", "score": 7, "tags": ["x"]},
    {"id": 2, "name": "bob", "team": "blue", "score": 3, "tags": ["y", "x"]},
    {"id": 3, "name": "cy", "team": "red", "score": 9, "tags": []},
    {"id": 4, "name": "di", "team": "blue", "score": 3, "tags": ["z"]},
]


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ([{"where": "score > `5`"}, {"select": "name"}], ["ada", "cy"]),
        ([{"where": "contains(tags, 'x') && team == 'blue'"}, {"count": True}], 1),
        ([{"select": ["id", "team"]}, {"head": 2}], [{"id": 1, "team": "red"}, {"id": 2, "team": "blue"}]),
        ([{"sort": "score", "desc": True}, {"select": "id"}], [3, 1, 2, 4]),
        ([{"sort": "name"}, {"first": 1}, {"path": "name"}], "ada"),
        ([{"last": 2}, {"select": "id"}], [3, 4]),
        ([{"tail": 1}, {"select": "id"}], [4]),
        ([{"distinct": "team"}, {"select": "team"}], ["red", "blue"]),
        ([{"select": "tags"}, {"flatten": True}, {"distinct": True}], ["x", "y", "z"]),
        ([{"group_by": "team"}, {"path": "keys(@)"}], ["red", "blue"]),
        ([{"path": "[?score == `3`].name | join(',', @)"}], "bob,di"),
        ([{"let": "best", "do": [{"sort": "score"}, {"last": 1}]}, {"count": True}], 4),
        ([{"map": [{"path": "score"}], "as": "row"}], [7, 3, 9, 3]),
        ([{"where": "score > `100`"}], []),
    ],
)
async def test_BT1_pipeline_operators(
    ctx: stead.ToolContext, stages: list[dict[str, Any]], expected: Any
) -> None:
    value, records, notes = await run_pipeline([{"value": ROWS}, *stages], ctx, {})
    assert value == expected
    assert [r["verb"] for r in records] == ["value", *(next(iter(s)) for s in stages)]
    if expected == []:
        assert notes == ["stage 2 (where) turned 4 items into none"]


async def test_BT1_pipeline_text_operators(ctx: stead.ToolContext) -> None:
    text = "alpha 1\nbeta 2\nALPHA 3\ngamma"
    value, _, _ = await run_pipeline([{"value": text}, {"grep": "^alpha", "ignore_case": True}], ctx, {})
    assert value == ["alpha 1", "ALPHA 3"]
    value, _, _ = await run_pipeline(
        [{"value": text}, {"lines": True}, {"tail": 2}, {"count": True}], ctx, {}
    )
    assert value == 2


async def test_BT1_pipeline_caps_stages_map_items_and_regexes(ctx: stead.ToolContext) -> None:
    with pytest.raises(PipelineError, match="at most 20 stages"):
        await run_pipeline([{"value": 1}] + [{"count": True}] * 20, ctx, {})
    with pytest.raises(PipelineError, match="at most 20 stages"):
        await run_pipeline([{"value": [1]}, {"map": [{"count": True}] * 19}], ctx, {})
    with pytest.raises(PipelineError, match="1,001 items; the limit is 1,000"):
        await run_pipeline([{"value": list(range(1001))}, {"map": [{"path": "@"}]}], ctx, {})
    with pytest.raises(PipelineError, match="a regular expression of 1-200 characters"):
        await run_pipeline([{"value": "x"}, {"grep": "a" * 201}], ctx, {})
    with pytest.raises(PipelineError, match=r"stage 2 \(where\): invalid expression"):
        await run_pipeline([{"value": [1]}, {"where": "a =="}], ctx, {})
    with pytest.raises(PipelineError, match="needs exactly one verb"):
        await run_pipeline([{"value": [1], "count": True}], ctx, {})
    with pytest.raises(PipelineError, match=r"stage 2 \(count\): unknown option\(s\) desc"):
        await run_pipeline([{"value": [1]}, {"count": True, "desc": True}], ctx, {})


async def test_BT1_pipeline_is_one_tool_step_with_per_stage_records_and_only_its_final_value_returns(
    db_url: str, team: Path
) -> None:
    agent_yaml(team, "analyst", ["pipeline"], ["lookup", "echo"])
    stages = [
        {"value": [1, 2, 200, 300]},
        {"map": [{"tool": "lookup", "with": {"order": "$"}}], "as": "o"},
        {"where": "amount > `100`"},
        {"select": "order"},
    ]
    outputs, run, requests = await run_script(db_url, team, "analyst", [("run_pipeline", {"stages": stages})])
    assert outputs == ["[200,300]"]  # the looked-up orders never reached the model
    assert all("delivered" not in m.text for r in requests for m in r.messages)
    assert [F.EXECUTIONS[f"lookup:{n}"] for n in (1, 2, 200, 300)] == [1, 1, 1, 1]
    (pipeline,) = [s for s in run.steps if s.target == "run_pipeline"]
    children = [s for s in run.steps if s.parent_step_id == pipeline.id]
    assert [c.name for c in children] == [
        "analyst: run_pipeline stage 1: value",
        "analyst: run_pipeline stage 2: map",
        "analyst: run_pipeline stage 3: where",
        "analyst: run_pipeline stage 4: select",
    ]
    assert children[1].output["in"] == {"items": 4} and children[2].output["out"] == {"items": 2}


async def test_BT1_pipeline_deadline_stops_it(db_url: str, team: Path) -> None:
    agent_yaml(team, "slow", ["pipeline"], ["hold"])
    F.GATES["forever"] = F.Gate()  # never released
    stages = [{"value": 1}, {"tool": "hold", "with": {"name": "forever"}}]
    outputs, run, _ = await run_script(
        db_url, team, "slow", [("run_pipeline", {"stages": stages, "deadline_seconds": 0.05})]
    )
    assert outputs[0].startswith("Tool 'run_pipeline' failed: InvalidInput: pipeline failed: ")
    assert "did not finish within its deadline of 0.05s" in outputs[0]
    (pipeline,) = [s for s in run.steps if s.target == "run_pipeline"]
    assert pipeline.status == "failed"


async def test_BT1_pipeline_calls_only_the_agents_own_plain_tools(db_url: str, team: Path) -> None:
    agent_yaml(team, "picky", ["pipeline", "scratchpad"], ["echo", "poke"])
    calls = [
        ("run_pipeline", {"stages": [{"value": 1}, {"tool": "poke", "with": {"key": "a", "value": 1}}]}),
        ("run_pipeline", {"stages": [{"value": 1}, {"tool": "scratchpad_notes", "with": {"notes": "x"}}]}),
        ("run_pipeline", {"stages": [{"value": 1}, {"tool": "refund", "with": {"order": 1, "amount": 1}}]}),
        ("run_pipeline", {"stages": [{"value": "hi"}, {"tool": "echo", "pipe_into": "text"}]}),
    ]
    outputs, _, _ = await run_script(db_url, team, "picky", calls)
    for out in outputs[:3]:
        assert "not a tool this pipeline may call (tools: echo)" in out
    assert outputs[3] == "hi"
    assert F.EXECUTIONS["refund:1"] == 0


# ---------------------------------------------------------------------------------------------- scratchpad
def test_BT2_scratchpad_prunes_the_oldest_completed_tasks_over_50() -> None:
    pad = empty()
    pad, _ = apply_tasks(pad, [TaskUpdate(id=f"t{i}", title=f"task {i}") for i in range(48)], [])
    # complete t5, t2 and t9 in that order
    for tid in ("t5", "t2", "t9"):
        pad, pruned = apply_tasks(pad, [TaskUpdate(id=tid, status="completed")], [])
        assert pruned == 0
    pad, pruned = apply_tasks(pad, [TaskUpdate(id=f"n{i}", title="new") for i in range(4)], [])
    assert pruned == 2 and len(pad["tasks"]) == MAX_TASKS
    ids = {t["id"] for t in pad["tasks"]}
    assert "t5" not in ids and "t2" not in ids and "t9" in ids  # the two completed first went first
    # open tasks are never pruned
    pad, pruned = apply_tasks(pad, [TaskUpdate(id=f"m{i}", title="more") for i in range(3)], [])
    assert pruned == 1 and len(pad["tasks"]) == MAX_TASKS + 2
    with pytest.raises(stead.InvalidInput, match="is new: give it a title"):
        apply_tasks(pad, [TaskUpdate(id="nameless")], [])


async def test_BT2_scratchpad_is_visible_to_the_instructions_template_and_private_to_its_run(
    db_url: str, team: Path
) -> None:
    agent_yaml(
        team,
        "planner",
        ["scratchpad"],
        [],
        instructions="Plan ({{ scratchpad.summary }}). Notes: {{ scratchpad.notes or 'none' }}",
    )
    calls = [
        ("scratchpad_tasks", {"upsert": [{"id": "a", "title": "first"}, {"id": "b", "title": "second"}]}),
        ("scratchpad_tasks", {"upsert": [{"id": "a", "status": "completed"}]}),
        ("scratchpad_notes", {"notes": "remember b"}),
    ]
    provider = stead.testing.ScriptedProvider(script(calls))
    async with await stead.open(db_url, definitions=team, providers={"scripted/planner": provider}) as system:
        agent = await system.create(definition="planner")
        result = await agent.run("go")
        assert result.ok, result.error
        first_run = [r.instructions for r in provider.requests]
        await agent.run("again")
        second_run = provider.requests[len(first_run)].instructions
    assert first_run == [
        "Plan (no tasks). Notes: none",
        "Plan (0 of 2 tasks complete). Notes: none",
        "Plan (1 of 2 tasks complete). Notes: none",
        "Plan (1 of 2 tasks complete). Notes: remember b",
    ]
    assert second_run == "Plan (no tasks). Notes: none"  # a new run starts with an empty scratchpad
    assert json.loads(result.text)[1].startswith("1 of 2 tasks complete.\n- [x] a: first (completed)")


# ---------------------------------------------------------------------------------------------- artifacts
@stead.tool(durable=True)
async def big_json() -> dict[str, Any]:
    """A 5 MB JSON document."""
    items = [{"id": i, "name": f"item-{i}", "blob": "x" * 80} for i in range(50_000)]
    return {"total": len(items), "items": items}


@stead.tool(durable=True)
async def big_text() -> str:
    """A 100,000-line log."""
    return "\n".join(f"line {i}: " + ("ERROR disk" if i % 25_000 == 7 else "ok") for i in range(1, 100_001))


@stead.tool(durable=True)
async def table() -> str:
    """A CSV table."""
    return "id,name,score\n" + "\n".join(f"{i},n{i},{i % 7}" for i in range(5000))


async def artifact_run(
    db_url: str, team: Path, source: str, calls: list[tuple[str, dict[str, Any]]]
) -> tuple[list[str], list[stead.ProviderRequest]]:
    F.write(
        team,
        "reader.yaml",
        "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
        f"tools: [tests.flows.test_builtins:{source}]\n",
    )
    outputs, _, requests = await run_script(db_url, team, "reader", [(source, {}), *calls])
    return outputs, requests


async def test_BT3_artifacts_page_through_a_5_mb_json(db_url: str, team: Path) -> None:
    probe: list[str] = []

    def aid() -> str:
        return probe[0]

    calls = [
        ("artifact_json", {"id": "ID", "path": "items[12345].name"}),
        ("artifact_json", {"id": "ID", "path": "items", "offset": 100, "limit": 3}),
        ("artifact_json", {"id": "ID", "path": "items[*].name", "offset": 49_998}),
        ("artifact_keys", {"id": "ID"}),
        ("artifact_json", {"id": "ID", "path": "items", "limit": 500}),
    ]

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = results_of(request)
        if not done:
            return [stead.ToolCall("big_json", {})]
        if not probe:
            probe.append(done[0].output.split("artifact ")[1].split(":")[0])
        if len(done) <= len(calls):
            name, args = calls[len(done) - 1]
            return [stead.ToolCall(name, {**args, "id": aid()})]
        return [stead.Text(json.dumps([r.output for r in done]))]

    F.write(
        team,
        "reader.yaml",
        "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
        "tools: [tests.flows.test_builtins:big_json]\n",
    )
    provider = stead.testing.ScriptedProvider(respond)
    async with await stead.open(db_url, definitions=team, providers={"scripted/reader": provider}) as system:
        agent = await system.create(definition="reader")
        result = await agent.run("go")
        history = await agent.history()
    outputs = json.loads(result.text)
    manifest = outputs[0]
    assert manifest.startswith("The output of big_json is large (")
    assert "a JSON object with keys total, items (50,000 items)" in manifest and len(manifest) < 600
    assert all(
        len(b.output) <= MAX_RESULT_CHARS + 200
        for m in history
        for b in m.content
        if isinstance(b, stead.ToolResult)
    )
    assert outputs[1] == '"item-12345"'
    head, page = outputs[2].split("\n", 1)
    assert head == "items 100-102 of 50,000; next: offset=103"
    assert [row["id"] for row in json.loads(page)] == [100, 101, 102]
    assert outputs[3] == 'items 49998-49999 of 50,000\n["item-49998","item-49999"]'
    assert outputs[4] == "total: int (5 chars)\nitems: list (50,000 items)"
    assert len(outputs[5]) <= MAX_RESULT_CHARS + 200 and "…[cut at 10,000" in outputs[5]
    assert max(len(m.text) for r in provider.requests for m in r.messages) < 20_000  # never whole


async def test_BT3_artifacts_page_through_a_100000_line_text(db_url: str, team: Path) -> None:
    probe: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = [
        ("artifact_lines", {"start": 99_998, "count": 10}),
        ("artifact_grep", {"pattern": "ERROR"}),
        ("artifact_lines", {"start": 1, "count": 500}),
    ]

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = results_of(request)
        if not done:
            return [stead.ToolCall("big_text", {})]
        if not probe:
            probe.append(done[0].output.split("artifact ")[1].split(":")[0])
        if len(done) <= len(calls):
            name, args = calls[len(done) - 1]
            return [stead.ToolCall(name, {**args, "id": probe[0]})]
        return [stead.Text(json.dumps([r.output for r in done]))]

    F.write(
        team,
        "reader.yaml",
        "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
        "tools: [tests.flows.test_builtins:big_text]\n",
    )
    provider = stead.testing.ScriptedProvider(respond)
    async with await stead.open(db_url, definitions=team, providers={"scripted/reader": provider}) as system:
        agent = await system.create(definition="reader")
        result = await agent.run("go")
    outputs = json.loads(result.text)
    assert "text of 100,000 lines" in outputs[0]
    assert (
        outputs[1] == "lines 99998-100000 of 100,000\n99998: line 99998: ok\n"
        "99999: line 99999: ok\n100000: line 100000: ok"
    )
    assert outputs[2] == (
        "4 matching lines\n7: line 7: ERROR disk\n25007: line 25007: ERROR disk\n"
        "50007: line 50007: ERROR disk\n75007: line 75007: ERROR disk"
    )
    assert outputs[3].startswith("lines 1-500 of 100,000 (next: start=501)\n1: line 1: ok")


async def test_BT3_artifact_rows_of_a_csv(db_url: str, team: Path) -> None:
    probe: list[str] = []

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = results_of(request)
        if not done:
            return [stead.ToolCall("table", {})]
        if len(done) == 1:
            probe.append(done[0].output.split("artifact ")[1].split(":")[0])
            return [stead.ToolCall("artifact_rows", {"id": probe[0], "offset": 4998, "columns": ["name"]})]
        return [stead.Text(json.dumps([r.output for r in done]))]

    F.write(
        team,
        "reader.yaml",
        "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
        "tools: [tests.flows.test_builtins:table]\n",
    )
    provider = stead.testing.ScriptedProvider(respond)
    async with await stead.open(db_url, definitions=team, providers={"scripted/reader": provider}) as system:
        agent = await system.create(definition="reader")
        result = await agent.run("go")
    outputs = json.loads(result.text)
    assert "CSV with 5,000 rows; columns: id,name,score" in outputs[0]
    assert outputs[1] == 'rows 4998-4999 of 5,000\n[{"name":"n4998"},{"name":"n4999"}]'


async def test_BT3_an_artifact_is_written_in_the_transaction_of_the_result_that_names_it(
    db_url: str, team: Path
) -> None:
    F.write(
        team,
        "reader.yaml",
        "name: reader\nmodel: scripted:model.yaml\nbuiltin_tools: [artifacts]\n"
        "tools: [tests.flows.test_builtins:big_text]\n",
    )
    seen: list[list[tuple[str, str]]] = []

    class FailOnce(stead.Hooks):
        """Runs before the artifacts hook in the result's transaction: the first commit fails (rolled back,
        the loop retries it); the second looks at what the first left behind."""

        async def tool_result_tx(self, ctx: stead.HookContext, info: ToolResultInfo) -> None:
            if info.call.name != "big_text":
                return
            assert ctx.tx is not None
            if not seen:
                seen.append(await ctx.tx.read_prefix(ctx.agent_id, "kv.a.stead.art"))
                raise RuntimeError("the result commit fails")
            seen.append(await ctx.tx.read_prefix(ctx.agent_id, "kv.a.stead.art"))

    provider = stead.testing.ScriptedProvider(script([("big_text", {})]))
    async with await stead.open(
        db_url, definitions=team, providers={"scripted/reader": provider}, hooks=[FailOnce()]
    ) as system:
        agent = await system.create(definition="reader")
        result = await agent.run("go")
        async with system.store.transaction() as tx:
            stored = [k for k, _ in await tx.read_prefix(agent.id, "kv.a.stead.art")]
    assert seen == [[], []]  # nothing from the rolled-back attempt
    (manifest,) = json.loads(result.text)
    aid = manifest.split("artifact ")[1].split(":")[0]
    assert sorted(stored) == [f"kv.a.stead.art.{aid}", f"kv.a.stead.artmeta.{aid}"]
