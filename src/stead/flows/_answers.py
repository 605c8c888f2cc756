"""Reading a model's answer as data: JSON (also inside a ```json fence), checked against a small JSON schema.

Prompt steps ask for structured output. Models wrap JSON in fences or add a sentence around it, so the first
JSON object or array in the text is taken when the whole text is not JSON. The schema subset is what
structured outputs use in practice — `type`, `required`, `properties`, `items`, `enum`,
`additionalProperties: false` — enough to refuse a wrong shape, without a dependency.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["parse_answer", "schema_errors"]

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
