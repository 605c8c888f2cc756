"""What an answer never shows a caller (docs/security.md): a model server's error body beyond its status
line (SEC1b), an absolute server path (SEC7e). The whole text stays in the server's log and records."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["public_model", "public_text"]

SCRIPTED = "scripted:"

_PROVIDER_STATUS = re.compile(r"(?:HTTP \d{3}|stream error)(?: [\w.-]{1,60})?\)?")
_CONTEXT = re.compile(r"context too long: the conversation does not fit the model's context window")
_ABS_PATH = re.compile(r"(?<![\w:/.~-])(?:/[\w.@+,=~-]+){2,}/?")
_CUT = ": the model server's answer is in the server's log"


def public_text(text: str | None) -> str | None:
    """A caller-facing error text: a model server's error (`vendor: HTTP 400 type: its body…`, `… (HTTP
    429 type): its body…`, `…context window (its body)`) cut after its status line, and every absolute
    server path reduced to its last component."""
    if text is None:
        return None
    m = _PROVIDER_STATUS.search(text) or _CONTEXT.search(text)
    if m is not None and text[m.end() :].strip(" :;.()"):
        text = text[: m.end()] + _CUT
    return _ABS_PATH.sub(lambda p: "…/" + p.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def public_model(model: Any) -> Any:
    """A stored model as callers see it: a scripted file by its name, not its absolute path (SEC7e)."""
    if isinstance(model, list):
        return [public_model(m) for m in model]
    if isinstance(model, str) and model.startswith(SCRIPTED + "/"):
        return SCRIPTED + model.rstrip("/").rsplit("/", 1)[-1]
    return model
