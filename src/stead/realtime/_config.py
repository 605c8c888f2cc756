"""Layered settings of a realtime agent: definition < target agent < runtime override.

Each layer is a mapping of `RealtimeSettings` fields (a definition's `realtime:` section, as written; the
realtime definition's `model` is its first layer's model). Layers merge key by key: objects merge
recursively, lists and plain values replace. The merged result is validated once; a target agent's layer that
does not validate on its own is ignored (logged), a malformed runtime override is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from stead.definitions import AgentDefinition, RealtimeSettings
from stead.extend import InvalidInput

__all__ = ["deep_merge", "effective_settings"]

log = logging.getLogger("stead.realtime")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: nested mappings merge, everything else (lists included) replaces."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(old, value)
        else:
            out[key] = value
    return out


def _layer(settings: RealtimeSettings | None) -> dict[str, Any]:
    return {} if settings is None else settings.model_dump(exclude_unset=True)


def effective_settings(
    definition: AgentDefinition,
    targets: Sequence[AgentDefinition],
    overrides: Mapping[str, Any] | None = None,
) -> RealtimeSettings:
    merged: dict[str, Any] = {"model": definition.model, **_layer(definition.realtime)}
    for target in targets:
        merged = deep_merge(merged, _layer(target.realtime))
    if overrides:
        try:
            RealtimeSettings.model_validate(overrides)
        except pydantic.ValidationError as e:
            raise InvalidInput(f"realtime overrides: {_problems(e)}") from None
        merged = deep_merge(merged, dict(overrides))
    try:
        return RealtimeSettings.model_validate(merged)
    except pydantic.ValidationError as e:  # pragma: no cover - each layer validated on its own
        raise InvalidInput(f"realtime settings: {_problems(e)}") from None


def _problems(e: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors()
    )
