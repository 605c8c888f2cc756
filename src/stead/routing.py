"""Model routing: which provider serves an agent's effective settings (DESIGN §6).

Two kinds of provider names live in an agent's settings:
- a name registered with `stead.open(providers={...})` (e.g. `"scripted"`): that object serves it;
- `"catalog"`: the model string (or ordered list of candidates) is resolved through the model catalog —
  explicit candidates first, the first whose vendor has a key and a driver wins — and the driver is built
  once per route (`stead.providers.catalog`).

A model string whose prefix names a registered provider (`scripted:demo`) selects that provider.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from stead.errors import ConfigurationError
from stead.providers.base import Provider

__all__ = ["CATALOG", "ModelRouter"]

CATALOG = "catalog"


class ModelRouter:
    """Resolves settings to providers; decides whether a settings change keeps the conversation (K2)."""

    def __init__(self, providers: Mapping[str, Provider], env: Mapping[str, str] | None = None) -> None:
        self.providers = dict(providers)
        self._env = env
        self._built: dict[Any, Provider] = {}  # by Route: routes differing only in base URL differ

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def provider_name(self, provider: str | None, model: str | Sequence[str] | None) -> str:
        """The provider name to store for a create/send that gave `provider` and/or `model`."""
        if provider is not None:
            return provider
        first = model if isinstance(model, str) else (model[0] if model else None)
        if first is not None and ":" in first:
            prefix = first.split(":", 1)[0]
            if prefix in self.providers:
                return prefix
        if first is None and len(self.providers) == 1:
            return next(iter(self.providers))
        if first is None:
            raise ConfigurationError(
                "no model given: pass model= (e.g. 'openai:gpt-4.1-mini') or provider= naming a registered "
                f"provider ({', '.join(sorted(self.providers)) or 'none registered'})"
            )
        return CATALOG

    def check(self, provider: str, model: Any) -> None:
        """Raise a `ConfigurationError` naming what to set when `provider`/`model` cannot be served now."""
        if provider in self.providers:
            return
        if provider != CATALOG:
            known = ", ".join(sorted([*self.providers, CATALOG]))
            raise ConfigurationError(f"unknown provider {provider!r}; registered providers: {known}")
        self._route(model)

    def _route(self, model: Any) -> Any:
        from stead.providers.catalog import resolve

        if model is None or (not isinstance(model, str) and not _is_str_list(model)):
            raise ConfigurationError(f"model must be a model string or a list of them, not {model!r}")
        return resolve(model, self.env)

    def provider_for(self, settings: Mapping[str, Any]) -> Provider | None:
        """The provider serving `settings`, or None when none can (unregistered name, no usable route)."""
        name = settings.get("provider")
        if isinstance(name, str) and name in self.providers:
            return self.providers[name]
        if name != CATALOG:
            return None
        try:
            route = self._route(settings.get("model"))
        except ConfigurationError:
            return None
        provider = self._built.get(route)
        if provider is None:
            from stead.providers.catalog import make_provider

            provider = self._built[route] = make_provider(route, self.env)
        return provider

    async def aclose(self) -> None:
        """Close the HTTP clients of the drivers built for catalog routes."""
        built, self._built = list(self._built.values()), {}
        for provider in built:
            close = getattr(provider, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # closing is best effort
                    pass

    def compatible(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """K2: keep the conversation across a settings change? Same registered provider (and profile), or
        catalog routes of the same vendor and driver; anything unknown counts as incompatible."""
        if old.get("profile") != new.get("profile"):
            return False
        if old.get("provider") != new.get("provider"):
            return False
        if old.get("provider") != CATALOG:
            return True
        from stead.providers.catalog import compatible

        def route(settings: Mapping[str, Any]) -> Any:
            try:
                return self._route(settings.get("model"))
            except ConfigurationError:
                return None  # an unknown old route never blocks the switch: it resets

        return compatible(route(old), route(new))

    def infer_provider(self, model: str | Sequence[str], current: str) -> str:
        """The provider a per-message model switch implies: a prefix naming a registered provider selects
        it; a catalog vendor or driver prefix selects the catalog; otherwise the provider stays."""
        first = model if isinstance(model, str) else (model[0] if model else "")
        prefix = first.split(":", 1)[0] if ":" in first else None
        if prefix is not None and prefix in self.providers:
            return prefix
        if prefix is not None:
            from stead.providers.catalog import DRIVER_KINDS, load_catalog

            if (
                prefix in DRIVER_KINDS
                or prefix in load_catalog(self.env.get("STEAD_CATALOG") or None).vendors
            ):
                return CATALOG
        return current


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
