"""Flow navigation (issue 16): start steps, priority and fallback paths, failure → recovery path else failed,
mappings in and out of the payload, prompt steps with structured output, while's maximum, for-each caps,
a flow as a sub-agent of a loop agent and the other way round, and every step as a recorded run step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import stead
from tests.fakes import flows as F

TOOLS = "tools: [" + ", ".join(f"tests.fakes.flows:{t}" for t in ("lookup", "refund", "fail", "echo")) + "]"


async def run_flow(
    db_url: str, team: Path, name: str, message: str = "go", payload: dict[str, Any] | None = None, **kw: Any
) -> tuple[stead.RunResult, stead.Run]:
    async with await stead.open(db_url, definitions=team, **kw) as system:
        agent = await system.create(definition=name)
        result = await agent.run(message, payload=payload)
        return result, await system.run(result.run_id)


def step_names(run: stead.Run) -> list[str]:
    return [s.name.split(": ", 1)[1] for s in run.steps if s.name]


async def test_F2_paths_are_tried_by_descending_priority(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "router",
        f"""
        {TOOLS}
        steps:
          - {{name: start, tool: echo, input: {{text: "'hello'"}}}}
          - {{name: low, tool: echo, input: {{text: "'low'"}}}}
          - {{name: high, tool: echo, input: {{text: "'high'"}}}}
          - {{name: never, tool: echo, input: {{text: "'never'"}}}}
        paths:
          - {{from: start, to: low, when: "payload.n > `0`", priority: 1}}
          - {{from: start, to: high, when: "payload.n > `5`", priority: 10}}
          - {{from: start, to: never, when: "payload.n > `100`", priority: 20}}
        """,
    )
    result, run = await run_flow(db_url, team, "router", payload={"n": 7})
    assert result.ok and result.text == "high"
    assert step_names(run) == ["start", "high"]
    result, run = await run_flow(db_url, team, "router", payload={"n": 3})
    assert result.text == "low"
    assert step_names(run) == ["start", "low"]


async def test_F2_unconditional_paths_at_priority_0_or_less_are_the_fallback(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "fallback",
        f"""
        {TOOLS}
        steps:
          - {{name: start, tool: echo, input: {{text: "'x'"}}}}
          - {{name: special, tool: echo, input: {{text: "'special'"}}}}
          - {{name: usual, tool: echo, input: {{text: "'usual'"}}}}
          - {{name: worse, tool: echo, input: {{text: "'worse'"}}}}
          - {{name: always, tool: echo, input: {{text: "'always'"}}}}
        paths:
          - {{from: start, to: worse, priority: -5}}
          - {{from: start, to: usual, priority: 0}}
          - {{from: start, to: special, when: "payload.special", priority: 1}}
        """,
    )
    result, _ = await run_flow(db_url, team, "fallback", payload={"special": True})
    assert result.text == "special"
    result, _ = await run_flow(db_url, team, "fallback", payload={})
    assert result.text == "usual"  # no valid path: the fallback with the highest priority (0 before -5)

    F.write_flow(
        team,
        "fallback",
        f"""
        {TOOLS}
        steps:
          - {{name: start, tool: echo, input: {{text: "'x'"}}}}
          - {{name: special, tool: echo, input: {{text: "'special'"}}}}
          - {{name: always, tool: echo, input: {{text: "'always'"}}}}
        paths:
          - {{from: start, to: always, priority: 1}}
          - {{from: start, to: special, when: "payload.special", priority: 5}}
        """,
    )
    result, _ = await run_flow(db_url, team, "fallback", payload={})
    assert result.text == "always"  # an unconditional path with priority > 0 is always valid


async def test_F2_the_start_step_and_no_path_ends_the_flow_completed(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "starts",
        f"""
        {TOOLS}
        steps:
          - {{name: first, tool: echo, input: {{text: "'first'"}}}}
          - {{name: second, tool: echo, input: {{text: "'second'"}}, start: true}}
        """,
    )
    result, run = await run_flow(db_url, team, "starts")
    assert result.ok and result.text == "second"
    assert step_names(run) == ["second"]


async def test_F3_a_failed_step_follows_a_matching_path_as_recovery_and_the_flow_completes(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "recover",
        f"""
        {TOOLS}
        steps:
          - {{name: risky, tool: fail, input: {{reason: "'disk full'"}}}}
          - {{name: next, tool: echo, input: {{text: "'next'"}}}}
          - {{name: recover, tool: echo, input: {{text: "join(' ', ['recovered from', step.error])"}}}}
        paths:
          - {{from: risky, to: next, when: "step.status == 'completed'"}}
          - {{from: risky, to: recover, when: "step.status == 'failed'"}}
        """,
    )
    result, run = await run_flow(db_url, team, "recover")
    assert result.ok, result.error
    assert result.outcome is stead.Outcome.COMPLETED
    assert result.text.startswith("recovered from Tool 'fail' failed: RuntimeError: disk full")
    assert [(s.name, s.status) for s in run.steps] == [
        ("recover: risky", "failed"),
        ("recover: recover", "completed"),
    ]
    assert run.status == "completed"


async def test_F3_a_failed_step_without_a_path_fails_the_flow(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "doomed",
        f"""
        {TOOLS}
        steps:
          - {{name: risky, tool: fail, input: {{reason: "'disk full'"}}}}
          - {{name: next, tool: echo, input: {{text: "'next'"}}}}
        paths:
          - {{from: risky, to: next, when: "step.status == 'completed'"}}
        """,
    )
    result, run = await run_flow(db_url, team, "doomed")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None
    assert (
        "flow doomed failed: step 'risky' failed: Tool 'fail' failed: RuntimeError: disk full" in result.error
    )
    assert run.status == "failed" and run.error is not None and "step 'risky' failed" in run.error
    assert F.EXECUTIONS["echo:next"] == 0


async def test_F3_an_unconditional_path_is_not_followed_after_a_failure(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "plain",
        f"""
        {TOOLS}
        steps:
          - {{name: risky, tool: fail}}
          - {{name: next, tool: echo, input: {{text: "'next'"}}}}
          - {{name: last, tool: echo, input: {{text: "'last resort'"}}}}
        paths:
          - {{from: risky, to: next}}
          - {{from: risky, to: last, priority: -1}}
        """,
    )
    result, _ = await run_flow(db_url, team, "plain")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "step 'risky' failed" in result.error
    assert F.EXECUTIONS["echo:next"] == 0 and F.EXECUTIONS["echo:last resort"] == 0


async def test_F3_a_condition_that_cannot_be_evaluated_fails_the_flow(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "badcond",
        f"""
        {TOOLS}
        steps:
          - {{name: a, tool: echo, input: {{text: "'a'"}}}}
          - {{name: b, tool: echo, input: {{text: "'b'"}}}}
        paths:
          - {{from: a, to: b, when: "length(step.output) > `0` && abs(step.output) > `1`"}}
        """,
    )
    result, _ = await run_flow(db_url, team, "badcond")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "the condition of the path a → b failed" in result.error


async def test_F9_mappings_read_payload_input_steps_and_statics_and_write_the_payload(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "mapper",
        f"""
        {TOOLS}
        steps:
          - name: find
            tool: lookup
            input: {{order: "payload.order_id"}}
            output: {{order: "step.output", "log[]": "'looked up'"}}
          - name: pay
            tool: refund
            input: {{order: "steps.find.output.order", amount: 12.5}}
            output: {{"log[]": "step.output", said: "input.text"}}
        paths:
          - {{from: find, to: pay}}
        result: "join(' / ', payload.log)"
        """,
    )
    result, _ = await run_flow(
        db_url, team, "mapper", "please refund", payload={"order_id": 7, "log": ["start"]}
    )
    assert result.ok, result.error
    assert result.text == "start / looked up / refunded 12.5 for order 7"
    assert result.payload == {
        "order_id": 7,
        "log": ["start", "looked up", "refunded 12.5 for order 7"],
        "order": {"order": 7, "amount": 30, "status": "delivered"},
        "said": "please refund",
    }


async def test_F10_prompt_step_structured_output_is_merged_into_the_payload(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "classify",
        f"""
        {TOOLS}
        steps:
          - name: classify
            prompt: "Classify the message {{{{ input.text }}}} of order {{{{ payload.order_id }}}}."
            output_schema:
              type: object
              required: [label]
              properties: {{label: {{enum: [refund, other]}}}}
          - {{name: pay, tool: refund, input: {{order: "payload.order_id", amount: "`5`"}}}}
        paths:
          - {{from: classify, to: pay, when: "payload.label == 'refund'"}}
        """,
        model="scripted:model.yaml",
    )
    seen: list[stead.ProviderRequest] = []

    def answer(request: stead.ProviderRequest) -> Any:
        seen.append(request)
        return {"label": "refund", "why": "broken"}

    result, run = await run_flow(
        db_url,
        team,
        "classify",
        "it arrived broken",
        payload={"order_id": 3},
        providers={"scripted/classify": F.prompt_model(answer)},
    )
    assert result.ok, result.error
    assert result.payload == {"order_id": 3, "label": "refund", "why": "broken"}
    assert F.EXECUTIONS["refund:3"] == 1
    (request,) = seen
    assert request.instructions == "Classify the message it arrived broken of order 3."
    assert request.tools == []
    assert '"order_id": 3' in request.messages[0].text  # the default input: the run's input and payload
    prompt = [s for s in run.steps if s.type == "prompt"]
    assert [s.name for s in prompt] == ["classify: classify"]
    assert run.input_tokens > 0  # the model call is counted, the navigation responses are not


async def test_F10_prompt_step_answer_outside_its_schema_is_a_failed_step(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "strict",
        """
        steps:
          - name: classify
            prompt: "Classify."
            output_schema: {type: object, required: [label]}
        """,
        model="scripted:model.yaml",
    )
    result, _ = await run_flow(
        db_url,
        team,
        "strict",
        providers={"scripted/strict": F.prompt_model(lambda r: "I think it is a refund")},
    )
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "the answer is not JSON" in result.error
    result, _ = await run_flow(
        db_url, team, "strict", providers={"scripted/strict": F.prompt_model(lambda r: {"kind": "refund"})}
    )
    assert result.error is not None and "missing 'label'" in result.error


async def test_F8_while_stops_when_its_condition_fails(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "counter",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - name: loop
            while:
              when: "payload.n < `5`"
              do: {tool: count, input: {value: "payload.n"}, output: {n: "step.output"}}
        """,
    )
    result, run = await run_flow(db_url, team, "counter", payload={"n": 1})
    assert result.ok, result.error
    assert result.payload == {"n": 5}
    assert step_names(run) == ["loop[0]", "loop[1]", "loop[2]", "loop[3]"]


async def test_F8_while_fails_at_its_maximum(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "forever",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - name: loop
            while:
              when: "`true`"
              max: 3
              do: {tool: count, input: {value: "iteration"}}
          - {name: after, tool: count, input: {value: "`100`"}}
        paths:
          - {from: loop, to: after, when: "step.status == 'completed'"}
        """,
    )
    result, run = await run_flow(db_url, team, "forever")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None
    assert "the while loop reached its maximum of 3 iterations and its condition still holds" in result.error
    assert [k for k in F.EXECUTIONS if k.startswith("count:")] == ["count:0", "count:1", "count:2"]
    assert len(run.steps) == 3


async def test_F6_for_each_sequential_threads_the_payload(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "each",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - name: each
            for_each:
              items: "payload.values"
              as: v
              do:
                tool: count
                input: {value: "add(v, length(payload.out || `[]`))"}
                output: {"out[]": step.output}
        """,
    )
    # JMESPath has no add(); a failing input expression is a failed iteration and fails the loop
    result, _ = await run_flow(db_url, team, "each", payload={"values": [1, 2]})
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "input:" in result.error

    F.write_flow(
        team,
        "each",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - name: each
            for_each:
              items: "payload.values"
              as: v
              do:
                tool: count
                input: {value: v}
                output:
                  "out[]": >-
                    join(':', [to_string(index), to_string(step.output),
                    to_string(length(payload.out || `[]`))])
        """,
    )
    result, _ = await run_flow(db_url, team, "each", payload={"values": [10, 20, 30]})
    assert result.ok, result.error
    # each iteration's output mapping sees the payload as the previous iterations left it
    assert result.payload is not None and result.payload["out"] == ["0:11:0", "1:21:1", "2:31:2"]


async def test_F6_for_each_refuses_more_items_than_its_cap(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "big",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - name: each
            for_each: {items: "payload.values", max_items: 3, do: {tool: count, input: {value: "item"}}}
        """,
    )
    result, _ = await run_flow(db_url, team, "big", payload={"values": [1, 2, 3, 4]})
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "has 4 items; the limit is 3" in result.error
    assert not F.EXECUTIONS
    result, _ = await run_flow(db_url, team, "big", payload={"values": "nope"})
    assert result.error is not None and "should give a list, not a string" in result.error


async def test_F2_a_cycle_of_paths_is_stopped_by_the_step_limit(db_url: str, team: Path) -> None:
    F.write_flow(
        team,
        "cycle",
        """
        tools: [tests.fakes.flows:count]
        steps:
          - {name: a, for_each: {items: "`[]`", do: {tool: count, input: {value: "`1`"}}}}
          - {name: b, for_each: {items: "`[]`", do: {tool: count, input: {value: "`1`"}}}}
        paths:
          - {from: a, to: b}
          - {from: b, to: a}
        """,
    )
    result, _ = await run_flow(db_url, team, "cycle")
    assert result.outcome is stead.Outcome.FAILED
    assert result.error is not None and "more than 1,000 steps" in result.error


async def test_F11_every_step_is_a_run_step_with_the_breadcrumb_and_navigation_is_no_model_call(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "steps",
        f"""
        {TOOLS}
        steps:
          - {{name: find, tool: lookup, input: {{order: "`1`"}}}}
          - {{name: pay, tool: refund, input: {{order: "`1`", amount: "`2`"}}}}
        paths:
          - {{from: find, to: pay}}
        limits: {{max_iterations: 1}}
        """,
    )
    result, run = await run_flow(db_url, team, "steps")
    assert result.ok, result.error  # three navigation responses, none a model request (max_iterations: 1)
    assert [(s.type, s.name, s.target) for s in run.steps] == [
        ("tool", "steps: find", "lookup"),
        ("tool", "steps: pay", "refund"),
    ]
    assert run.iterations == 0 and run.input_tokens == 0


async def test_F12_a_flow_is_a_sub_agent_of_a_loop_agent_and_a_loop_agent_of_a_flow(
    db_url: str, team: Path
) -> None:
    F.write(team, "lead.yaml", "name: lead\nmodel: scripted:model.yaml\nsub_agents: [pipeline]\n")
    F.write_flow(
        team,
        "pipeline",
        f"""
        {TOOLS}
        sub_agents: [helper]
        steps:
          - {{name: find, tool: lookup, input: {{order: input.order}}, output: {{found: step.output.amount}}}}
          - {{name: ask, sub_agent: helper, request: "join(' ', ['check order', to_string(payload.found)])"}}
        paths:
          - {{from: find, to: ask}}
        result: "join(' | ', [input.text, steps.ask.output])"
        """,
    )
    F.write(team, "helper.yaml", "name: helper\nmodel: scripted:model.yaml\n")

    def lead(request: stead.ProviderRequest) -> list[stead.Block]:
        results = [b for m in request.messages if m.role == "tool" for b in m.content]
        if not results:
            return [stead.ToolCall("pipeline", {"request": "handle order 5", "input": {"order": 5}})]
        return [stead.Text("lead got: " + results[-1].output)]  # type: ignore[union-attr]

    def helper(request: stead.ProviderRequest) -> list[stead.Block]:
        return [stead.Text("helper says: " + request.messages[-1].text)]

    providers = {
        "scripted/lead": stead.testing.ScriptedProvider(lead),
        "scripted/helper": stead.testing.ScriptedProvider(helper),
    }
    async with await stead.open(db_url, definitions=team, providers=providers) as system:
        agent = await system.create(definition="lead")
        result = await agent.run("go")
        run = await system.run(result.run_id)
    assert result.ok, result.error
    assert result.text == "lead got: handle order 5 | helper says: check order 30"
    (flow_run,) = run.children
    assert flow_run.agent_name == "pipeline" and flow_run.breadcrumb == "lead → pipeline"
    assert [s.name for s in flow_run.steps] == ["lead → pipeline: find", "lead → pipeline: ask"]
    (helper_run,) = flow_run.children
    assert helper_run.breadcrumb == "lead → pipeline → helper"
    assert flow_run.steps[1].type == "sub_agent" and flow_run.steps[1].target_run_id == helper_run.id


async def test_F10_a_parallel_for_each_of_prompt_steps_calls_the_model_once_per_item(
    db_url: str, team: Path
) -> None:
    F.write_flow(
        team,
        "tagger",
        """
        steps:
          - name: tag
            for_each:
              items: payload.words
              as: word
              parallel: true
              concurrency: 3
              do:
                prompt: "Tag the word {{ word }}."
                output: {"tags[]": step.output.tag}
        """,
        model="scripted:model.yaml",
    )

    def answer(request: stead.ProviderRequest) -> Any:
        word = request.instructions.removeprefix("Tag the word ").removesuffix(".")
        return {"tag": word.upper()}

    result, run = await run_flow(
        db_url,
        team,
        "tagger",
        payload={"words": ["a", "b", "c", "d"]},
        providers={"scripted/tagger": F.prompt_model(answer)},
    )
    assert result.ok, result.error
    assert result.payload is not None and result.payload["tags"] == ["A", "B", "C", "D"]  # index order
    prompts = [s.name for s in run.steps if s.type == "prompt"]
    assert prompts == ["tagger: tag[0], tag[1], tag[2]", "tagger: tag[3]"]  # one response per wave
    assert [s.name for s in run.steps if s.type == "tool"] == [
        "tagger: tag[0] (answer)",
        "tagger: tag[1] (answer)",
        "tagger: tag[2] (answer)",
        "tagger: tag[3] (answer)",
    ]
