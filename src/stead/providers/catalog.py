"""The model catalog: which models exist, who serves them, what they cost, and how to pick one
(docs/providers.md).

Model strings (the catalog's part of the one model-string grammar; `stead.providers.router` adds
registered providers, scripted model files and candidate lists on top):

- `openai:gpt-4.1-mini`, `anthropic:claude-sonnet-4-5`: a vendor of the catalog and a model (the model need
  not be in the catalog; its price is then unknown).
- `openai-compatible:llama3.2@http://localhost:11434/v1`: any OpenAI-compatible server; `@URL` sets (or for
  other vendors overrides) the base URL. `ollama:llama3.2` uses the catalog's Ollama vendor.
- `gpt-4.1-mini`: a bare name, looked up in the catalog.

`resolve()` walks candidates (the preference given, else every catalog model from the highest power down)
and returns the first `Route` whose vendor has its key in the environment and whose driver is installed.
Which drivers exist, what they need installed and how they are built is the driver registry's business
(`stead.providers.drivers`); the catalog only names a driver kind per vendor.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from stead.errors import ConfigurationError
from stead.messages import Usage
from stead.providers._naming import shipped_catalog_text, wire_model
from stead.providers._pricing import Prices
from stead.providers.base import Provider
from stead.providers.drivers import DRIVER_KINDS, DRIVERS, DriverKind

__all__ = [
    "DRIVER_KINDS",
    "Catalog",
    "DriverKind",
    "ModelInfo",
    "Prices",
    "Route",
    "Vendor",
    "compatible",
    "cost",
    "load_catalog",
    "make_provider",
    "model_name",
    "parse_model",
    "resolve",
    "unusable",
]

_VENDOR_FIELDS = frozenset({"driver", "priority", "key_env", "key_required", "base_url"})
_MODEL_FIELDS = frozenset({"vendor", "power", "context", "max_output", "prices", "realtime"})
_PRICE_FIELDS = frozenset({"input", "output", "cached_input"})


@dataclass(frozen=True, slots=True)
class Vendor:
    """Who serves models: the driver that speaks their protocol and where their key lives."""

    name: str
    driver: DriverKind
    priority: int = 0
    key_env: str | None = None
    key_required: bool = True
    base_url: str | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    vendor: str
    power: int = 0
    context_window: int | None = None
    prices: Prices | None = None
    realtime: bool = False
    max_output: int | None = None
    """The most output tokens one response may have (the vendor's limit); the default output cap (MR1)."""


@dataclass(frozen=True, slots=True)
class Catalog:
    vendors: Mapping[str, Vendor]
    models: Mapping[str, ModelInfo]

    def by_power(self, *, realtime: bool = False) -> list[ModelInfo]:
        """Models from the strongest down (ties: vendor priority, then name); realtime ones only if asked."""

        def key(m: ModelInfo) -> tuple[int, int, str]:
            vendor = self.vendors.get(m.vendor)
            return (-m.power, -(vendor.priority if vendor else 0), m.name)

        return sorted((m for m in self.models.values() if m.realtime == realtime), key=key)


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved model: everything needed to build its driver and account for its cost."""

    vendor: str
    driver: DriverKind
    model: str
    base_url: str | None = None
    key_env: str | None = None
    key_required: bool = True
    prices: Prices | None = None
    context_window: int | None = None
    power: int | None = None
    max_output: int | None = None

    def __str__(self) -> str:
        at = f"@{self.base_url}" if self.driver == "openai-compatible" and self.base_url else ""
        return f"{self.vendor}:{self.model}{at}"


# -- loading ------------------------------------------------------------------------------------------------


def _read_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{source}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigurationError(f"{source}: the catalog must be a mapping with 'vendors' and 'models'")
    unknown = set(data) - {"vendors", "models"}
    if unknown:
        raise ConfigurationError(
            f"{source}: unknown top-level keys {sorted(unknown)} (expected vendors, models)"
        )
    for section in ("vendors", "models"):
        entries = data.get(section)
        if entries is not None and not isinstance(entries, dict):
            raise ConfigurationError(f"{source}: '{section}' must be a mapping of name to entry")
    return cast(dict[str, Any], data)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {section: dict(base.get(section) or {}) for section in ("vendors", "models")}
    for section in ("vendors", "models"):
        target = out[section]
        for name, entry in (override.get(section) or {}).items():
            if entry is None:
                target.pop(name, None)
            elif isinstance(entry, dict) and isinstance(target.get(name), dict):
                merged = {**target[name], **entry}
                if isinstance(entry.get("prices"), dict) and isinstance(target[name].get("prices"), dict):
                    merged["prices"] = {**target[name]["prices"], **entry["prices"]}
                target[name] = merged
            else:
                target[name] = entry
    return out


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{where} must be a number, not {value!r}")
    return float(value)


def _build(data: dict[str, Any], source: str) -> Catalog:
    vendors: dict[str, Vendor] = {}
    for name, entry in (data.get("vendors") or {}).items():
        where = f"{source}: vendors.{name}"
        if not isinstance(entry, dict):
            raise ConfigurationError(f"{where} must be a mapping")
        unknown = set(entry) - _VENDOR_FIELDS
        if unknown:
            raise ConfigurationError(f"{where}: unknown fields {sorted(unknown)}")
        driver = entry.get("driver")
        if driver not in DRIVER_KINDS:
            raise ConfigurationError(
                f"{where}.driver must be one of {', '.join(DRIVER_KINDS)}, not {driver!r}"
            )
        kind = cast(DriverKind, driver)
        key_env = entry.get("key_env")
        base_url = entry.get("base_url")
        vendors[str(name)] = Vendor(
            name=str(name),
            driver=kind,
            priority=int(_number(entry.get("priority", 0), f"{where}.priority")),
            key_env=str(key_env) if key_env else None,
            key_required=bool(entry.get("key_required", kind != "openai-compatible")),
            base_url=str(base_url) if base_url else None,
        )
    models: dict[str, ModelInfo] = {}
    for name, entry in (data.get("models") or {}).items():
        where = f"{source}: models.{name}"
        if not isinstance(entry, dict):
            raise ConfigurationError(f"{where} must be a mapping")
        unknown = set(entry) - _MODEL_FIELDS
        if unknown:
            raise ConfigurationError(f"{where}: unknown fields {sorted(unknown)}")
        vendor = entry.get("vendor")
        if vendor not in vendors:
            raise ConfigurationError(f"{where}.vendor {vendor!r} is not a vendor of the catalog")
        prices: Prices | None = None
        raw_prices = entry.get("prices")
        if raw_prices is not None:
            if not isinstance(raw_prices, dict) or not {"input", "output"} <= set(raw_prices):
                raise ConfigurationError(f"{where}.prices needs input and output (USD per million tokens)")
            unknown = set(raw_prices) - _PRICE_FIELDS
            if unknown:
                raise ConfigurationError(f"{where}.prices: unknown fields {sorted(unknown)}")
            cached = raw_prices.get("cached_input")
            prices = Prices(
                input=_number(raw_prices["input"], f"{where}.prices.input"),
                output=_number(raw_prices["output"], f"{where}.prices.output"),
                cached_input=None if cached is None else _number(cached, f"{where}.prices.cached_input"),
            )
        context = entry.get("context")
        max_output = entry.get("max_output")
        models[str(name)] = ModelInfo(
            name=str(name),
            vendor=str(vendor),
            power=int(_number(entry.get("power", 0), f"{where}.power")),
            context_window=None if context is None else int(_number(context, f"{where}.context")),
            prices=prices,
            realtime=bool(entry.get("realtime", False)),
            max_output=None if max_output is None else int(_number(max_output, f"{where}.max_output")),
        )
        if max_output is not None and (models[str(name)].max_output or 0) < 1:
            raise ConfigurationError(f"{where}.max_output must be at least 1, not {max_output!r}")
    return Catalog(vendors=vendors, models=models)


@functools.cache
def _shipped() -> dict[str, Any]:
    return _read_yaml(shipped_catalog_text(), "stead/providers/catalog.yaml")


@functools.cache
def _shipped_catalog() -> Catalog:
    return _build(_merge({}, _shipped()), "stead/providers/catalog.yaml")


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """The shipped catalog, with the entries of the YAML file at `path` merged over it (by name, per field;
    an entry set to null removes it)."""
    if path is None:
        return _shipped_catalog()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read model catalog {path}: {exc}") from exc
    return _build(_merge(_shipped(), _read_yaml(text, str(path))), str(path))


# -- model strings and resolution ---------------------------------------------------------------------------


def parse_model(spec: str, catalog: Catalog | None = None) -> Route:
    """The route a model string names, without looking at keys; ConfigurationError when it names nothing."""
    catalog = catalog if catalog is not None else load_catalog()
    text = spec.strip()
    if not text:
        raise ConfigurationError("empty model name")
    prefix, colon, rest = text.partition(":")
    vendor: Vendor | None = None
    if colon and prefix in catalog.vendors:
        vendor = catalog.vendors[prefix]
        text = rest
    elif colon and prefix in DRIVER_KINDS:
        kind = DRIVERS[prefix]
        vendor = Vendor(
            name=kind.kind, driver=kind.kind, key_env=kind.key_env, key_required=kind.key_required
        )
        text = rest
    model, at, url = text.partition("@")
    model, url = model.strip(), url.strip()
    if at and not url:
        raise ConfigurationError(
            f"{spec!r}: nothing after '@' (expected a base URL such as http://host:port/v1)"
        )
    if not model:
        raise ConfigurationError(f"{spec!r}: no model name")
    info = catalog.models.get(model)
    if vendor is None:
        if info is None and colon and prefix:
            known = ", ".join(sorted({*catalog.vendors, *DRIVER_KINDS}))
            raise ConfigurationError(
                f"unknown vendor {prefix!r} in {spec!r} (known vendors: {known}); a model name that "
                "contains ':' needs its vendor first, e.g. ollama:qwen2.5:7b"
            )
        if info is None:
            raise ConfigurationError(
                f"unknown model {model!r}: not in the catalog (write vendor:model, e.g. openai:{model}, "
                f"or openai-compatible:{model}@http://host:port/v1)"
            )
        if info.vendor not in catalog.vendors:
            raise ConfigurationError(
                f"model {model!r} names vendor {info.vendor!r}, which is not in the catalog"
            )
        vendor = catalog.vendors[info.vendor]
    elif info is not None and info.vendor != vendor.name:
        info = None  # same name at another vendor: the catalog's prices are not this vendor's
    base_url = url or vendor.base_url
    if vendor.driver == "openai-compatible" and not base_url:
        raise ConfigurationError(
            f"{spec!r}: an OpenAI-compatible server needs a base URL: write "
            f"{vendor.name}:{model}@http://localhost:11434/v1"
        )
    return Route(
        vendor=vendor.name,
        driver=vendor.driver,
        model=model,
        base_url=base_url,
        key_env=vendor.key_env,
        key_required=vendor.key_required,
        prices=info.prices if info is not None else None,
        context_window=info.context_window if info is not None else None,
        power=info.power if info is not None else None,
        max_output=info.max_output if info is not None else None,
    )


def model_name(spec: str, catalog: Catalog | None = None) -> str:
    """The name to send on the wire for a model string: `openai:gpt-4.1-mini` -> `gpt-4.1-mini`,
    `ollama:llama3.2:3b@http://host/v1` -> `llama3.2:3b`; anything else is returned unchanged."""
    if catalog is None:
        return wire_model(spec)
    return wire_model(spec, {*catalog.vendors, *DRIVER_KINDS})


def unusable(route: Route, env: Mapping[str, str]) -> str | None:
    """Why a route cannot be used in this environment (its driver's package is missing, its key is not
    set), or None when it can."""
    missing = DRIVERS[route.driver].missing()
    if missing is not None:
        return missing
    if route.key_required and route.key_env and not env.get(route.key_env):
        return f"no API key for {route.vendor}: set {route.key_env}"
    return None


def resolve(
    candidates: str | Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    catalog: Catalog | None = None,
    realtime: bool = False,
) -> Route:
    """The first usable route among `candidates` (in order), or, when none are given, among every catalog
    model from the highest power down. Raises ConfigurationError listing each candidate and why it failed.

    `env` defaults to `os.environ`; its `STEAD_CATALOG` names a catalog override file when `catalog` is None.
    """
    env = os.environ if env is None else env
    if catalog is None:
        catalog = load_catalog(env.get("STEAD_CATALOG") or None)
    if isinstance(candidates, str):
        candidates = [candidates]
    explicit = bool(candidates)
    specs: list[str] = (
        list(candidates) if candidates else [m.name for m in catalog.by_power(realtime=realtime)]
    )
    failures: list[str] = []
    for spec in specs:
        try:
            route = parse_model(spec, catalog)
        except ConfigurationError as exc:
            failures.append(f"  - {spec}: {exc}")
            continue
        why = unusable(route, env)
        if why is None:
            return route
        failures.append(f"  - {spec}: {why}")
    if not specs:
        raise ConfigurationError("no model could be resolved: the catalog lists no models and none was named")
    what = "none of the models given" if explicit else "no model of the catalog"
    missing = sorted(
        {
            v.key_env
            for v in catalog.vendors.values()
            if v.key_env and v.key_required and not env.get(v.key_env)
        }
    )
    hint = ""
    if missing and not explicit:
        hint = (
            f"\nSet {' or '.join(missing)}, or name a local model such as "
            "openai-compatible:llama3.2@http://localhost:11434/v1"
        )
    raise ConfigurationError(f"{what} can be used:\n" + "\n".join(failures) + hint)


def cost(route_or_model: Route | str, usage: Usage, *, catalog: Catalog | None = None) -> float | None:
    """USD for `usage` at the catalog prices of a route or model string; None when the price is unknown."""
    if isinstance(route_or_model, Route):
        prices = route_or_model.prices
    else:
        try:
            prices = parse_model(route_or_model, catalog).prices
        except ConfigurationError:
            return None
    return prices.cost(usage) if prices is not None else None


def compatible(a: Route | None, b: Route | None) -> bool:
    """Whether a conversation can continue across a switch from `a` to `b` (else the context is reset).

    Same vendor and driver kind: the stored history (tool-call ids, Anthropic thinking signatures) is valid
    for the new model. Different vendors or kinds, or an unknown side: it is not.
    """
    if a is None or b is None:
        return False
    return a.driver == b.driver and a.vendor == b.vendor


def make_provider(
    route: Route, env: Mapping[str, str] | None = None, *, timeout: float | None = None
) -> Provider:
    """Build the driver for a route (through the driver registry): its key from `env` (default
    `os.environ`), its base URL and prices.

    The provider is bound to `route.model`, which it sends whatever `ProviderRequest.model` says.
    """
    env = os.environ if env is None else env
    api_key = env.get(route.key_env) if route.key_env else None
    return DRIVERS[route.driver].build(
        model=route.model,
        name=route.vendor,
        api_key=api_key or None,
        base_url=route.base_url,
        key_env=route.key_env,
        prices=route.prices,
        timeout=timeout,
    )
