"""The driver registry: every kind of real model driver stead can build, in one table.

A *driver kind* names a wire protocol and the class that speaks it:

| kind | class | SDK (optional dependency) | key by default |
|---|---|---|---|
| `openai` | `OpenAIProvider` | `openai` (`stead[openai]`) | `OPENAI_API_KEY`, required |
| `anthropic` | `AnthropicProvider` | `anthropic` (`stead[anthropic]`) | `ANTHROPIC_API_KEY`, required |
| `openai-compatible` | `OpenAIProvider` at a base URL | `openai` (`stead[openai]`) | none |

Everything that needs to know about drivers asks this table and nothing else: the model catalog (which
driver a vendor names, whether its package is installed, how to build it for a route), the model router,
`stead models` / `stead run --model`, and `stead.providers` (its lazily imported driver classes). Providers
registered with `stead.open(providers={...})` sit beside these kinds in the router, under their own names.

The driver modules import their SDK at module level, so they are imported here only when a driver is
built or its class is asked for (`Driver.load()`); they import nothing from this module or the catalog, so
the module graph stays acyclic.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from stead.errors import ConfigurationError
from stead.providers._pricing import Prices
from stead.providers.base import Provider

__all__ = ["DRIVERS", "DRIVER_KINDS", "Driver", "DriverKind", "driver"]

DriverKind: TypeAlias = Literal["openai", "anthropic", "openai-compatible"]


def _openai_class() -> type[Any]:
    from stead.providers.openai import OpenAIProvider

    return OpenAIProvider


def _anthropic_class() -> type[Any]:
    from stead.providers.anthropic import AnthropicProvider

    return AnthropicProvider


@dataclass(frozen=True, slots=True)
class Driver:
    """One driver kind: the SDK package it needs, its default key, and how to load its class."""

    kind: DriverKind
    package: str
    """The SDK the driver imports (installed by the `stead[<package>]` extra)."""
    class_name: str
    """The provider class (`stead.providers.<class_name>`)."""
    key_env: str | None
    """The key variable a vendor of this kind uses unless the catalog names another."""
    key_required: bool
    _load: Callable[[], type[Any]]

    @property
    def installed(self) -> bool:
        """Whether the SDK package is importable (checked without importing it)."""
        return _installed(self.package)

    def missing(self) -> str | None:
        """What to install for this driver, or None when it is installed."""
        if self.installed:
            return None
        return (
            f"the {self.kind} driver needs the '{self.package}' package: pip install 'stead[{self.package}]'"
        )

    def load(self) -> type[Any]:
        """The provider class (imports the SDK); a `ConfigurationError` naming the extra if it is missing."""
        try:
            return self._load()
        except ImportError as exc:
            raise ConfigurationError(
                f"{self.class_name} needs the '{self.package}' package: pip install 'stead[{self.package}]'"
            ) from exc

    def build(
        self,
        *,
        model: str,
        name: str,
        api_key: str | None = None,
        base_url: str | None = None,
        key_env: str | None = None,
        prices: Prices | None = None,
        timeout: float | None = None,
    ) -> Provider:
        """A provider bound to `model` (it sends that model whatever the request says) and its prices."""
        missing = self.missing()
        if missing is not None:
            raise ConfigurationError(missing)
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if self.kind == "openai":
            extra["max_tokens_field"] = "max_completion_tokens"  # OpenAI's API, also behind an @URL proxy
        cls = self.load()
        provider: Provider = cls(
            api_key=api_key or None,
            base_url=base_url,
            name=name,
            model=model,
            prices=prices,
            key_env=key_env,
            **extra,
        )
        return provider


@functools.cache
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


DRIVERS: Mapping[DriverKind, Driver] = {
    "openai": Driver("openai", "openai", "OpenAIProvider", "OPENAI_API_KEY", True, _openai_class),
    "anthropic": Driver(
        "anthropic", "anthropic", "AnthropicProvider", "ANTHROPIC_API_KEY", True, _anthropic_class
    ),
    "openai-compatible": Driver("openai-compatible", "openai", "OpenAIProvider", None, False, _openai_class),
}
"""Every driver kind, by name."""

DRIVER_KINDS: tuple[DriverKind, ...] = tuple(DRIVERS)


def driver(kind: str) -> Driver:
    """The driver of `kind`; a `ConfigurationError` listing the kinds when there is none."""
    found = DRIVERS.get(kind)  # type: ignore[call-overload]
    if found is None:
        raise ConfigurationError(f"unknown driver kind {kind!r}; driver kinds: {', '.join(DRIVER_KINDS)}")
    return found  # type: ignore[no-any-return]
