"""`stead models`: the model catalog and which of its models can be used now; `stead run --model` checks.

A model is usable when its driver package is installed and its vendor's key is set (vendors that need no
key, such as a local Ollama server, are always usable: stead does not probe the server). The default model
it reports is the one `system.create()` without a model uses when no provider is registered (the router's
one rule, `ModelRouter.default`). Both the table and `--model` ask the driver registry and the model router,
the same code `stead.open` uses.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text as RichText

from stead.errors import ConfigurationError
from stead.providers.catalog import Catalog, ModelInfo, Vendor, load_catalog
from stead.providers.drivers import DRIVERS
from stead.providers.router import ModelRouter

__all__ = ["ModelRow", "check_model", "model_rows", "models"]


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One line of `stead models`."""

    model: str
    vendor: str
    driver: str
    power: int
    context: int | None
    prices: dict[str, float | None] | None
    realtime: bool
    usable: bool
    why: str | None  # why it cannot be used now (what to set or install)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "vendor": self.vendor,
            "driver": self.driver,
            "power": self.power,
            "context": self.context,
            "prices": self.prices,
            "realtime": self.realtime,
            "usable": self.usable,
            "why": self.why,
        }


def _why_not(vendor: Vendor, env: Mapping[str, str]) -> str | None:
    driver = DRIVERS[vendor.driver]
    if not driver.installed:
        return f"pip install 'stead[{driver.package}]'"
    if vendor.key_required and vendor.key_env and not env.get(vendor.key_env):
        return f"set {vendor.key_env}"
    return None


def model_rows(catalog: Catalog, env: Mapping[str, str]) -> list[ModelRow]:
    """Every catalog model, strongest first (realtime models last)."""
    rows: list[ModelRow] = []
    models: list[ModelInfo] = catalog.by_power() + catalog.by_power(realtime=True)
    for m in models:
        vendor = catalog.vendors[m.vendor]
        why = _why_not(vendor, env)
        prices = (
            None
            if m.prices is None
            else {"input": m.prices.input, "output": m.prices.output, "cached_input": m.prices.cached_input}
        )
        rows.append(
            ModelRow(
                m.name,
                m.vendor,
                vendor.driver,
                m.power,
                m.context_window,
                prices,
                m.realtime,
                why is None,
                why,
            )
        )
    return rows


def _money(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _context(tokens: int | None) -> str:
    if tokens is None:
        return ""
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.3g}M"
    return f"{tokens // 1000}k" if tokens >= 1000 else str(tokens)


def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    usable_only: Annotated[bool, typer.Option("--usable", help="Only the models usable now.")] = False,
) -> None:
    """List the model catalog: vendor, power rank, context window, prices (USD per million tokens) and
    whether each model is usable now (its key is set, or it needs none).

    Override or extend the catalog with a YAML file named by STEAD_CATALOG. Any model can also be named
    directly: `openai:MODEL`, `anthropic:MODEL`, or `openai-compatible:MODEL@http://host:port/v1`."""
    env = os.environ
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        catalog = load_catalog(env.get("STEAD_CATALOG") or None)
    except ConfigurationError as e:
        err.print(RichText("error: ", style="bold red") + RichText(str(e)))
        raise typer.Exit(1) from None
    rows = [r for r in model_rows(catalog, env) if r.usable or not usable_only]
    if as_json:
        typer.echo(json.dumps([r.as_json() for r in rows], indent=2))
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name, justify in (
        ("model", "left"),
        ("vendor", "left"),
        ("power", "right"),
        ("context", "right"),
        ("input", "right"),
        ("output", "right"),
        ("cached", "right"),
        ("usable", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        p = r.prices or {}
        usable = "yes" if r.usable else f"no ({r.why})"
        table.add_row(
            r.model + (" (realtime)" if r.realtime else ""),
            r.vendor,
            str(r.power),
            _context(r.context),
            _money(p.get("input")),
            _money(p.get("output")),
            _money(p.get("cached_input")),
            RichText(usable, style="green" if r.usable else "dim"),
        )
    # piped output is not cut to 80 columns
    width = None if sys.stdout.isatty() else 140
    Console(highlight=False, soft_wrap=True, width=width).print(table)
    try:
        default = ModelRouter({}, env).default()
        err.print(
            RichText(
                f"prices: USD per million tokens; the default model now is {default.model} "
                "(what create() without model= uses)",
                style="dim",
            )
        )
    except ConfigurationError:
        missing = sorted({v.key_env for v in catalog.vendors.values() if v.key_env and v.key_required})
        err.print(
            RichText(
                f"no model is usable now, so create() without model= refuses: set {' or '.join(missing)}, "
                "or name a local server with --model openai-compatible:llama3.2@http://localhost:11434/v1",
                style="yellow",
            )
        )


# ---------------------------------------------------------------------------------------------- run --model
def check_model(
    spec: str, env: Mapping[str, str] | None = None, *, base_dir: str | os.PathLike[str] | None = None
) -> str:
    """Check a `--model` value now, with the router `stead.open` uses (the one model-string grammar;
    `scripted:FILE.yaml` relative to `base_dir`, default the working directory); a `ConfigurationError`
    with one line naming what to set or install otherwise."""
    router = ModelRouter({}, env)
    try:
        why = router.unusable(spec, base_dir=base_dir)
    except ConfigurationError as e:
        raise ConfigurationError(f"--model {spec}: {e}") from None
    if why is not None:
        raise ConfigurationError(f"--model {spec}: {why}")
    return spec
