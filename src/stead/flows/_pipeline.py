"""Pipelines: a bounded server-side dataflow, for loop agents that opt in (`builtin_tools: [pipeline]`).

The model sends one `run_pipeline` call with a list of stages; a JSON value flows from stage to stage inside
the process and only the final value returns to the model — a thousand rows can be fetched, filtered,
sorted and counted without one of them entering the context. The whole pipeline is one tool step of the
run; each stage is recorded as a child step of it (verb, sizes in and out, duration, error).

Stages (one verb each):

    {"value": <json>}                                  a literal
    {"tool": NAME, "with": {...}, "pipe_into": ARG}    call one of the agent's tools; in `with`, "$" is the
                                                        current value, "$.a.b" a path into it, "$name" a
                                                        `let` binding; `pipe_into` passes the current value
    {"map": [stages], "as": NAME, "concurrency": 8, "continue_on_error": false}
                                                        run a sub-pipeline per element (≤ 1,000 elements,
                                                        ≤ 8 at a time); the element is "$" (or "$NAME")
    {"let": NAME, "do": [stages]}                      bind a sub-pipeline's result (or the current value)
    {"where": EXPR}  {"select": EXPR | [fields]}  {"sort": EXPR, "desc": false}  {"group_by": EXPR}
    {"distinct": true | EXPR}  {"first": N}  {"last": N}  {"head": N}  {"tail": N}  {"count": true}
    {"flatten": true}  {"path": EXPR}  {"lines": true}  {"grep": REGEX, "ignore_case": false}

EXPR is a JMESPath expression (the flows' expression language) evaluated on each element (`where`, `select`,
`sort`, `group_by`, `distinct`) or on the whole value (`path`); predicates use `== != < <= > >=`,
`contains(@, 'x')`, `starts_with`, `ends_with`, `&&`, `||`, `!`. `grep` takes a regular expression of at most
200 characters and keeps matching lines (or strings).

Bounds: at most 20 stages in all (nested ones count), 1,000 elements per `map`, a deadline (120 s by default;
a call may ask for less), and a final value of at most 8,000 characters in the answer (cut with a note). A
failure names the stage; a stage that empties a non-empty list adds a note saying which.

The pipeline tool is *at most once* (not durable): it may call tools that must not run twice, so a pipeline
cut off by a crash is in doubt, never re-run. Only the agent's own tools may be called (not sub-agents, not
transactional tools, not `run_pipeline` itself); tools whose `metadata["stead.pipeline"]` is False are
refused too.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stead.extend import (
    CallKV,
    InvalidInput,
    Tool,
    ToolArgumentError,
    ToolContext,
    dumps,
    render_output,
    tool,
)
from stead.flows._compute import MAX_REGEX_CHARS, MAX_VALUE_CHARS, ComputeError, compile_regex, kind_of
from stead.flows._expr import Expression, ExpressionError, compile_expression
from stead.flows._sandbox import ComputeFailed, ComputeTimeout, compute

__all__ = [
    "MAX_MAP_ITEMS",
    "MAX_STAGES",
    "PIPELINE_TOOL",
    "PipelineError",
    "pipeline_tool",
    "run_pipeline",
]

PIPELINE_TOOL = "run_pipeline"
MAX_STAGES = 20
MAX_MAP_ITEMS = 1000
MAP_CONCURRENCY = 8
DEFAULT_DEADLINE = 120.0
MAX_RESULT_CHARS = 8000
OPT_OUT_KEY = "stead.pipeline"

_VERBS = (
    "value",
    "tool",
    "map",
    "let",
    "where",
    "select",
    "sort",
    "group_by",
    "distinct",
    "first",
    "last",
    "head",
    "tail",
    "count",
    "flatten",
    "path",
    "lines",
    "grep",
)
_OPTIONS = {
    "tool": {"with", "pipe_into"},
    "map": {"as", "concurrency", "continue_on_error"},
    "let": {"do"},
    "sort": {"desc"},
    "grep": {"ignore_case"},
}


class PipelineError(Exception):
    """A pipeline that cannot run, or a stage that failed (the message names it)."""


@dataclass
class _Stage:
    index: str
    verb: str
    arg: Any
    options: dict[str, Any]
    expr: Expression | None = None
    sub: list[_Stage] = field(default_factory=list)


@dataclass
class _Run:
    ctx: ToolContext
    tools: dict[str, Tool]
    deadline: float
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calls: int = 0

    def check_time(self, where: str) -> None:
        if time.monotonic() > self.deadline:
            raise PipelineError(f"{where}: the pipeline's deadline passed")


# ------------------------------------------------------------------------------------------------ compile
def compile_stages(stages: Any, prefix: str = "", counter: list[int] | None = None) -> list[_Stage]:
    counter = counter if counter is not None else [0]
    if not isinstance(stages, list) or not stages:
        raise PipelineError(f"stages{prefix and ' of ' + prefix}: give a non-empty list of stages")
    out: list[_Stage] = []
    for i, raw in enumerate(stages):
        where = f"{prefix}{i + 1}"
        counter[0] += 1
        if counter[0] > MAX_STAGES:
            raise PipelineError(f"a pipeline has at most {MAX_STAGES} stages (nested ones count)")
        if not isinstance(raw, dict):
            raise PipelineError(f'stage {where}: a stage is an object such as {{"where": "price > `10`"}}')
        verbs = [k for k in raw if k in _VERBS]
        if len(verbs) != 1:
            raise PipelineError(
                f"stage {where}: needs exactly one verb of {', '.join(_VERBS)} "
                f"(found: {', '.join(verbs) or 'none'})"
            )
        verb = verbs[0]
        options = {k: v for k, v in raw.items() if k != verb}
        unknown = sorted(set(options) - _OPTIONS.get(verb, set()))
        if unknown:
            raise PipelineError(f"stage {where} ({verb}): unknown option(s) {', '.join(unknown)}")
        stage = _Stage(where, verb, raw[verb], options)
        try:
            if (
                verb in ("where", "path", "group_by")
                or (verb in ("select", "sort") and isinstance(stage.arg, str))
                or (verb == "distinct" and isinstance(stage.arg, str))
            ):
                stage.expr = compile_expression(stage.arg)
        except ExpressionError as e:
            raise PipelineError(f"stage {where} ({verb}): {e}") from None
        if verb == "select" and not isinstance(stage.arg, str | list):
            raise PipelineError(f"stage {where} (select): give an expression or a list of field names")
        if verb == "grep":
            if not isinstance(stage.arg, str) or not stage.arg or len(stage.arg) > MAX_REGEX_CHARS:
                raise PipelineError(
                    f"stage {where} (grep): a regular expression of 1-{MAX_REGEX_CHARS} characters"
                )
            try:  # RE2 (linear time), compiled here too so a bad pattern fails before any stage runs
                compile_regex(stage.arg, bool(options.get("ignore_case")))
            except ComputeError as e:
                raise PipelineError(f"stage {where} (grep): {e}") from None
        if verb in ("first", "last", "head", "tail"):
            if stage.arg is True:
                stage.arg = 1
            if isinstance(stage.arg, bool) or not isinstance(stage.arg, int) or stage.arg < 0:
                raise PipelineError(f"stage {where} ({verb}): give a count (0 or more)")
        if verb == "tool" and not isinstance(stage.arg, str):
            raise PipelineError(f"stage {where} (tool): give the tool's name")
        if verb == "map":
            stage.sub = compile_stages(stage.arg, f"{where}.", counter)
            conc = options.get("concurrency", MAP_CONCURRENCY)
            if isinstance(conc, bool) or not isinstance(conc, int) or not 1 <= conc <= MAP_CONCURRENCY:
                raise PipelineError(f"stage {where} (map): concurrency is 1-{MAP_CONCURRENCY}")
        if verb == "let":
            if not isinstance(stage.arg, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", stage.arg):
                raise PipelineError(f"stage {where} (let): give a name for the binding")
            if "do" in options:
                stage.sub = compile_stages(options["do"], f"{where}.", counter)
        out.append(stage)
    return out


# ------------------------------------------------------------------------------------------------ run
async def run_pipeline(
    stages: Any,
    ctx: ToolContext,
    tools: dict[str, Tool],
    *,
    deadline: float = DEFAULT_DEADLINE,
    records: list[dict[str, Any]] | None = None,
) -> tuple[Any, list[dict[str, Any]], list[str]]:
    """Run a pipeline; return (final value, per-stage records, notes). Raises `PipelineError` (the stages
    that ran are in `records`, when given, also then)."""
    compiled = compile_stages(stages)
    run = _Run(ctx, tools, time.monotonic() + deadline, records if records is not None else [])
    try:
        async with asyncio.timeout(deadline):
            value, _ = await _stages(run, compiled, None, {}, top=True)
    except TimeoutError:
        raise PipelineError(f"the pipeline did not finish within its deadline of {deadline:g}s") from None
    return value, run.records, run.notes


async def _stages(
    run: _Run, stages: list[_Stage], value: Any, scope: dict[str, Any], *, top: bool, chars: int = 0
) -> tuple[Any, int]:
    """Run `stages` over `value` (of `chars` characters as JSON): (the last value, its characters)."""
    for stage in stages:
        run.check_time(f"stage {stage.index} ({stage.verb})")
        started = time.monotonic()
        before, before_chars = value, chars
        try:
            value, chars = await _stage(run, stage, value, chars, scope)
        except PipelineError as e:
            if top:
                run.records.append(_record(stage, (before, before_chars), None, started, str(e)))
            raise
        if top:
            run.records.append(_record(stage, (before, before_chars), (value, chars), started, None))
        if isinstance(before, list) and before and isinstance(value, list) and not value:
            run.notes.append(f"stage {stage.index} ({stage.verb}) turned {len(before)} items into none")
    return value, chars


def _record(
    stage: _Stage, before: tuple[Any, int], after: tuple[Any, int] | None, started: float, error: str | None
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "stage": stage.index,
        "verb": stage.verb,
        "in": _size(*before),
        "ms": round((time.monotonic() - started) * 1000, 3),
    }
    if stage.verb == "tool":
        rec["tool"] = stage.arg
    if error is None and after is not None:
        rec["out"] = _size(*after)
    else:
        rec["error"] = error
    return rec


def _size(value: Any, chars: int) -> dict[str, int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return {"items": len(value)}
    return {"chars": len(value) if isinstance(value, str) else chars}


def _check_size(where: str, chars: int) -> int:
    if chars > MAX_VALUE_CHARS:
        raise PipelineError(
            f"{where}: the value grew past {MAX_VALUE_CHARS:,} characters (reduce it with select, head or "
            "count first)"
        )
    return chars


async def _compute(run: _Run, where: str, fn: str, *args: Any) -> tuple[Any, int]:
    """SEC4: a data computation in a worker process, killed at the pipeline's deadline."""
    try:
        result: tuple[Any, int] = await compute(fn, *args, deadline=run.deadline)
    except ComputeTimeout:
        raise PipelineError(f"{where}: the pipeline's deadline passed (the stage was stopped)") from None
    except ComputeFailed as e:
        raise PipelineError(str(e)) from None
    return result


async def _resolve(run: _Run, arg: Any, value: Any, scope: dict[str, Any], where: str) -> Any:
    """`with` arguments: "$" is the current value, "$.path" a path into it, "$name[.path]" a binding."""
    if isinstance(arg, dict):
        return {k: await _resolve(run, v, value, scope, where) for k, v in arg.items()}
    if isinstance(arg, list):
        return [await _resolve(run, v, value, scope, where) for v in arg]
    if not isinstance(arg, str) or not arg.startswith("$"):
        return arg
    if arg == "$":
        return value
    if arg.startswith("$."):
        base, path = value, arg[2:]
    else:
        name, _, path = arg[1:].partition(".")
        if name not in scope:
            raise PipelineError(f"{where}: {arg!r} names no binding (bindings: {', '.join(scope) or 'none'})")
        base = scope[name]
    if not path:
        return base
    try:
        compile_expression(path)
    except ExpressionError as e:
        raise PipelineError(f"{where}: {arg!r}: {e}") from None
    # the path is evaluated in a worker process too (SEC4)
    found, _ = await _compute(run, where, "path", path, base, f"{where}: {arg!r}")
    return found


async def _stage(run: _Run, stage: _Stage, value: Any, chars: int, scope: dict[str, Any]) -> tuple[Any, int]:
    verb, arg = stage.verb, stage.arg
    where = f"stage {stage.index} ({verb})"
    if verb == "value":
        return arg, len(dumps(arg))  # a literal of the call's own (bounded) arguments
    if verb == "tool":
        return await _call_tool(run, stage, value, scope)
    if verb == "map":
        if not isinstance(value, list):
            raise PipelineError(f"{where}: needs a list, got {kind_of(value)}")
        return await _map(run, stage, value, scope)
    if verb == "let":
        if stage.sub:
            scope[arg], _ = await _stages(run, stage.sub, value, scope, top=False, chars=chars)
        else:
            scope[arg] = value
        return value, chars
    # every data stage runs in a worker process, killed at the deadline, which sizes its result (SEC4)
    result: tuple[Any, int] = await _compute(run, where, "stage", where, verb, arg, stage.options, value)
    return result


async def _call_tool(run: _Run, stage: _Stage, value: Any, scope: dict[str, Any]) -> tuple[Any, int]:
    where = f"stage {stage.index} (tool {stage.arg})"
    t = run.tools.get(stage.arg)
    if t is None:
        known = ", ".join(sorted(run.tools)) or "none"
        raise PipelineError(f"{where}: not a tool this pipeline may call (tools: {known})")
    args = await _resolve(run, stage.options.get("with") or {}, value, scope, where)
    if not isinstance(args, dict):
        raise PipelineError(f"{where}: 'with' must be an object of arguments")
    pipe = stage.options.get("pipe_into")
    if pipe is not None:
        args[str(pipe)] = value
    try:
        validated = t.validate(args)
    except ToolArgumentError as e:
        raise PipelineError(f"{where}: {e}") from None
    run.calls += 1
    call_id = f"{run.ctx.call_id}.s{run.calls}"  # under the pipeline call's KV prefix: erased with its result
    ctx = ToolContext(
        call_id=call_id,
        tool_name=t.name,
        agent_id=run.ctx.agent_id,
        run_id=run.ctx.run_id,
        permission_mode=run.ctx.permission_mode,
        kv=CallKV(run.ctx.store, run.ctx.agent_id, call_id),
        store=run.ctx.store,
    )
    try:
        output = await t.call(ctx, validated)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        raise PipelineError(f"{where}: the tool failed: {type(e).__name__}: {e}") from None
    text = output if isinstance(output, str) else render_output(output)
    _check_size(where, len(text))
    try:
        return json.loads(text), len(text)
    except RecursionError:
        raise PipelineError(f"{where}: the tool's output is too deeply nested") from None
    except ValueError:
        if not isinstance(output, str):
            raise PipelineError(f"{where}: the tool's output is not JSON") from None
        return output, len(dumps(output))


async def _map(run: _Run, stage: _Stage, items: list[Any], scope: dict[str, Any]) -> tuple[list[Any], int]:
    if len(items) > MAX_MAP_ITEMS:
        raise PipelineError(
            f"stage {stage.index} (map): {len(items):,} items; the limit is {MAX_MAP_ITEMS:,}"
        )
    name = stage.options.get("as")
    sem = asyncio.Semaphore(int(stage.options.get("concurrency", MAP_CONCURRENCY)))
    keep_going = bool(stage.options.get("continue_on_error"))

    async def one(item: Any) -> tuple[Any, int]:
        async with sem:
            inner = dict(scope)
            if isinstance(name, str):
                inner[name] = item
            try:
                return await _stages(run, stage.sub, item, inner, top=False)
            except PipelineError as e:
                if keep_going:
                    error = {"error": str(e)}
                    return error, len(dumps(error))
                raise

    results = await asyncio.gather(*(one(x) for x in items))
    # the items' sizes add up (their text, commas and brackets): a map cannot outgrow the value limit
    chars = _check_size(f"stage {stage.index} (map)", sum(c for _, c in results) + len(results) + 1)
    return [v for v, _ in results], chars


# ------------------------------------------------------------------------------------------------ the tool
ToolsFor = Callable[[str], dict[str, Tool]]


def pipeline_tool(tools_for: ToolsFor, on_records: Callable[[str, list[dict[str, Any]]], None]) -> Tool:
    """`run_pipeline`, calling the tools `tools_for(agent_id)` allows; `on_records(call_id, records)` gets the
    per-stage records (stored as child steps when the call's result commits)."""

    async def run_pipeline_tool(
        ctx: ToolContext, stages: list[dict[str, Any]], deadline_seconds: float | None = None
    ) -> str:
        """Run a server-side pipeline of stages over JSON data; only the final value comes back to you.

        Use it to call tools and filter, sort, count or reshape their output without reading all of it.
        Stages (one verb each): value, tool (+with, pipe_into), map (+as, concurrency, continue_on_error),
        let (+do), where, select, sort (+desc), group_by, distinct, first, last, head, tail, count, flatten,
        path, lines, grep (+ignore_case). Expressions are JMESPath over each element, e.g.
        {"where": "price > `10` && contains(tags, 'new')"}; in tool arguments "$" is the current value.
        At most 20 stages and 1,000 items per map.

        Args:
            stages: The stages, in order.
            deadline_seconds: Stop after this many seconds (at most 120).
        """
        deadline = (
            DEFAULT_DEADLINE
            if deadline_seconds is None
            else min(max(deadline_seconds, 0.001), DEFAULT_DEADLINE)
        )
        records: list[dict[str, Any]] = []
        try:
            value, records, notes = await run_pipeline(
                stages, ctx, tools_for(ctx.agent_id), deadline=deadline, records=records
            )
        except PipelineError as e:
            on_records(ctx.call_id, records)
            raise InvalidInput(f"pipeline failed: {e}") from None
        on_records(ctx.call_id, records)
        text = value if isinstance(value, str) else dumps(value)
        if len(text) > MAX_RESULT_CHARS:
            text = (
                text[:MAX_RESULT_CHARS] + f"…[cut: the final value has {len(text):,} characters; "
                "reduce it with select, head or count]"
            )
        if notes:
            text += "\n\nNote: " + "; ".join(notes) + "."
        return text

    t = tool(name=PIPELINE_TOOL)(run_pipeline_tool)
    t.metadata[OPT_OUT_KEY] = False
    return t
