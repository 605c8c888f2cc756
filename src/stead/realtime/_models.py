"""Realtime model resolution: which driver serves a realtime agent's model preference.

Realtime models are not `stead.Provider`s, so they have their own small registry, but the same grammar as
every other model string:

- `text-duplex:SCRIPT.yaml`: the scripted text-duplex model, the file relative to the definition;
- `NAME:model`: a realtime model registered with `RealtimePlugin(models={NAME: factory})`;
- `openai:gpt-realtime`, `openai:gpt-realtime@ws://host:port/v1`, `gpt-realtime`: a catalog vendor (or a
  bare catalog name) whose driver kind has a realtime driver (`openai`).

Resolution walks the preference (one string or ordered candidates) first, then every realtime-capable
catalog model from the highest power down (`ModelInfo.realtime`; vendors by priority on ties), and takes
the first whose driver is installed and whose vendor has a key. A catalog model that is not realtime is
refused. When nothing fits, one `ConfigurationError` lists every candidate and why it failed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stead.extend import ConfigurationError, Route, load_catalog, parse_model
from stead.realtime._clock import Clock
from stead.realtime._duplex import TextDuplexDriver, load_duplex_script
from stead.realtime._openai import OpenAIRealtimeDriver
from stead.realtime._protocol import RealtimeModel

__all__ = ["TEXT_DUPLEX", "ModelFactory", "RealtimeChoice", "resolve_realtime"]

TEXT_DUPLEX = "text-duplex"

ModelFactory = Callable[[str], RealtimeModel]
"""A registered realtime model: called with the model part of `NAME:model`, builds one connection."""

_REALTIME_DRIVERS = {"openai": "websockets"}  # catalog driver kind -> the package its realtime driver needs


@dataclass(frozen=True)
class RealtimeChoice:
    """A resolved realtime model: its model string and how to build a connection (once per reconnect)."""

    spec: str
    make: Callable[[], RealtimeModel]


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def resolve_realtime(
    preference: str | Sequence[str] | None,
    *,
    base_dir: Path,
    clock: Clock,
    registered: Mapping[str, ModelFactory] | None = None,
    env: Mapping[str, str] | None = None,
) -> RealtimeChoice:
    env = os.environ if env is None else env
    registered = dict(registered or {})
    catalog = load_catalog(env.get("STEAD_CATALOG") or None)
    wanted = [preference] if isinstance(preference, str) else list(preference or [])
    walk = [m.name for m in catalog.by_power(realtime=True)]
    specs = [*wanted, *[w for w in walk if w not in wanted]]
    failures: list[str] = []
    for spec in specs:
        prefix, colon, rest = spec.partition(":")
        if colon and prefix in registered:
            factory = registered[prefix]
            return RealtimeChoice(spec, lambda f=factory, m=rest: f(m))  # type: ignore[misc]
        if colon and prefix == TEXT_DUPLEX:
            file = (base_dir / rest).resolve()
            if not file.is_file():
                failures.append(f"  - {spec}: text-duplex script not found ({file})")
                continue
            script = load_duplex_script(file)
            return RealtimeChoice(
                spec,
                lambda s=script, n=spec: TextDuplexDriver(s, name=n, sleep=clock.sleep),  # type: ignore[misc]
            )
        try:
            route = parse_model(spec, catalog)
        except ConfigurationError as e:
            failures.append(f"  - {spec}: {e}")
            continue
        why = _unusable(route, spec, catalog.models.get(route.model), env)
        if why is not None:
            failures.append(f"  - {spec}: {why}")
            continue
        return RealtimeChoice(spec, lambda r=route: _openai(r, env))  # type: ignore[misc]
    known = ", ".join(sorted([TEXT_DUPLEX, *registered, *(v for v in catalog.vendors)]))
    raise ConfigurationError(
        "no realtime model can be used:\n" + "\n".join(failures) + f"\n(realtime model prefixes: {known})"
    )


def _unusable(route: Route, spec: str, info: object, env: Mapping[str, str]) -> str | None:
    package = _REALTIME_DRIVERS.get(route.driver)
    if package is None:
        return f"no realtime driver for {route.driver} models"
    if (
        info is not None
        and not getattr(info, "realtime", False)
        and getattr(info, "vendor", None) == route.vendor
    ):
        return "not a realtime model (the catalog does not mark it realtime)"
    if not _installed(package):
        return f"the realtime driver needs {package!r}: pip install 'stead[realtime]'"
    if route.key_required and route.key_env and not env.get(route.key_env):
        return f"no API key for {route.vendor}: set {route.key_env}"
    return None


def _openai(route: Route, env: Mapping[str, str]) -> RealtimeModel:
    key = env.get(route.key_env) if route.key_env else None
    return OpenAIRealtimeDriver(
        route.model, api_key=key or None, base_url=route.base_url, vendor=route.vendor, prices=route.prices
    )
