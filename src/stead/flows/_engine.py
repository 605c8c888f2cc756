"""The flow engine: from a flow's durable state, decide what happens next.

A flow agent is a loop agent whose provider is this engine (`stead.flows._provider`). At every inference the
engine reads the flow state from the run KV (`stead.flows._state`), folds in the results of the calls the
previous step made (committed by the kernel's tool ledger, each with its full output in the run KV), and
walks the graph until it must wait for work:

- a `tool` or `sub_agent` step becomes one tool call (a sub-agent is called through its durable delegation
  tool); a `prompt` step becomes one model call whose answer is carried into the ledger by the built-in
  `flow_prompt` call; a `for_each` becomes waves of calls (one at a time, or up to `concurrency` in one batch,
  which the kernel runs concurrently and commits call by call); a `while` one call per iteration;
- when no path leads on, the flow ends: completed (with its `result` text), or failed after a failed step.

Navigation after a step (`step` in the expressions is the step that finished): its paths are tried by
descending priority — conditional paths and unconditional ones with priority > 0; an unconditional path is
always valid — and the first valid one is taken; if none is valid, the unconditional paths with priority ≤ 0
are the fallback. After a *failed* step only its conditional paths are candidates: one whose condition holds
(typically `step.status == 'failed'`) is a recovery path, and a flow that recovered ends completed; with
none, the flow fails. (MemberJunction also follows unconditional paths after a failure; stead does not, so
that `a → b` never runs `b` on the garbage of a failed `a`.)

The engine never writes the store: its decisions go into a `FlowTx` overlay that the caller flushes in the
transaction that dispatches the calls (or ends the run), so what the engine decided and the calls it made
become durable together, and a crash before that commit simply decides the same thing again.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from stead.extend import new_id, parse_answer
from stead.flows._expr import ExpressionError
from stead.flows._loader import Static
from stead.flows._paths import Change, Pattern, apply_changes, change_for, diff, filter_payload
from stead.flows._schema import FlowDefinition, FlowStep, StepBody
from stead.flows._state import HEAD, ITEMS, PAYLOAD, RAW, STEP, FlowTx

__all__ = [
    "MAX_FLOW_STEPS",
    "PROMPT_TOOL",
    "End",
    "FlowEngine",
    "NewInput",
    "Planned",
    "Work",
]

PROMPT_TOOL = "flow_prompt"
"""The built-in tool that carries a prompt step's answer into the tool ledger."""
MAX_FLOW_STEPS = 1000
"""Steps one flow execution may take (loop iterations not counted): a guard against path cycles."""
_MAX_TRANSITIONS = 10_000
_PROMPT_FAILED = f"Tool {PROMPT_TOOL!r} failed: PromptStepFailed: "
_TRAIL = 100


@dataclass
class NewInput:
    """The message a flow execution starts from."""

    text: str
    payload: dict[str, Any] | None = None
    input: dict[str, Any] | None = None


@dataclass
class Planned:
    """One call the engine makes: a tool call (`tool`, `arguments`), or a prompt (`prompt` set: the
    provider calls the model and carries the answer with a `flow_prompt` call of the same id)."""

    call_id: str
    step: str
    tool: str
    arguments: dict[str, Any]
    prompt: str | None = None
    """The rendered instructions of a prompt step."""
    message: str = ""
    """A prompt step's user message (its input, as JSON)."""
    schema: dict[str, Any] | None = None
    label: str = ""
    """How run records name the call: the step, with the iteration for a loop (`refund[3]`)."""


@dataclass
class Work:
    """Calls to dispatch (one batch)."""

    calls: list[Planned]


@dataclass
class End:
    status: str  # "completed" | "failed"
    text: str = ""
    error: str | None = None


class _FlowError(Exception):
    """The flow itself failed (not one of its steps): a condition or the result could not be evaluated."""


@dataclass
class _Ctx:
    """What an expression sees besides the payload and the step results."""

    step: dict[str, Any] | None = None
    loop: dict[str, Any] = field(default_factory=dict)


class FlowEngine:
    """The engine of one flow definition (compiled: `stead.flows._loader.compile_flow`)."""

    def __init__(self, definition: FlowDefinition) -> None:
        self.definition = definition
        self.name = definition.name
        self.steps: dict[str, FlowStep] = {s.name: s for s in definition.steps}
        self.start = next((s.name for s in definition.steps if s.start), definition.steps[0].name)
        self.paths: dict[str, list[Any]] = {}
        for p in definition.paths:
            self.paths.setdefault(p.from_, []).append(p)
        rules = definition.payload
        self.read: list[Pattern] | None = rules._read if rules is not None else None
        self.write: list[Pattern] | None = rules._write if rules is not None else None

    # ------------------------------------------------------------------------------------------ entry
    async def next(
        self, ft: FlowTx, new_input: NewInput | None, data: dict[str, Any] | None = None
    ) -> Work | End:
        """What to do now: calls to dispatch, or the end of the flow. Decisions are written into `ft`."""
        head = await ft.get(HEAD)
        if head is None or head.get("status") != "running":
            if new_input is None:
                if head is not None:  # asked again after the end: repeat the end, never re-run the flow
                    return End(head["status"], head.get("text") or "", head.get("error"))
                new_input = NewInput("")
            head = await self._start(ft, new_input)
        ft.data = dict(data or {})
        try:
            return await self._advance(ft, head)
        except _FlowError as e:
            return self._fail(head, str(e))
        finally:
            ft.put(HEAD, head)

    async def _start(self, ft: FlowTx, new_input: NewInput) -> dict[str, Any]:
        for name in self.steps:
            if await ft.get(STEP + name) is not None:
                ft.delete(STEP + name)
        if await ft.get(ITEMS) is not None:
            ft.delete(ITEMS)
        payload = new_input.payload if isinstance(new_input.payload, dict) else {}
        ft.put(PAYLOAD, payload)
        inp: dict[str, Any] = {"text": new_input.text}
        if new_input.input:
            inp.update(new_input.input)
        return {
            "v": 1,
            "exec": new_id(),
            "status": "running",
            "input": inp,
            "at": None,
            "calls": {},
            "frame": None,
            "last": None,
            "prev": None,
            "seq": 0,
            "trail": [],
        }

    # ------------------------------------------------------------------------------------------ the walk
    async def _advance(self, ft: FlowTx, head: dict[str, Any]) -> Work | End:
        for _ in range(_MAX_TRANSITIONS):
            if head["calls"]:
                await self._collect(ft, head)
                continue
            if head["frame"] is not None:
                work = await self._loop(ft, head)
                if work is not None:
                    return work
                continue
            if head["last"] is not None:
                nxt = await self._navigate(ft, head)
                if nxt is None:
                    return await self._end(ft, head)
                work = await self._enter(ft, head, nxt)
            elif head["at"] is None:
                work = await self._enter(ft, head, self.start)
            else:  # pragma: no cover - a state this engine never writes
                head["last"] = _result(head["at"], "failed", None, "the flow state was inconsistent")
                continue
            if work is not None:
                return work
        head["last"] = None
        return self._fail(head, "the flow made no progress (a cycle of steps that do no work?)")

    async def _end(self, ft: FlowTx, head: dict[str, Any]) -> End:
        last = await self._prev(ft, head) or {}
        if last.get("status") == "failed":
            return self._fail(head, f"step {last.get('name')!r} failed: {last.get('error')}")
        text = ""
        if self.definition._result is not None:
            context = await self._context(ft, head, _Ctx(step=last or None))
            try:
                text = _as_text(self.definition._result.evaluate(context))
            except ExpressionError as e:
                raise _FlowError(f"result: {e}") from None
        elif last.get("output") is not None:
            text = _as_text(last.get("output"))
        head["status"] = "completed"
        head["text"] = text or f"Flow {self.name} completed."
        return End("completed", head["text"])

    def _fail(self, head: dict[str, Any], error: str) -> End:
        head["status"] = "failed"
        head["error"] = f"flow {self.name} failed: {error}"
        return End("failed", error=head["error"])

    async def _navigate(self, ft: FlowTx, head: dict[str, Any]) -> str | None:
        last = head["last"]
        head["last"] = None
        head["prev"] = last["name"]  # its result is `steps.<name>` (kept once, not in the head)
        context = await self._context(ft, head, _Ctx(step=last))
        candidates = self.paths.get(last["name"], [])
        if last["status"] == "failed":
            # recovery: only paths whose condition holds (`when: "step.status == 'failed'"`); an
            # unconditional path means "next, once this step has completed"
            primary = [p for p in candidates if p.when is not None]
            fallback = []
        else:
            primary = [p for p in candidates if p.when is not None or p.priority > 0]
            fallback = [p for p in candidates if p.when is None and p.priority <= 0]
        for group in (primary, fallback):
            for p in sorted(group, key=lambda p: -p.priority):
                if p._when is None:
                    return str(p.to)
                try:
                    if p._when.test(context):
                        return str(p.to)
                except ExpressionError as e:
                    raise _FlowError(f"the condition of the path {p.from_} → {p.to} failed: {e}") from None
        return None

    async def _prev(self, ft: FlowTx, head: dict[str, Any]) -> dict[str, Any] | None:
        """The step that finished last (`step` in the next step's input mappings)."""
        name = head["prev"]
        if name is None:
            return None
        found = await ft.get(STEP + name)
        return {"name": name, **found} if isinstance(found, dict) else None

    async def _enter(self, ft: FlowTx, head: dict[str, Any], name: str) -> Work | None:
        step = self.steps[name]
        head["seq"] += 1
        head["at"] = name
        head["trail"] = [*head["trail"], name][-_TRAIL:]
        if head["seq"] > MAX_FLOW_STEPS:
            raise _FlowError(f"it took more than {MAX_FLOW_STEPS:,} steps (do its paths form a cycle?)")
        ctx = _Ctx(step=await self._prev(ft, head))
        if step.for_each is not None:
            try:
                items = step.for_each._items.evaluate(await self._context(ft, head, ctx))
            except ExpressionError as e:
                self._finish(ft, head, _result(name, "failed", None, f"for_each.items: {e}"))
                return None
            if not isinstance(items, list):
                error = f"for_each.items should give a list, not {_kind(items)}"
                self._finish(ft, head, _result(name, "failed", None, error))
                return None
            cap = step.for_each.max_items
            if len(items) > cap:
                error = f"for_each.items has {len(items):,} items; the limit is {cap:,}"
                self._finish(ft, head, _result(name, "failed", None, error))
                return None
            ft.put(ITEMS, items)
            head["frame"] = {"kind": "for_each", "n": len(items), "next": 0, "ids": [], "failed": None}
            return None
        if step.while_ is not None:
            head["frame"] = {"kind": "while", "k": 0, "ids": [], "failed": None}
            return None
        planned = await self._plan(ft, head, name, step, ctx)
        if isinstance(planned, dict):
            self._finish(ft, head, planned)
            return None
        head["calls"] = {planned.call_id: -1}
        return Work([planned])

    # ------------------------------------------------------------------------------------------ loops
    async def _loop(self, ft: FlowTx, head: dict[str, Any]) -> Work | None:
        name = head["at"]
        step = self.steps[name]
        frame = head["frame"]
        if frame["kind"] == "for_each":
            spec = step.for_each
            assert spec is not None
            stop = frame["failed"] is not None and not spec.continue_on_error
            if frame["next"] < frame["n"] and not stop:
                items = await ft.get(ITEMS) or []
                prev = await self._prev(ft, head)
                wave = min(spec.concurrency, frame["n"] - frame["next"]) if spec.parallel else 1
                calls: list[Planned] = []
                for index in range(frame["next"], frame["next"] + wave):
                    loop = {spec.as_: items[index], "index": index}
                    planned = await self._plan(ft, head, name, spec.do, _Ctx(step=prev, loop=loop))
                    if isinstance(planned, dict):  # its input could not be built: a failed iteration
                        cid = "x" + new_id()
                        ft.put(RAW + cid, {"ok": False, "out": planned["error"]})
                        head["calls"][cid] = index
                        frame["ids"].append(cid)
                        continue
                    calls.append(planned)
                    head["calls"][planned.call_id] = index
                    frame["ids"].append(planned.call_id)
                frame["next"] += wave
                if calls:
                    return Work(calls)
                return None  # every iteration of the wave failed before it ran: collect them
            await self._finish_for_each(ft, head, step)
            return None
        spec_w = step.while_
        assert spec_w is not None
        if frame["failed"] is not None:
            self._finish(ft, head, await self._loop_result(ft, head, name, frame))
            return None
        k = frame["k"]
        prev = await self._prev(ft, head)
        context = await self._context(ft, head, _Ctx(step=prev, loop={"iteration": k}))
        try:
            holds = spec_w._when.test(context)
        except ExpressionError as e:
            self._finish(ft, head, _result(name, "failed", None, f"while.when: {e}"))
            return None
        if not holds:
            self._finish(ft, head, await self._loop_result(ft, head, name, frame))
            return None
        if k >= spec_w.max:
            error = (
                f"the while loop reached its maximum of {spec_w.max} iterations and its condition still holds"
            )
            result = await self._loop_result(ft, head, name, frame)
            self._finish(ft, head, {**result, "status": "failed", "error": error})
            return None
        planned = await self._plan(ft, head, name, spec_w.do, _Ctx(step=prev, loop={"iteration": k}))
        frame["k"] = k + 1
        if isinstance(planned, dict):
            frame["failed"] = planned["error"]
            return None
        head["calls"] = {planned.call_id: k}
        frame["ids"].append(planned.call_id)
        return Work([planned])

    async def _finish_for_each(self, ft: FlowTx, head: dict[str, Any], step: FlowStep) -> None:
        spec = step.for_each
        assert spec is not None
        frame = head["frame"]
        items = await ft.get(ITEMS) or []
        if spec.parallel:
            # merged in index order once every iteration has committed (each one's result is durable)
            for index, cid in enumerate(frame["ids"]):
                result = self._parse(step.name, spec.do, await ft.get(RAW + cid))
                error = await self._apply_output(
                    ft, head, spec.do, result, {spec.as_: items[index], "index": index}
                )
                if error is not None and frame["failed"] is None:
                    frame["failed"] = error
        result = await self._loop_result(ft, head, step.name, frame)
        if spec.continue_on_error and result["status"] == "failed":
            result = {**result, "status": "completed"}
        ft.delete(ITEMS)
        self._finish(ft, head, result)

    async def _loop_result(
        self, ft: FlowTx, head: dict[str, Any], name: str, frame: dict[str, Any]
    ) -> dict[str, Any]:
        body = self._body(self.steps[name])
        outputs: list[Any] = []
        first_error: str | None = frame["failed"]
        for cid in frame["ids"]:
            r = self._parse(name, body, await ft.get(RAW + cid))
            outputs.append(r["output"] if r["status"] == "completed" else None)
            if r["status"] == "failed" and first_error is None:
                first_error = r["error"]
        status = "failed" if first_error is not None else "completed"
        return _result(name, status, outputs, first_error)

    @staticmethod
    def _body(step: FlowStep) -> StepBody:
        if step.for_each is not None:
            return step.for_each.do
        if step.while_ is not None:
            return step.while_.do
        return step

    # ------------------------------------------------------------------------------------------ results
    async def _collect(self, ft: FlowTx, head: dict[str, Any]) -> None:
        """Fold in the results of the outstanding calls (each committed with its ledger result)."""
        name = head["at"]
        step = self.steps[name]
        calls: dict[str, int] = head["calls"]
        head["calls"] = {}
        body = self._body(step)
        frame = head["frame"]
        for cid, index in calls.items():
            raw = await ft.get(RAW + cid)
            result = self._parse(name, body, raw)
            if frame is None:
                error = await self._apply_output(ft, head, body, result, {})
                if error is not None:
                    result = _result(name, "failed", result["output"], error)
                self._finish(ft, head, result)
                continue
            sequential = frame["kind"] == "while" or (
                step.for_each is not None and not step.for_each.parallel
            )
            if sequential:
                if frame["kind"] == "while":
                    loop: dict[str, Any] = {"iteration": index}
                else:
                    assert step.for_each is not None
                    items = await ft.get(ITEMS) or []
                    loop = {step.for_each.as_: items[index], "index": index}
                error = await self._apply_output(ft, head, body, result, loop)
                if error is not None and frame["failed"] is None:
                    frame["failed"] = error
            if result["status"] == "failed" and frame["failed"] is None:
                frame["failed"] = result["error"]

    def _parse(self, name: str, body: StepBody, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            return _result(name, "failed", None, "the call ended without a recorded result")
        text = str(raw.get("out", ""))
        if not raw.get("ok"):
            if body.prompt is not None:
                text = text.removeprefix(_PROMPT_FAILED)
            return _result(name, "failed", None, text)
        return _result(
            name, "completed", parse_answer(text) if body.prompt is not None else _json_or_text(text)
        )

    def _finish(self, ft: FlowTx, head: dict[str, Any], result: dict[str, Any]) -> None:
        """A step finished: its result is `steps.<name>`; navigation comes next."""
        ft.put(STEP + result["name"], {k: result[k] for k in ("status", "output", "error")})
        head["frame"] = None
        head["at"] = None
        head["last"] = result

    async def _apply_output(
        self,
        ft: FlowTx,
        head: dict[str, Any],
        body: StepBody,
        result: dict[str, Any],
        loop: dict[str, Any],
    ) -> str | None:
        """A completed step's output mapping into the payload (a prompt step without one deep-merges its
        JSON object answer); changes outside `payload.write` are refused and recorded as violations.
        Returns the error of an output expression that failed (nothing is applied then)."""
        if result["status"] != "completed":
            return None
        payload = await ft.get(PAYLOAD) or {}
        changes: list[Change] = []
        if body._output:
            context = await self._context(ft, head, _Ctx(step=result, loop=loop))
            scratch = payload
            for target, expr in body._output:
                try:
                    value = expr.evaluate(context)
                except ExpressionError as e:
                    return f"output.{target}: {e}"
                change = change_for(scratch, target, value)
                changes.append(change)
                scratch, _, _ = apply_changes(scratch, [change], None)
        elif body.prompt is not None and isinstance(result["output"], dict):
            changes = diff(payload, _deep_merge(payload, result["output"]))
        if not changes:
            return None
        new, _, violations = apply_changes(payload, changes, self.write)
        ft.put(PAYLOAD, new)
        for v in violations:
            ft.violations.append({**v, "step": result["name"]})
        return None

    # ------------------------------------------------------------------------------------------ calls
    async def _plan(
        self, ft: FlowTx, head: dict[str, Any], name: str, body: StepBody, ctx: _Ctx
    ) -> Planned | dict[str, Any]:
        """The call a step body makes now, or a failed result when its input cannot be built."""
        context = await self._context(ft, head, ctx)
        try:
            arguments = _evaluate_input(body, context)
        except (ExpressionError, ValueError) as e:
            return _result(name, "failed", None, f"input: {e}")
        cid = new_id()
        at = ctx.loop.get("index", ctx.loop.get("iteration"))
        label = name if at is None else f"{name}[{at}]"
        if body.tool is not None:
            return Planned(cid, name, body.tool, arguments, label=label)
        if body.sub_agent is not None:
            try:
                request = body._request.evaluate(context) if body._request is not None else None
            except ExpressionError as e:
                return _result(name, "failed", None, f"request: {e}")
            if request in (None, ""):
                request = head["input"].get("text") or f"Run step {name} of flow {self.name}."
            args: dict[str, Any] = {"request": _as_text(request)}
            if body.input is not None:
                args["input"] = arguments
            return Planned(cid, name, body.sub_agent, args, label=label)
        # a prompt step: its instructions see the payload as this flow may read it
        shown = {**context, "payload": filter_payload(context["payload"], self.read) or {}}
        try:
            instructions = str(body._template.render(**shown))
        except Exception as e:
            return _result(name, "failed", None, f"prompt: {type(e).__name__}: {e}")
        model_input: Any = (
            arguments if body.input is not None else {"input": head["input"], "payload": shown["payload"]}
        )
        message = (
            model_input
            if isinstance(model_input, str)
            else json.dumps(model_input, indent=2, ensure_ascii=False)
        )
        return Planned(
            cid,
            name,
            PROMPT_TOOL,
            {"step": name},
            prompt=instructions,
            message=message,
            schema=body.output_schema,
            label=label,
        )

    async def _context(self, ft: FlowTx, head: dict[str, Any], ctx: _Ctx) -> dict[str, Any]:
        steps: dict[str, Any] = {}
        for name in self.steps:
            value = await ft.get(STEP + name)
            if value is not None:
                steps[name] = value
        out: dict[str, Any] = {
            "payload": await ft.get(PAYLOAD) or {},
            "input": head["input"],
            "data": ft.data,
            "steps": steps,
            "step": ctx.step,
            "flow": {"name": self.name, "seq": head["seq"], "trail": head["trail"]},
        }
        out.update(ctx.loop)
        return out


# ---------------------------------------------------------------------------------------------- helpers
def _result(name: str, status: str, output: Any, error: str | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "output": output, "error": error}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _evaluate_input(body: StepBody, context: dict[str, Any]) -> dict[str, Any]:
    mapping = body._input
    if mapping is None:
        return {}
    if isinstance(mapping, dict):
        return {
            key: copy.deepcopy(v.value) if isinstance(v, Static) else v.evaluate(context)
            for key, v in mapping.items()
        }
    value = mapping.evaluate(context)
    if body.prompt is not None and isinstance(value, str):
        return {"text": value}
    if not isinstance(value, dict):
        raise ValueError(f"the input expression should give an object, not {_kind(value)}")
    return value


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
