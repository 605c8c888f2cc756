"""`@stead.tool`: turn an async (or sync) function into a tool the model can call.

The JSON schema comes from the type hints (through pydantic) and the description from the docstring.
Arguments are validated by pydantic before the function runs; validation errors, unknown tools and
exceptions become error results the model sees (T6) — exceptions of any kind, `BaseException`s such as
`SystemExit` or a `CancelledError` the tool raised itself included: the call never runs again (T8). See
`stead.core.batch`.

Flags (T5):
- default: the call runs at most once, ever. If the process dies while it runs, the call is *in doubt*: it
  gets an error result saying it was interrupted and not retried — unless the tool has a `reconcile` hook
  that decides from durable evidence (e.g. its call-bound KV) what happened.
- `durable=True`: an unfinished call may run again after a crash, with the same call id.
- `transactional=True`: the function runs inside the transaction that commits its result; its writes
  through `ctx.tx` / `ctx.kv` commit together with the result or not at all. Slow work the body needs
  (an embedding model, a remote look-up) goes in a `@t.prepare` step, which runs before that transaction
  opens — a transaction never waits on I/O — and hands its value to the body as `ctx.prepared`.

`max_result_chars=N`: a result longer than N characters is cut in the conversation (with a marker saying
how much was cut); the run record's tool step keeps the full output. Default: the agent's
`max_tool_result_chars` (100,000).

What a tool touches (read by the policy layer, `stead.policy`, and by memory for taint):
- `effects="read"` (reads only), `"write"` (changes the agent's own workspace), `"external"` (reaches the
  outside world). A tool that declares nothing counts as `"external"`: fail closed.
- `destructive=True`: the effect cannot be undone (deleting, overwriting, paying).
- `approval="policy"` (the permission mode's table decides), `"always"` (ask a human in every mode that
  allows the call at all), `"never"` (never ask: run wherever the mode allows it), or a callable
  `approval(arguments) -> bool` (True: ask; False: do not). A callable that raises, or arguments that do
  not validate, mean "ask" (fail closed).
The kernel does not interpret these; without a policy plugin every tool runs as before.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, get_type_hints, overload

import pydantic

from stead.errors import ConfigurationError, InvalidInput
from stead.messages import dumps
from stead.tools.context import ToolContext

__all__ = [
    "EFFECTS",
    "IN_DOUBT",
    "RUN_AGAIN",
    "ApprovalRule",
    "Reconciliation",
    "Tool",
    "ToolArgumentError",
    "tool",
]

EFFECTS = ("read", "write", "external")
"""What a tool may touch, from least to most (`Tool.effects`)."""
APPROVAL_MODES = ("policy", "always", "never")
ApprovalRule: TypeAlias = str | Callable[[dict[str, Any]], bool]
"""`Tool.approval`: "policy", "always", "never", or a callable of the validated arguments (True: ask)."""

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Reconciliation:
    """A decision returned by a tool's `reconcile` hook (besides a plain result value)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"stead.{self.name}"


IN_DOUBT: Final = Reconciliation("IN_DOUBT")
"""Nothing is known: record the interrupted-and-not-retried error result."""
RUN_AGAIN: Final = Reconciliation("RUN_AGAIN")
"""The effect certainly did not happen: run the call again with the same id."""

ReconcileFn: TypeAlias = Callable[[ToolContext], Awaitable[Any]]
PrepareFn: TypeAlias = Callable[[ToolContext, dict[str, Any]], Awaitable[Any]]


class ToolArgumentError(InvalidInput):
    """The model's arguments do not fit the tool's schema."""


@dataclass
class Tool:
    """A tool: a function with a name, a description, a JSON schema and flags."""

    name: str
    description: str
    fn: Callable[..., Any]
    parameters: dict[str, Any]
    durable: bool = False
    transactional: bool = False
    reconcile_fn: ReconcileFn | None = None
    prepare_fn: PrepareFn | None = None
    max_result_chars: int | None = None
    effects: str = "external"
    """`read`, `write` or `external` (the default: a tool that declares nothing fails closed)."""
    destructive: bool = False
    """The effect cannot be undone."""
    approval: ApprovalRule = "policy"
    """When a human must approve a call (see the module docstring)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form facts for higher layers (e.g. `stead.step_type`: how run records type its steps)."""
    _model: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    _ctx_param: str | None = field(default=None, repr=False)
    _is_async: bool = field(default=True, repr=False)

    def reconcile(self, fn: ReconcileFn) -> ReconcileFn:
        """Decorator: register `async def reconcile(ctx) -> result | stead.RUN_AGAIN | stead.IN_DOUBT`,
        consulted when the call was interrupted by a crash."""
        self.reconcile_fn = fn
        return fn

    def prepare(self, fn: PrepareFn) -> PrepareFn:
        """Decorator for a `transactional` tool: register `async def prepare(ctx, arguments) -> value`, run
        with the validated arguments before the transaction that runs the body opens (outside every
        transaction: the place for slow I/O such as computing an embedding). The body reads the value as
        `ctx.prepared`. It may run again for the same call after a crash, so it must have no effect of its
        own; if it raises, the call's result is that error and the body does not run."""
        if not self.transactional:
            raise ConfigurationError(f"tool {self.name!r}: prepare is for transactional tools")
        self.prepare_fn = fn
        return fn

    def validate(self, arguments: dict[str, Any] | str) -> dict[str, Any]:
        """Parse and validate the model's arguments; raise `ToolArgumentError` naming the problem."""
        if isinstance(arguments, str):
            text = arguments.strip()
            if not text:
                arguments = {}
            else:
                try:
                    arguments = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ToolArgumentError(
                        f"arguments are not valid JSON: {e.msg} at position {e.pos}"
                    ) from None
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments must be a JSON object, not {type(arguments).__name__}")
        if self._model is None:
            return dict(arguments)
        try:
            parsed = self._model.model_validate(arguments)
        except pydantic.ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors()
            )
            raise ToolArgumentError(f"arguments do not match the schema of {self.name}: {problems}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    async def call(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        """Run the function with validated arguments."""
        kwargs = dict(arguments)
        if self._ctx_param is not None:
            kwargs[self._ctx_param] = ctx
        if self._is_async:
            return await self.fn(**kwargs)
        return self.fn(**kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A tool stays callable as the plain function."""
        return self.fn(*args, **kwargs)


def render_output(value: Any) -> str:
    """What the model sees of a tool's return value."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return dumps(value)
    except (TypeError, ValueError, RecursionError):  # RecursionError: a value containing itself
        return str(value)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    durable: bool = False,
    transactional: bool = False,
    max_result_chars: int | None = None,
    effects: str = "external",
    destructive: bool = False,
    approval: ApprovalRule = "policy",
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    durable: bool = False,
    transactional: bool = False,
    max_result_chars: int | None = None,
    effects: str = "external",
    destructive: bool = False,
    approval: ApprovalRule = "policy",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a tool from a function: `@stead.tool` or `@stead.tool(durable=True, effects="read")`.

    A parameter annotated `stead.ToolContext` receives the call's context (call id, call-bound KV, ...).
    `effects`, `destructive` and `approval` say what the tool touches and when a human must approve a call
    (see the module docstring); a tool that declares nothing counts as `effects="external"`."""

    def build(f: Callable[..., Any]) -> Tool:
        t = _build(f, name=name, description=description, durable=durable, transactional=transactional)
        if max_result_chars is not None:
            if isinstance(max_result_chars, bool) or max_result_chars < 1:
                raise ConfigurationError(f"tool {t.name!r}: max_result_chars must be a positive integer")
            t.max_result_chars = max_result_chars
        check_declaration(t.name, effects, destructive, approval)
        t.effects, t.destructive, t.approval = effects, destructive, approval
        return t

    if fn is not None:
        return build(fn)
    return build


def check_declaration(name: str, effects: str, destructive: bool, approval: ApprovalRule) -> None:
    """Refuse a declaration the policy could not read (when the tool is defined, not when it is called)."""
    if effects not in EFFECTS:
        raise ConfigurationError(
            f"tool {name!r}: effects must be one of {', '.join(EFFECTS)}, not {effects!r}"
        )
    if not isinstance(destructive, bool):
        raise ConfigurationError(f"tool {name!r}: destructive must be True or False")
    if not callable(approval) and approval not in APPROVAL_MODES:
        raise ConfigurationError(
            f"tool {name!r}: approval must be one of {', '.join(APPROVAL_MODES)} or a callable, "
            f"not {approval!r}"
        )


def _build(
    fn: Callable[..., Any], *, name: str | None, description: str | None, durable: bool, transactional: bool
) -> Tool:
    tool_name = name or fn.__name__
    if not _NAME.match(tool_name):
        raise ConfigurationError(f"tool name {tool_name!r} must match [a-zA-Z0-9_-]{{1,64}}")
    if durable and transactional:
        raise ConfigurationError(f"tool {tool_name!r}: choose durable or transactional, not both")
    doc = inspect.getdoc(fn) or ""
    summary, arg_docs = _parse_doc(doc)
    try:
        hints = get_type_hints(fn)
    except Exception as e:
        raise ConfigurationError(f"tool {tool_name!r}: cannot read type hints: {e}") from e
    fields: dict[str, Any] = {}
    ctx_param: str | None = None
    for pname, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(pname, Any)
        if annotation is ToolContext:
            ctx_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {tool_name!r}: *args/**kwargs parameters are not supported")
        default = param.default if param.default is not param.empty else ...
        fields[pname] = (annotation, pydantic.Field(default, description=arg_docs.get(pname)))
    try:
        model, schema = _schema(tool_name, fields)
    except Exception as e:
        raise ConfigurationError(_schema_problem(tool_name, fields, e)) from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return Tool(
        name=tool_name,
        description=description or summary or tool_name,
        fn=fn,
        parameters=schema,
        durable=durable,
        transactional=transactional,
        _model=model,
        _ctx_param=ctx_param,
        _is_async=inspect.iscoroutinefunction(fn),
    )


def _schema(tool_name: str, fields: dict[str, Any]) -> tuple[type[pydantic.BaseModel], dict[str, Any]]:
    model = pydantic.create_model(f"{tool_name}_arguments", **fields)
    return model, model.model_json_schema()


def _type_name(annotation: Any) -> str:
    name = getattr(annotation, "__qualname__", None)
    if isinstance(name, str) and not getattr(annotation, "__args__", None):
        return name
    return repr(annotation)


def _schema_problem(tool_name: str, fields: dict[str, Any], error: Exception) -> str:
    """Which parameter's type cannot become a JSON schema (found by trying them one at a time), in one
    line — instead of pydantic's page-long explanation, when the tool is defined (so at load time)."""
    for pname, spec in fields.items():
        try:
            _schema(tool_name, {pname: spec})
        except Exception:
            return (
                f"tool {tool_name!r}: parameter {pname!r} has type {_type_name(spec[0])}, which cannot be "
                "turned into a JSON schema for the model; use str, int, float, bool, lists, dicts, a "
                "pydantic model, a dataclass or a TypedDict"
            )
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"tool {tool_name!r}: its parameters cannot be turned into a JSON schema: {first}"


_SECTION = re.compile(r"^(Args|Arguments|Parameters):\s*$", re.MULTILINE)


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and Google-style per-argument descriptions."""
    match = _SECTION.search(doc)
    if not match:
        return doc.strip(), {}
    summary = doc[: match.start()].strip()
    args: dict[str, str] = {}
    current: str | None = None
    for line in doc[match.end() :].splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if m and (current is None or len(line) - len(line.lstrip()) <= 4):
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current is not None and line.startswith((" ", "\t")):
            args[current] = (args[current] + " " + line.strip()).strip()
        else:
            break
    return summary, args
