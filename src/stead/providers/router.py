"""The model router: one grammar for every model string, and the provider that serves an agent's settings.

Every place that takes a model string — `system.create(model=...)`, `agent.send(model=...)`, a definition's
`model:` and `stead run --model` — goes through `ModelRouter.resolve`, which understands:

- `mine:any`: the provider registered as `mine` (`stead.open(providers={"mine": ...})`); stored as
  provider `mine`, model `any`.
- `openai:gpt-4.1-mini`, `ollama:llama3.2`: a vendor of the model catalog; `openai-compatible:MODEL@URL`,
  `anthropic:MODEL@URL`: a driver kind (at that endpoint); `gpt-4.1-mini`: a bare catalog name (the
  catalog says its vendor). Stored as provider `catalog`, model the string.
- `scripted:FILE.yaml`: a scripted model file, relative to `base_dir` (the definition's directory for a
  definition, else the working directory). Stored as provider `scripted-file`, model
  `scripted:/absolute/FILE.yaml`.
- `[a, b, ...]`: ordered candidates; the first that can be used now is stored.

A prefix naming a registered provider wins over everything else. When a provider is already in use (a
per-message switch on an agent served by a registered provider), a bare name or an unknown prefix is a
model name *for that provider* (`qwen2.5:7b` for a registered local server).

What is stored lets any process find the same provider again, without the registration that created the
agent where possible: catalog strings are resolved through the catalog, and a scripted model file is named
by its absolute path and loaded lazily (once per router); only a registered provider must be registered
again. Candidate lists are resolved when they are given, so an agent keeps the model it was created with
across restarts. Unknown names raise one `ConfigurationError` listing what is known: the registered
providers, the catalog vendors and the driver kinds.

`create()` without a model uses the one registered provider when there is exactly one; with none it uses
the catalog's default — the strongest catalog model usable now, the one `stead models` names.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

from stead.errors import ConfigurationError
from stead.providers.base import Provider
from stead.providers.catalog import (
    Catalog,
    Route,
    compatible,
    load_catalog,
    make_provider,
    model_name,
    parse_model,
    resolve,
    unusable,
)
from stead.providers.drivers import DRIVER_KINDS
from stead.providers.scripted_file import load_scripted_model

__all__ = [
    "CATALOG",
    "NO_KEY",
    "SCRIPTED",
    "SCRIPTED_FILE",
    "ModelRouter",
    "ModelSpec",
    "Selection",
    "known_names",
    "parse_spec",
]

CATALOG = "catalog"
"""The provider name stored for models served through the catalog."""
SCRIPTED_FILE = "scripted-file"
"""The provider name stored for scripted model files (named by absolute path in the model)."""
SCRIPTED = "scripted"
"""The prefix of scripted model files: `scripted:FILE.yaml`."""

NO_KEY = "stead-no-key"
"""What a driver gets in place of a vendor's key when its model string names another base URL."""

SpecKind: TypeAlias = Literal["registered", "catalog", "scripted"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model string, parsed (nothing checked about keys, packages or files)."""

    kind: SpecKind
    provider: str
    """The provider name to store: a registered name, `catalog` or `scripted-file`."""
    model: str
    """The model to store: the model for a registered provider, the catalog string, or `scripted:/path`."""
    route: Route | None = None
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    """What `create` stores for a model string or list: the provider name and the model, and which of
    the candidates was chosen (0 for a single string)."""

    provider: str
    model: str
    kind: SpecKind
    index: int = 0

    def settings(self) -> dict[str, str]:
        return {"provider": self.provider, "model": self.model}


def known_names(registered: Collection[str], catalog: Catalog) -> str:
    """What a model string may name, for error messages."""
    return (
        f"registered providers: {', '.join(sorted(registered)) or 'none'}; "
        f"catalog vendors: {', '.join(sorted(catalog.vendors)) or 'none'}; "
        f"driver kinds: {', '.join(DRIVER_KINDS)}; "
        f"or {SCRIPTED}:FILE.yaml for a scripted model file"
    )


def is_scripted_provider(name: object) -> bool:
    """Whether a stored provider name is a scripted model file's (`scripted-file`, or a definition's
    `scripted/<name>`), which the router can serve from the file named in the model."""
    return isinstance(name, str) and (name == SCRIPTED_FILE or name.startswith(SCRIPTED + "/"))


def scripted_path(model: object) -> Path | None:
    """The absolute path of a stored `scripted:/path` model, or None."""
    if not isinstance(model, str) or not model.startswith(SCRIPTED + ":"):
        return None
    path = Path(model[len(SCRIPTED) + 1 :])
    return path if path.is_absolute() else None


def parse_spec(
    spec: str,
    *,
    registered: Collection[str] = (),
    catalog: Catalog | None = None,
    base_dir: Path | None = None,
    within: str | None = None,
) -> ModelSpec:
    """Parse one model string of the grammar (see the module docstring); a `ConfigurationError` that lists
    what is known when it names nothing. Nothing is checked about keys, packages or files.

    `registered`: the names of the registered providers; `catalog`: default the shipped one (the router
    passes the one `STEAD_CATALOG` names); `base_dir`: where a relative `scripted:FILE` is, default the
    working directory; `within`: a registered provider already serving the agent, which takes bare names
    and unknown prefixes as its own model names."""
    if not isinstance(spec, str):
        raise ConfigurationError(f"a model must be a model string, not {spec!r}")
    catalog = catalog if catalog is not None else load_catalog()
    text = spec.strip()
    if not text:
        raise ConfigurationError("empty model name")
    prefix, colon, rest = text.partition(":")
    rest = rest.strip()
    if colon and prefix in registered:
        if not rest:
            raise ConfigurationError(f"{spec!r}: no model name after '{prefix}:'")
        return ModelSpec("registered", prefix, rest)
    if colon and prefix == SCRIPTED:
        if not rest:
            raise ConfigurationError(f"{spec!r}: no file after 'scripted:' (write scripted:FILE.yaml)")
        path = Path(rest).expanduser()
        if not path.is_absolute():
            path = (base_dir if base_dir is not None else Path.cwd()) / path
        path = path.resolve()
        return ModelSpec("scripted", SCRIPTED_FILE, f"{SCRIPTED}:{path}", path=path)
    catalog_prefix = bool(colon) and (prefix in catalog.vendors or prefix in DRIVER_KINDS)
    if within is not None and not catalog_prefix:
        return ModelSpec("registered", within, text)
    if colon and not catalog_prefix and text.partition("@")[0].strip() not in catalog.models:
        raise ConfigurationError(
            f"unknown provider {prefix!r} in {spec!r}; known: {known_names(registered, catalog)}"
        )
    try:
        route = parse_model(text, catalog)
    except ConfigurationError as exc:
        if not colon and text.partition("@")[0].strip() not in catalog.models:
            name = text.partition("@")[0].strip()
            raise ConfigurationError(
                f"unknown model {name!r}: not a model of the catalog (see `stead models`); name it as "
                f"provider:model, e.g. openai:{name} or openai-compatible:{name}@http://host:port/v1 "
                f"({known_names(registered, catalog)})"
            ) from None
        raise exc from None
    return ModelSpec("catalog", CATALOG, text, route=route)


class ModelRouter:
    """Resolves model strings to what an agent stores, and stored settings to the provider serving them;
    decides whether a settings change keeps the conversation (K2)."""

    def __init__(self, providers: Mapping[str, Provider], env: Mapping[str, str] | None = None) -> None:
        self.providers = dict(providers)
        self._env = env
        self._built: dict[Route, Provider] = {}  # routes differing only in base URL differ
        self._scripted: dict[Path, Provider] = {}
        self._served: dict[tuple[str, str], Provider] = {}
        self._catalogs: dict[str, tuple[tuple[int, int], Catalog]] = {}

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    @property
    def catalog(self) -> Catalog:
        """The catalog in effect: the shipped one, merged with the file `STEAD_CATALOG` names (re-read when
        that file changes)."""
        path = self.env.get("STEAD_CATALOG") or None
        if path is None:
            return load_catalog()
        try:
            stat = os.stat(path)
            stamp = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            return load_catalog(path)  # raises, naming the file
        cached = self._catalogs.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        catalog = load_catalog(path)
        self._catalogs[path] = (stamp, catalog)
        return catalog

    def key_env(self, route: Route) -> Mapping[str, str]:
        """The environment a route's driver is built with. A vendor's key goes only to the base URL
        configured for that vendor (the catalog's `base_url`, or the SDK's default when it names none):
        a model string's own `@URL` elsewhere gets the placeholder `NO_KEY` in place of the key, so a
        model string can never send the operator's key to a server of its choosing."""
        env = self.env
        if route.key_env is None:
            return env
        vendor = self.catalog.vendors.get(route.vendor)
        configured = vendor.base_url if vendor is not None else None
        if _same_url(route.base_url, configured):
            return env
        return {**env, route.key_env: NO_KEY}

    def known(self) -> str:
        """What a model string may name here (registered providers, catalog vendors, driver kinds)."""
        return known_names(self.providers, self.catalog)

    # ------------------------------------------------------------------ model strings -> settings
    def parse(self, spec: str, *, base_dir: Path | None = None, within: str | None = None) -> ModelSpec:
        """Parse one model string against this router's registered providers and catalog."""
        return parse_spec(
            spec, registered=self.providers, catalog=self.catalog, base_dir=base_dir, within=within
        )

    def resolve(
        self,
        model: str | Sequence[str] | None = None,
        *,
        provider: str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        current: str | None = None,
    ) -> Selection:
        """What `create` (or a message's settings) stores for `model` and/or `provider`, checked now: the
        first candidate that can be used, or a `ConfigurationError` saying why each cannot.

        - `provider` given: a registered provider takes `model` as its own model name (the first, for a
          list; `"default"` when there is none); `catalog` takes catalog strings only.
        - no `model` and no `provider`: the default (see the module docstring).
        - `base_dir`: where `scripted:FILE.yaml` is found (default: the working directory).
        - `current`: the provider serving the agent now (a per-message switch); when it is registered,
          bare names and unknown prefixes stay with it.
        """
        base = Path(base_dir) if base_dir is not None else None
        if provider is not None:
            return self._explicit(provider, model, base)
        if model is None:
            return self.default()
        within = current if current is not None and current in self.providers else None
        candidates = _candidates(model)
        failures: list[tuple[str, str, bool]] = []  # (candidate, why, it could not be parsed)
        for index, candidate in enumerate(candidates):
            try:
                spec = self.parse(candidate, base_dir=base, within=within)
            except ConfigurationError as exc:
                failures.append((candidate, str(exc), True))
                continue
            why = self._unusable(spec)
            if why is None:
                return Selection(spec.provider, spec.model, spec.kind, index)
            failures.append((candidate, why, False))
        if len(failures) == 1:
            candidate, why, unparsed = failures[0]
            raise ConfigurationError(why if unparsed else f"{candidate} cannot be used: {why}")
        lines = "\n".join(f"  - {candidate}: {why}" for candidate, why, _ in failures)
        raise ConfigurationError(f"none of the models given can be used:\n{lines}")

    def _explicit(self, provider: str, model: str | Sequence[str] | None, base: Path | None) -> Selection:
        if provider in self.providers:
            first = _candidates(model)[0] if model is not None else "default"
            return Selection(provider, first, "registered")
        if provider == CATALOG:
            if model is None:
                return self._catalog_default()
            chosen = self.resolve(model, base_dir=base)
            if chosen.kind != "catalog":
                raise ConfigurationError(
                    f"provider='catalog' takes catalog model strings (vendor:model or a catalog name), "
                    f"not {chosen.model!r}"
                )
            return chosen
        if is_scripted_provider(provider):
            script = self.resolve(model, base_dir=base) if model is not None else None
            if script is None or script.kind != "scripted":
                raise ConfigurationError(
                    f"provider {provider!r} is not registered: name its scripted model file with "
                    f"model='scripted:FILE.yaml' (or register it with stead.open(providers=...))"
                )
            return Selection(provider, script.model, "scripted", script.index)
        raise ConfigurationError(f"unknown provider {provider!r}; known: {self.known()}")

    def default(self) -> Selection:
        """What `create()` without a model uses: the only registered provider, or (none registered) the
        catalog's strongest model usable now."""
        if len(self.providers) == 1:
            return Selection(next(iter(self.providers)), "default", "registered")
        if self.providers:
            raise ConfigurationError(
                "no model given: pass model= (e.g. 'openai:gpt-4.1-mini') or provider= naming one of the "
                f"registered providers ({', '.join(sorted(self.providers))})"
            )
        return self._catalog_default()

    def _catalog_default(self) -> Selection:
        catalog = self.catalog
        try:
            route = resolve(None, self.env, catalog=catalog)
        except ConfigurationError:
            missing = sorted(
                {
                    v.key_env
                    for v in catalog.vendors.values()
                    if v.key_env and v.key_required and not self.env.get(v.key_env)
                }
            )
            what = f"set {' or '.join(missing)}" if missing else "add a model to the catalog"
            raise ConfigurationError(
                "no model given: pass model= (e.g. 'openai:gpt-4.1-mini' or "
                "'openai-compatible:llama3.2@http://localhost:11434/v1'); without one stead uses the "
                f"strongest catalog model usable now, and none is: {what}"
            ) from None
        return Selection(CATALOG, f"{route.vendor}:{route.model}", "catalog")

    def check(self, provider: str, model: Any) -> None:
        """Raise a `ConfigurationError` naming what to set when `provider`/`model` cannot be served now."""
        if provider in self.providers:
            return
        path = scripted_path(model)
        if is_scripted_provider(provider) and path is not None:
            self._scripted_file(path)
            return
        self._explicit(provider, model, None)

    def unusable(self, spec: str, *, base_dir: str | os.PathLike[str] | None = None) -> str | None:
        """Why one model string cannot be used now (a key to set, a package to install, a missing scripted
        file), or None when it can; a `ConfigurationError` when it names nothing."""
        return self._unusable(self.parse(spec, base_dir=Path(base_dir) if base_dir is not None else None))

    def _unusable(self, spec: ModelSpec) -> str | None:
        if spec.kind == "registered":
            return None
        if spec.kind == "scripted":
            assert spec.path is not None
            try:
                self._scripted_file(spec.path)
            except ConfigurationError as exc:
                return str(exc)
            return None
        assert spec.route is not None
        return unusable(spec.route, self.key_env(spec.route))

    def _scripted_file(self, path: Path) -> Provider:
        provider = self._scripted.get(path)
        if provider is None:
            if not path.is_file():
                raise ConfigurationError(f"scripted model file {_display(path)} not found")
            provider = self._scripted[path] = load_scripted_model(_display(path))
        return provider

    # ------------------------------------------------------------------ settings -> provider
    def provider_for(self, settings: Mapping[str, Any]) -> Provider | None:
        """The provider serving `settings`, or None when none can here (an unregistered name, no usable
        route, a missing scripted file). Catalog drivers and scripted files are built once and reused."""
        name = settings.get("provider")
        if isinstance(name, str) and name in self.providers:
            return self.providers[name]
        model = settings.get("model")
        key = (str(name), model if isinstance(model, str) else repr(model))
        served = self._served.get(key)
        if served is not None:
            return served
        provider: Provider | None = None
        if name == CATALOG:
            route = self._route(model)
            if route is not None:
                provider = self._built.get(route)
                if provider is None:
                    provider = self._built[route] = make_provider(route, self.key_env(route))
        elif is_scripted_provider(name):
            path = scripted_path(model)
            if path is not None:
                try:
                    provider = self._scripted_file(path)
                except ConfigurationError:
                    provider = None
        if provider is not None:
            self._served[key] = provider
        return provider

    def context_window(self, settings: Mapping[str, Any]) -> int | None:
        """The context window of the model `settings` name, when the catalog knows it (None otherwise)."""
        if settings.get("provider") != CATALOG:
            return None
        route = self._route(settings.get("model"))
        return route.context_window if route is not None else None

    def output_limit(self, settings: Mapping[str, Any]) -> int | None:
        """The output limit (`max_output`) of the model `settings` name, when the catalog knows it: a
        catalog route, or a registered provider's model that the catalog lists by name (None otherwise)."""
        model = settings.get("model")
        if settings.get("provider") == CATALOG:
            route = self._route(model)
            return route.max_output if route is not None else None
        if not isinstance(model, str):
            return None
        info = self.catalog.models.get(model_name(model, self.catalog))
        return info.max_output if info is not None else None

    def _route(self, model: Any) -> Route | None:
        if model is None or (not isinstance(model, str) and not _is_str_list(model)):
            return None
        try:
            return resolve(model, self.env, catalog=self.catalog)
        except ConfigurationError:
            return None

    def compatible(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """K2: keep the conversation across a settings change? Same provider name (a registered provider,
        or scripted files) and profile, or catalog routes of the same vendor and driver; a catalog route
        that no longer resolves counts as incompatible (the switch resets, it is never refused)."""
        if old.get("profile") != new.get("profile"):
            return False
        if old.get("provider") != new.get("provider"):
            return False
        if old.get("provider") != CATALOG:
            return True
        return compatible(self._route(old.get("model")), self._route(new.get("model")))

    async def aclose(self) -> None:
        """Close the HTTP clients of the drivers built for catalog routes."""
        built, self._built = list(self._built.values()), {}
        self._served = {}
        for provider in built:
            close = getattr(provider, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # closing is best effort
                    pass


def _candidates(model: str | Sequence[str]) -> list[str]:
    candidates = [model] if isinstance(model, str) else list(model)
    if not candidates:
        raise ConfigurationError("model= is an empty list: name at least one model")
    for candidate in candidates:
        if not isinstance(candidate, str):
            raise ConfigurationError(f"model must be a model string or a list of them, not {model!r}")
    return candidates


def _same_url(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower()


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _display(file: Path) -> Path:
    """A path relative to the working directory when it is below it (shorter error messages)."""
    try:
        return file.relative_to(Path.cwd())
    except ValueError:
        return file
