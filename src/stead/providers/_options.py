"""Model options and structured output on the wire: one vendor-neutral shape (`ModelOptions`, an output
schema), mapped to each vendor's names here, checked when a definition loads (`check_model_options`,
`unsupported_options`).

Option → OpenAI / OpenAI-compatible field; Anthropic field ("—": refused for that vendor):

- `tool_choice` → `tool_choice` (`auto`, `required`, `none`, `{type: function, function: {name}}`);
  `tool_choice` (`{type: auto}`, `{type: any}`, `{type: none}`, `{type: tool, name}`)
- `temperature`, `top_p` → the same names on both
- `top_k` → `top_k` (OpenAI-compatible servers only; refused for api.openai.com); `top_k`
- `max_tokens` → the agent's output cap (`max_output_tokens`, MR1), which every request carries:
  `max_completion_tokens` (api.openai.com) or `max_tokens` (a server at a `base_url`); `max_tokens`
- `seed` → `seed`; —
- `stop` → `stop`; `stop_sequences`
- `presence_penalty`, `frequency_penalty` → the same names; —

Structured output: OpenAI and compatible servers get `response_format: {type: json_schema, json_schema:
{name, schema, strict}}` (`strict: true` when the schema meets OpenAI's strict rules — every object closed
with `additionalProperties: false` and all its properties required —, else `false`, which OpenAI would
otherwise refuse); Anthropic gets a synthetic tool whose `input_schema` is the schema (an object schema;
any other is wrapped as `{value: schema}`) and a `tool_choice` forcing it, and its call's input becomes the
answer's text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from typing import Any

from stead.providers.base import NO_OPTIONS, TOOL_CHOICES, ModelOptions, ProviderRequest

__all__ = [
    "OPTION_NAMES",
    "SUPPORTED",
    "OptionError",
    "anthropic_options",
    "anthropic_output_tool",
    "check_model_options",
    "is_strict_schema",
    "openai_options",
    "openai_response_format",
    "unsupported_options",
]

OPTION_NAMES: tuple[str, ...] = tuple(ModelOptions.__dataclass_fields__)

SUPPORTED: dict[str, frozenset[str]] = {
    "openai": frozenset(OPTION_NAMES) - {"top_k"},
    "openai-compatible": frozenset(OPTION_NAMES),
    "anthropic": frozenset({"tool_choice", "temperature", "top_p", "top_k", "max_tokens", "stop"}),
}
"""Driver kind → the options its vendor takes (others are refused when the definition loads)."""

_NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
MAX_STOP = 16
MAX_STOP_CHARS = 256


class OptionError(ValueError):
    """A refused model option; `key` is the option (None: the whole mapping)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def check_model_options(raw: Any, *, tools: Collection[str] | None = None) -> ModelOptions:
    """The checked options of a `model_options:` mapping; an `OptionError` naming the key otherwise.
    `tools`: the agent's tool names, which a named `tool_choice` must be one of (None: not checked)."""
    if raw is None:
        return NO_OPTIONS
    if not isinstance(raw, dict):
        raise OptionError(f"model_options must be a mapping, not {type(raw).__name__}")
    for k in raw:
        if k not in OPTION_NAMES:
            raise OptionError(f"model_options.{k}: unknown option (known: {', '.join(OPTION_NAMES)})", str(k))
    return _checked(raw, tools)


def _checked(raw: dict[str, Any], tools: Collection[str] | None) -> ModelOptions:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        where = f"model_options.{key}"
        if key == "tool_choice":
            if not isinstance(value, str) or not value.strip():
                raise OptionError(f"{where} must be auto, required, none or a tool name, not {value!r}", key)
            if value not in TOOL_CHOICES and tools is not None and value not in tools:
                known = ", ".join(sorted(tools)) or "none"
                raise OptionError(
                    f"{where}: {value!r} is not auto, required, none or one of the agent's tools ({known})",
                    key,
                )
            out[key] = value
        elif key in _NUMBER_RANGES:
            low, high = _NUMBER_RANGES[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise OptionError(f"{where} must be a number, not {value!r}", key)
            if not low <= value <= high:
                raise OptionError(f"{where} must be between {low:g} and {high:g}, not {value!r}", key)
            out[key] = float(value)
        elif key in ("top_k", "max_tokens", "seed"):
            least = 0 if key == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(f"{where} must be an integer of at least {least}, not {value!r}", key)
            out[key] = value
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if (
                not isinstance(stops, list)
                or not stops
                or len(stops) > MAX_STOP
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
            ):
                raise OptionError(
                    f"{where} must be a string or a list of 1-{MAX_STOP} non-empty strings "
                    f"(at most {MAX_STOP_CHARS} characters each)",
                    key,
                )
            out[key] = tuple(stops)
    return ModelOptions(**out)


def unsupported_options(kind: str, options: ModelOptions) -> list[str]:
    """The options set in `options` that a vendor of driver kind `kind` does not take (none for a kind
    this module does not know: a registered provider decides itself)."""
    supported = SUPPORTED.get(kind)
    if supported is None:
        return []
    return [name for name in options.items() if name not in supported]


def _refuse(vendor: str, options: ModelOptions) -> None:
    bad = unsupported_options(vendor, options)
    if bad:
        raise ValueError(f"{vendor} does not support the model option(s) {', '.join(bad)}")


def openai_options(request: ProviderRequest, *, compatible: bool) -> dict[str, Any]:
    """The Chat Completions fields of the request's options (a `ValueError` for one OpenAI lacks)."""
    options = request.model_options
    if options is NO_OPTIONS:
        return {}
    _refuse("openai-compatible" if compatible else "openai", options)
    out: dict[str, Any] = {}
    for name, value in options.items().items():
        if name == "tool_choice":
            if not request.tools:
                continue  # no tools offered (a flow's prompt step): there is nothing to choose
            out[name] = value if value in TOOL_CHOICES else {"type": "function", "function": {"name": value}}
        elif name == "max_tokens":
            continue  # the agent's output cap (`max_output_tokens`), sent as the request's cap (MR1)
        else:
            out[name] = value
    return out


def openai_response_format(request: ProviderRequest) -> dict[str, Any] | None:
    """`response_format` for the request's output schema (None without one)."""
    schema = request.output_schema
    if schema is None:
        return None
    return {
        "type": "json_schema",
        "json_schema": {"name": request.output_name, "schema": schema, "strict": is_strict_schema(schema)},
    }


def is_strict_schema(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts `schema`: every object lists all its properties as required
    and is closed (`additionalProperties: false`), recursively."""
    if not isinstance(schema, dict):
        return False
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "object" in kinds:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if sorted(schema.get("required") or []) != sorted(props):
            return False
        if not all(is_strict_schema(sub) for sub in props.values()):
            return False
    if "array" in kinds and isinstance(schema.get("items"), dict):
        return is_strict_schema(schema["items"])
    return True


def anthropic_options(request: ProviderRequest, *, forced: str | None) -> dict[str, Any]:
    """The Messages fields of the request's options; `forced`: the synthetic output tool's name when
    the request has an output schema."""
    options = request.model_options
    _refuse("anthropic", options)
    out: dict[str, Any] = {}
    for name, value in options.items().items():
        if name == "stop":
            out["stop_sequences"] = value
        elif name == "max_tokens":
            continue  # the agent's output cap (`max_output_tokens`), sent as the request's cap (MR1)
        elif name != "tool_choice":
            out[name] = value
    choice = options.tool_choice
    if forced is not None:
        # the answer must come as the output tool's call: forced when it is the only tool (or no tool may
        # be called otherwise), else any tool (a real one first, the output tool to answer)
        alone = not request.tools or choice == "none"
        out["tool_choice"] = {"type": "tool", "name": forced} if alone else {"type": "any"}
    elif choice is not None and request.tools:
        out["tool_choice"] = {
            "auto": {"type": "auto"},
            "required": {"type": "any"},
            "none": {"type": "none"},
        }.get(choice, {"type": "tool", "name": choice})
    return out


def anthropic_output_tool(request: ProviderRequest, taken: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """The synthetic tool carrying the answer (named after the schema, never a name in `taken`) and
    whether the schema was wrapped as `{value: schema}` (Anthropic takes object input schemas only)."""
    schema = request.output_schema or {}
    name = request.output_name
    while name in taken:
        name += "_answer"
    wrapped = schema.get("type") != "object"
    input_schema = (
        {"type": "object", "properties": {"value": schema}, "required": ["value"]} if wrapped else schema
    )
    spec = {
        "name": name,
        "description": "Give your final answer: call this tool with the answer as its input.",
        "input_schema": input_schema,
    }
    return spec, wrapped


def output_text(arguments: Any, wrapped: bool) -> str:
    """The answer's text (JSON) from the output tool's input."""
    value = arguments.get("value") if wrapped and isinstance(arguments, dict) else arguments
    return json.dumps(value, ensure_ascii=False)
