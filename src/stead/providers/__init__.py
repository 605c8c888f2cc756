"""Model providers: the protocol (`base`), the deterministic `scripted` provider, the real drivers and the
model catalog.

`OpenAIProvider` and `AnthropicProvider` are imported on first use (their SDKs are optional dependencies:
`pip install 'stead[providers]'`)."""

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

if TYPE_CHECKING:
    from stead.providers.anthropic import AnthropicProvider
    from stead.providers.openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "BlockEnd",
    "Done",
    "OpenAIProvider",
    "Provider",
    "ProviderRequest",
    "ReasoningDelta",
    "Route",
    "StreamEvent",
    "TextDelta",
    "ToolSpec",
    "UsageEvent",
    "compatible",
    "load_catalog",
    "make_provider",
    "resolve",
]

_LAZY = {"OpenAIProvider": "stead.providers.openai", "AnthropicProvider": "stead.providers.anthropic"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stead.providers' has no attribute {name!r}")
    import importlib

    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as e:
        from stead.errors import ConfigurationError

        package = "openai" if name == "OpenAIProvider" else "anthropic"
        raise ConfigurationError(
            f"{name} needs the '{package}' package: pip install 'stead[{package}]'"
        ) from e
    globals()[name] = value
    return value
