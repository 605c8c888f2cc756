"""Payloads (issue 16): a run carries a JSON payload (`send(..., payload=...)`, `run(..., payload=...)`,
`RunResult.payload`); a definition restricts what its prompt sees (`payload.read`) and what it may change
(`payload.write`); a blocked change is recorded as a violation, not applied; sub-agents get a filtered
payload and merge back only the paths they may write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.flows._paths import Change, apply_changes, diff, filter_payload, parse_pattern
from tests.fakes import flows as F


def loop_model(respond: Any) -> stead.testing.ScriptedProvider:
    return stead.testing.ScriptedProvider(respond)


def results_of(request: stead.ProviderRequest) -> list[stead.ToolResult]:
    return [
        b for m in request.messages if m.role == "tool" for b in m.content if isinstance(b, stead.ToolResult)
    ]


# ---------------------------------------------------------------------------------------------- the kernel
async def test_PY1_a_run_carries_its_payload_into_its_result_also_after_a_restart(db_url: str) -> None:
    answer = stead.testing.ScriptedProvider(lambda r: [stead.Text("ok")])
    async with await stead.open(db_url, providers={"p": answer}) as system:
        agent = await system.create(provider="p", model="m")
        result = await agent.run("hi", id="m-1", payload={"order": {"id": 7}, "tags": ["a"]})
        assert result.payload == {"order": {"id": 7}, "tags": ["a"]}
        plain = await agent.run("no payload", id="m-2")
        assert plain.payload is None
        with pytest.raises(stead.InvalidInput, match="payload must be a dict"):
            await agent.send("bad", payload=[1, 2])  # type: ignore[arg-type]
    async with await stead.open(db_url, providers={"p": answer}) as system:
        again = await (await system.get(agent.id)).run("hi", id="m-1")  # the same message: the same run
        assert again.run_id == result.run_id and again.payload == {"order": {"id": 7}, "tags": ["a"]}


async def test_PY1_the_payload_is_the_run_kv_and_ends_in_the_end_record(db_url: str) -> None:
    seen: list[Any] = []

    async def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        async with system.store.transaction() as tx:
            seen.append(json.loads(await tx.get(request.agent_id, "kv.r.payload") or "null"))
        return [stead.Text("ok")]

    system = await stead.open(db_url, providers={"p": stead.testing.ScriptedProvider(respond)})
    async with system:
        agent = await system.create(provider="p", model="m")
        await agent.run("hi", payload={"a": 1})
        async with system.store.transaction() as tx:
            assert await tx.get(agent.id, "kv.r.payload") is None  # run KV: erased at settlement
            end = [json.loads(r) for r in await tx.load(agent.id)][-1]
    assert seen == [{"a": 1}]
    assert end["k"] == "e" and end["p"] == {"a": 1}


# ---------------------------------------------------------------------------------------------- read
async def test_PY2_payload_read_limits_what_a_prompt_step_sees(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "reader",
        """
        payload:
          read: [order.id, "notes.*"]
        steps:
          - {name: look, prompt: "Order {{ payload.order.id }}; all: {{ payload | tojson }}"}
        """,
        model="scripted:model.yaml",
    )
    seen: list[stead.ProviderRequest] = []

    def answer(request: stead.ProviderRequest) -> Any:
        seen.append(request)
        return {"ok": True}

    async with await stead.open(
        db_url, definitions=team, providers={"scripted/reader": F.prompt_model(answer)}
    ) as system:
        agent = await system.create(definition="reader")
        payload = {"order": {"id": 5, "card": "4242"}, "notes": {"a": "x"}, "secret": "s3cr3t"}
        result = await agent.run("look", payload=payload)
    assert result.ok, result.error
    (request,) = seen
    assert "4242" not in request.instructions and "s3cr3t" not in request.instructions
    assert request.instructions.startswith("Order 5; all: ")
    shown = json.loads(request.instructions.removeprefix("Order 5; all: "))
    assert shown == {"order": {"id": 5}, "notes": {"a": "x"}}
    assert "4242" not in request.messages[0].text and "s3cr3t" not in request.messages[0].text


async def test_PY2_payload_read_limits_what_a_loop_agents_instructions_see_each_request(
    db_url: str, team: Path
) -> None:
    F.write(
        team,
        "clerk.yaml",
        """
        name: clerk
        model: scripted:model.yaml
        instructions: "Payload: {{ payload | tojson }}"
        payload: {read: [order]}
        builtin_tools: [payload]
        """,
    )
    seen: list[str] = []

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        seen.append(request.instructions)
        if not results_of(request):
            return [stead.ToolCall("update_payload", {"set": {"order.status": "done"}})]
        return [stead.Text("ok")]

    async with await stead.open(
        db_url, definitions=team, providers={"scripted/clerk": loop_model(respond)}
    ) as system:
        agent = await system.create(definition="clerk")
        assert agent.config.instructions == "Payload: {}"  # rendered at creation without a run
        result = await agent.run("go", payload={"order": {"id": 1}, "secret": "s3cr3t"})
    assert result.ok, result.error
    assert seen == ['Payload: {"order": {"id": 1}}', 'Payload: {"order": {"id": 1, "status": "done"}}']
    assert result.payload == {"order": {"id": 1, "status": "done"}, "secret": "s3cr3t"}


# ---------------------------------------------------------------------------------------------- write
async def test_PY3_a_blocked_flow_write_is_recorded_as_a_violation_and_not_applied(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "writer",
        """
        payload:
          write: ["result.*", "log:add"]
        steps:
          - name: work
            tool: echo
            input: {text: "'done'"}
            output: {result.text: step.output, secret: "'overwritten'", log: "'first'"}
          - name: again
            tool: echo
            input: {text: "'twice'"}
            output: {log: step.output}
        paths:
          - {from: work, to: again}
        """,
        tools=["echo"],
    )
    async with await stead.open(db_url, definitions=team) as system:
        agent = await system.create(definition="writer")
        result = await agent.run("go", payload={"secret": "kept"})
        run = await system.run(result.run_id)
    assert result.ok, result.error
    assert result.payload == {"secret": "kept", "result": {"text": "done"}, "log": "first"}
    violations = [s for s in run.steps if s.type == "validation"]
    assert [(s.status, s.name) for s in violations] == [
        ("failed", "writer: payload (flow output)"),
        ("failed", "writer: payload (flow output)"),
    ]
    assert violations[0].output["violations"][0]["path"] == "secret"
    assert violations[0].output["violations"][0]["op"] == "update"
    assert violations[1].output["violations"] == [
        {
            "path": "log",
            "op": "update",
            "reason": violations[1].output["violations"][0]["reason"],
            "step": "again",
        }
    ]
    assert "payload change refused, not applied: update log" in (violations[1].error or "")


async def test_PY3_update_payload_refuses_paths_outside_payload_write(db_url: str, team: Path) -> None:
    F.write(
        team,
        "clerk.yaml",
        """
        name: clerk
        model: scripted:model.yaml
        payload: {write: [order.status]}
        builtin_tools: [payload]
        """,
    )

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        done = results_of(request)
        if not done:
            changes = {"set": {"order.status": "refunded", "order.amount": 0}, "remove": ["customer"]}
            return [stead.ToolCall("update_payload", changes)]
        return [stead.Text(done[-1].output)]

    async with await stead.open(
        db_url, definitions=team, providers={"scripted/clerk": loop_model(respond)}
    ) as system:
        agent = await system.create(definition="clerk")
        payload = {"order": {"status": "open", "amount": 10}, "customer": "ann"}
        result = await agent.run("go", payload=payload)
        run = await system.run(result.run_id)
    assert result.payload == {"order": {"status": "refunded", "amount": 10}, "customer": "ann"}
    assert result.text.startswith("Applied: update order.status. Refused")
    assert "update order.amount, delete customer" in result.text
    (violation,) = [s for s in run.steps if s.type == "validation"]
    assert violation.name == "clerk: payload (update_payload)"
    assert [v["path"] for v in violation.output["violations"]] == ["order.amount", "customer"]


# ---------------------------------------------------------------------------------------------- sub-agents
async def test_PY4_sub_agents_get_a_filtered_payload_and_merge_back_only_allowed_paths(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "desk",
        """
        sub_agents: [clerk]
        steps:
          - {name: handle, sub_agent: clerk, request: "'settle the order'"}
        result: "steps.handle.output"
        """,
    )
    F.write(
        team,
        "clerk.yaml",
        """
        name: clerk
        model: scripted:model.yaml
        payload:
          read: [order]
          write: ["order.*", "customer.name"]
        builtin_tools: [payload]
        """,
    )
    seen: list[Any] = []

    def clerk(request: stead.ProviderRequest) -> list[stead.Block]:
        if not results_of(request):
            seen.append(request.messages[0].metadata)
            return [stead.ToolCall("update_payload", {"set": {"order.status": "settled", "vip": True}})]
        return [stead.Text("settled")]

    async with await stead.open(
        db_url, definitions=team, providers={"scripted/clerk": loop_model(clerk)}
    ) as system:
        agent = await system.create(definition="desk")
        payload = {"order": {"id": 3, "status": "open"}, "customer": {"name": "ann", "card": "4242"}}
        result = await agent.run("go", payload=payload)
        run = await system.run(result.run_id)
    assert result.ok, result.error
    (metadata,) = seen
    assert metadata["stead.payload"] == {"order": {"id": 3, "status": "open"}}  # filtered by clerk's read
    # the clerk's own write rules refused `vip` (a violation in its run); `order.status` merged back
    assert result.payload == {
        "order": {"id": 3, "status": "settled"},
        "customer": {"name": "ann", "card": "4242"},
    }
    (child,) = run.children
    assert [s.name for s in child.steps if s.type == "validation"] == [
        "desk → clerk: payload (update_payload)"
    ]


async def test_PY4_a_flow_sub_agents_changes_merge_back_into_a_loop_parents_payload(
    db_url: str, team: Path
) -> None:
    F.write(team, "lead.yaml", "name: lead\nmodel: scripted:model.yaml\nsub_agents: [tagger]\n")
    F.write_flow(
        team,
        "tagger",
        """
        payload: {write: [tag, order.state]}
        steps:
          - {name: tag, tool: echo, input: {text: "'tagged'"}, output: {tag: step.output, order.state: "'x'"}}
          - {name: sneak, tool: poke, input: {key: "'sneaked'", value: "`true`"}}
        paths:
          - {from: tag, to: sneak}
        """,
        tools=["echo", "poke"],
    )

    def lead(request: stead.ProviderRequest) -> list[stead.Block]:
        if not results_of(request):
            return [stead.ToolCall("tagger", {"request": "tag it"})]
        return [stead.Text("done")]

    async with await stead.open(
        db_url, definitions=team, providers={"scripted/lead": loop_model(lead)}
    ) as system:
        agent = await system.create(definition="lead")
        result = await agent.run("go", payload={"order": {"id": 1}})
        run = await system.run(result.run_id)
    assert result.ok, result.error
    # `sneaked` was written by the sub-agent outside its write paths: refused at merge-back, recorded
    assert result.payload == {"order": {"id": 1, "state": "x"}, "tag": "tagged"}
    (violation,) = [s for s in run.steps if s.type == "validation"]
    assert violation.name == "lead: payload (sub-agent tagger)"
    assert violation.output["violations"][0]["path"] == "sneaked"


# ---------------------------------------------------------------------------------------------- patterns
def test_patterns_allow_paths_and_their_subtrees() -> None:
    p = parse_pattern("order.*")
    assert p.covers(("order", "id")) and p.covers(("order", "id", "x")) and not p.covers(("order",))
    assert p.reaches(("order",)) and not p.reaches(("customer",))
    deep = parse_pattern("**")
    assert deep.covers(()) and deep.covers(("a", "b"))
    mid = parse_pattern("a.**.z")
    assert mid.covers(("a", "z")) and mid.covers(("a", "b", "c", "z")) and not mid.covers(("a", "b"))
    assert filter_payload({"a": {"b": 1, "c": 2}, "d": 3}, [parse_pattern("a.b")]) == {"a": {"b": 1}}
    assert filter_payload({"a": 1}, None) == {"a": 1}
    assert filter_payload({"a": 1}, []) == {}


def test_write_patterns_restrict_operations() -> None:
    rules = [parse_pattern("notes:add", write=True), parse_pattern("order.status:update", write=True)]
    before = {"order": {"status": "open"}, "notes": "x"}
    changes = diff(before, {"order": {"status": "done"}, "extra": 1})
    assert changes == [
        Change(("order", "status"), "update", "done"),
        Change(("extra",), "add", 1),
        Change(("notes",), "delete"),
    ]
    after, applied, violations = apply_changes(before, changes, rules)
    assert after == {"order": {"status": "done"}, "notes": "x"}
    assert [c.path for c in applied] == [("order", "status")]
    assert [(v["path"], v["op"]) for v in violations] == [("extra", "add"), ("notes", "delete")]
    assert before == {"order": {"status": "open"}, "notes": "x"}  # never changed in place
