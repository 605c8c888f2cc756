"""The model name a driver sends on the wire, and the catalog file shipped with stead.

A driver registered by the caller (`stead.open(providers={"openai": OpenAIProvider()})`) receives the model
string of the agent's settings, which may still carry a vendor prefix and an endpoint
(`ollama:llama3.2:3b@http://host/v1`). `wire_model` strips them so the server sees `llama3.2:3b`. The
vendor names it recognises are those of the shipped catalog file, read here (below both the catalog and
the drivers, so neither imports the other).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from importlib import resources

import yaml

__all__ = ["shipped_catalog_text", "shipped_vendor_names", "wire_model"]


@functools.cache
def shipped_catalog_text() -> str:
    """The text of `stead/providers/catalog.yaml`."""
    return resources.files("stead.providers").joinpath("catalog.yaml").read_text(encoding="utf-8")


@functools.cache
def shipped_vendor_names() -> frozenset[str]:
    """The vendor names of the shipped catalog (which include every driver kind)."""
    data = yaml.safe_load(shipped_catalog_text())
    vendors = data.get("vendors") if isinstance(data, dict) else None
    return frozenset(str(name) for name in vendors) if isinstance(vendors, dict) else frozenset()


def wire_model(spec: str, vendors: Collection[str] | None = None) -> str:
    """The name to send on the wire for a model string: `openai:gpt-4.1-mini` -> `gpt-4.1-mini`,
    `ollama:llama3.2:3b@http://host/v1` -> `llama3.2:3b`; a string whose prefix is not a vendor (`vendors`,
    default the shipped catalog's) is returned unchanged (`qwen2.5:7b`)."""
    prefix, colon, rest = spec.partition(":")
    if not colon:
        return spec
    known = shipped_vendor_names() if vendors is None else vendors
    if prefix not in known:
        return spec
    return rest.partition("@")[0].strip() or spec
