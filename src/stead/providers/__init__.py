"""Model providers: the protocol (`base`), the deterministic `scripted` provider, the real drivers (their
registry: `drivers`), the model catalog and the model router (the one model-string grammar).

`OpenAIProvider` and `AnthropicProvider` are imported on first use through the driver registry (their SDKs
are optional dependencies: `pip install 'stead[providers]'`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stead.providers.base import (
    BlockEnd,
    Done,
    Provider,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolSpec,
    UsageEvent,
)
from stead.providers.catalog import Route, compatible, load_catalog, make_provider, resolve
from stead.providers.drivers import DRIVERS, Driver
from stead.providers.router import ModelRouter, Selection

if TYPE_CHECKING:
    from stead.providers.anthropic import AnthropicProvider
    from stead.providers.openai import OpenAIProvider

__all__ = [
    "DRIVERS",
    "AnthropicProvider",
    "BlockEnd",
    "Done",
    "Driver",
    "ModelRouter",
    "OpenAIProvider",
    "Provider",
    "ProviderRequest",
    "ReasoningDelta",
    "Route",
    "Selection",
    "StreamEvent",
    "TextDelta",
    "ToolSpec",
    "UsageEvent",
    "compatible",
    "load_catalog",
    "make_provider",
    "resolve",
]

_CLASSES = {d.class_name: d for d in DRIVERS.values()}


def __getattr__(name: str) -> Any:
    found = _CLASSES.get(name)
    if found is None:
        raise AttributeError(f"module 'stead.providers' has no attribute {name!r}")
    value = found.load()  # a ConfigurationError naming the extra when the SDK is missing
    globals()[name] = value
    return value
