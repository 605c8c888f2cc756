"""Reading a model's answer as data: JSON (also inside a ```json fence), checked against a small JSON schema.

Structured output (an `output_schema` of a flow's prompt step, `agent.run(..., output_schema=...)`, a
definition's `output:`) is asked of the vendor natively (`ProviderRequest.output_schema`) and checked here
on return (`answer_errors`): an answer that does not fit fails the step or the run. Models wrap JSON in
fences or add a sentence around it, so the first JSON object or array in the text is taken when the whole
text is not JSON. The schema subset is what
structured outputs use in practice — `type`, `required`, `properties`, `items`, `enum`,
`additionalProperties: false` — enough to refuse a wrong shape, without a dependency.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stead.errors import InvalidInput

__all__ = [
    "OUTPUT_SCHEMA_METADATA",
    "SCHEMA_KEYS",
    "answer_errors",
    "check_output_schema",
    "parse_answer",
    "schema_errors",
    "schema_problem",
]

OUTPUT_SCHEMA_METADATA = "stead.output_schema"
"""Message metadata key carrying a run's output schema (`agent.run(..., output_schema=...)`)."""

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n(.*?)\n\s*```", re.DOTALL)
_MISSING = object()


def parse_answer(text: str) -> Any:
    """The JSON value of `text` (whole, fenced, or the first object/array in it); the text itself when
    there is none."""
    stripped = text.strip()
    for candidate in (stripped, *(m.group(1) for m in _FENCE.finditer(text))):
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    for i, ch in enumerate(stripped):
        if ch in "{[":
            try:
                value, _ = decoder.raw_decode(stripped[i:])
            except ValueError:
                continue
            return value
    return text


SCHEMA_KEYS = frozenset(
    {"type", "required", "properties", "items", "enum", "description", "title", "additionalProperties"}
)
SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_SCHEMA_DEPTH = 16


def schema_problem(schema: Any, depth: int = 0) -> tuple[list[str], str] | None:
    """The first problem of `schema` as a schema of the supported subset: (where, below the schema; what),
    or None when there is none."""
    if not isinstance(schema, dict):
        return [], "a JSON schema must be a mapping"
    if depth > MAX_SCHEMA_DEPTH:
        return [], f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
    unknown = sorted(str(k) for k in set(schema) - SCHEMA_KEYS)
    if unknown:
        supported = ", ".join(sorted(SCHEMA_KEYS))
        return [], f"unsupported schema keyword(s) {', '.join(unknown)} (supported: {supported})"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in SCHEMA_TYPES:
            return ["type"], f"unknown type {k!r}"
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        return ["required"], "required must be a list of property names"
    props = schema.get("properties")
    if props is not None and not isinstance(props, dict):
        return ["properties"], "properties must be a mapping of name to schema"
    for name, sub in (props or {}).items():
        found = schema_problem(sub, depth + 1)
        if found is not None:
            return ["properties", str(name), *found[0]], found[1]
    if "items" in schema:
        found = schema_problem(schema["items"], depth + 1)
        if found is not None:
            return ["items", *found[0]], found[1]
    if "enum" in schema and not isinstance(schema["enum"], list):
        return ["enum"], "enum must be a list of values"
    return None


MAX_SCHEMA_BYTES = 64_000


def check_output_schema(schema: Any) -> dict[str, Any]:
    """A copy of a caller's output schema, checked (`stead.InvalidInput` naming the problem)."""
    problem = schema_problem(schema)
    if problem is not None:
        where = "output_schema" + "".join(f".{p}" for p in problem[0])
        raise InvalidInput(f"{where}: {problem[1]}")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"output_schema is not JSON: {e}") from None
    if len(text) > MAX_SCHEMA_BYTES:
        raise InvalidInput(f"output_schema is larger than {MAX_SCHEMA_BYTES:,} bytes")
    copied: dict[str, Any] = json.loads(text)
    return copied


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("number", "integer") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, ()))


def schema_errors(value: Any, schema: dict[str, Any], where: str = "the answer") -> list[str]:
    """What is wrong with `value` under `schema` (empty when it fits)."""
    errors: list[str] = []
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if kinds and not any(_is(value, k) for k in kinds):
        errors.append(f"{where} should be {' or '.join(kinds)}, not {type(value).__name__}")
        return errors
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where} should be one of {json.dumps(schema['enum'])}, not {json.dumps(value)}")
    if isinstance(value, dict):
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(f"{where} is missing {name!r}")
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if name in value and isinstance(sub, dict):
                errors.extend(schema_errors(value[name], sub, f"{where}.{name}"))
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                errors.append(f"{where} has unexpected keys {', '.join(extra)}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{where}[{i}]"))
    return errors


def answer_errors(text: str, schema: dict[str, Any]) -> tuple[Any, list[str]]:
    """The answer's JSON value and what is wrong with it under `schema` (empty when it fits)."""
    value = parse_answer(text)
    if isinstance(value, str) and not text.strip().startswith('"'):
        return value, ["the answer is not JSON"]
    return value, schema_errors(value, schema)
