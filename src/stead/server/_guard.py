"""What an HTTP caller may not choose (docs/security.md): where the server's keys go and which files it
reads (SEC1), a wider agent (SEC3); what an answer never shows (a model server's error body, an absolute
server path: SEC1b, SEC7e, in `_redact`); and which requests reach the routes at all (`Host`, `Origin`: SEC5).

Model strings. A model string with a base URL (`openai:M@URL`, `anthropic:M@URL`,
`openai-compatible:M@URL`, any `…@…`) or a scripted model file (`scripted:PATH`) is refused from a caller
unless it matches a pattern the operator allowed (`stead serve --allow-model`, `create_app(allow_models=)`,
or the tenant's `allowed_models` in the token file). A pattern is itself a model string:

- `VENDOR:MODEL@URL`: the vendor and the URL must be equal (a trailing `/` aside); the model name may be
  a shell pattern (`openai-compatible:*@http://gpu-box:8000/v1`). The URL is never a pattern, so no
  string can smuggle another host past one.
- `scripted:/ABSOLUTE/PATTERN`: a shell pattern over the file's resolved absolute path
  (`scripted:/srv/stead/models/*.yaml`); a caller's `scripted:` path must be absolute. `..` and symbolic
  links are resolved before matching.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

import stead
from stead.server._auth import Principal
from stead.server._errors import ApiError, problem_response

__all__ = [
    "LOOPBACK_HOSTS",
    "HostOriginGuard",
    "check_metadata",
    "check_model",
    "check_permission_mode",
]

SCRIPTED = "scripted:"
PERMISSION_MODES = ("read_only", "workspace_write", "auto", "full_access")
"""Least to most permissive (the kernel's order)."""
PARENT_KEY = "stead.parent"
CHANGES_KEY = "stead.changes"
ADMIN_SCOPE = "agents:admin"


# ------------------------------------------------------------------ model strings (SEC1)
def _split(text: str) -> tuple[str, str, str] | None:
    """(prefix, model, url) of a `[prefix:]model@url` string (split as the catalog splits it), or None
    when it has no `@`."""
    prefix, colon, rest = text.partition(":")
    if not colon or "@" in prefix:
        prefix, rest = "", text
    model, at, url = rest.partition("@")
    if not at:
        return None
    return prefix.strip(), model.strip(), url.strip().rstrip("/")


def _scripted_path(text: str) -> Path | None:
    """The resolved absolute path of a caller's `scripted:/path` (None when it is not absolute)."""
    path = Path(text[len(SCRIPTED) :].strip())
    if not path.is_absolute():
        return None
    return Path(os.path.realpath(path))


def _matches(text: str, pattern: str) -> bool:
    pattern = pattern.strip()
    if text.startswith(SCRIPTED):
        if not pattern.startswith(SCRIPTED):
            return False
        path = _scripted_path(text)
        allowed = pattern[len(SCRIPTED) :].strip()
        return path is not None and os.path.isabs(allowed) and fnmatch.fnmatchcase(str(path), allowed)
    have, want = _split(text), _split(pattern)
    if have is None or want is None:
        return False
    return have[0] == want[0] and have[2] == want[2] and fnmatch.fnmatchcase(have[1], want[1])


def needs_permission(text: str) -> bool:
    """Whether a model string names an endpoint or a file (and so needs the operator's permission)."""
    text = text.strip()
    return text.startswith(SCRIPTED) or "@" in text


def check_model(
    model: str | Sequence[str] | None,
    provider: str | None,
    *,
    allowed: Iterable[str],
    loc: Sequence[str],
) -> None:
    """422 `model_not_allowed` (naming the field) when a caller's model string (or any candidate of a list)
    names a base URL or a scripted file the operator did not allow; also a scripted provider name."""
    patterns = list(allowed)
    candidates = [] if model is None else [model] if isinstance(model, str) else list(model)
    field = ".".join(loc)
    for i, candidate in enumerate(candidates):
        if not isinstance(candidate, str) or not needs_permission(candidate):
            continue
        if any(_matches(candidate.strip(), p) for p in patterns):
            continue
        where = field if isinstance(model, str) else f"{field}.{i}"
        raise ApiError(
            422,
            "model_not_allowed",
            f"{where}: a model string with a base URL (@URL) or a scripted model file is not allowed from "
            "HTTP callers unless the operator allows it (stead serve --allow-model PATTERN, or the tenant's "
            "allowed_models in the token file)",
            errors=[{"loc": ["body", *loc], "msg": "model not allowed", "type": "model_not_allowed"}],
        )
    scripted = provider is not None and (provider == "scripted-file" or provider.startswith("scripted/"))
    if scripted and not (
        candidates
        and all(isinstance(c, str) and any(_matches(c.strip(), p) for p in patterns) for c in candidates)
    ):
        raise ApiError(
            422,
            "model_not_allowed",
            f"{'.'.join([*loc[:-1], 'provider'])}: a scripted model file is not allowed from HTTP "
            "callers unless the operator allows it",
        )


# ------------------------------------------------------------------ widening (SEC3)
def _rank(mode: str) -> int:
    return PERMISSION_MODES.index(mode) if mode in PERMISSION_MODES else len(PERMISSION_MODES)


def check_permission_mode(
    mode: str | None, principal: Principal, *, ceilings: Mapping[str, str | None], field: str
) -> None:
    """A caller's `permission_mode` needs `agents:admin` (403 `missing_scope`) and may not be above any of
    `ceilings` (what → mode; 403 `above_ceiling`)."""
    if mode is None:
        return
    if not principal.allows(ADMIN_SCOPE):
        raise ApiError(
            403, "missing_scope", f"{field}: setting a permission mode needs the scope {ADMIN_SCOPE!r}"
        )
    for what, ceiling in ceilings.items():
        if ceiling is not None and _rank(mode) > _rank(ceiling):
            raise ApiError(403, "above_ceiling", f"{field}: {mode!r} is above {what}'s ceiling {ceiling!r}")


def own_lists(config: Any) -> tuple[set[str], set[str]]:
    """The tools and sub-agents the agent's definition (or creation) gave it, before any runtime change."""
    extra = config.extra if isinstance(config.extra, Mapping) else {}
    tools, subs = extra.get("stead.tools"), extra.get("stead.sub_agents")
    if isinstance(tools, list) and isinstance(subs, list):
        return {str(t) for t in tools}, {str(s) for s in subs}
    return {str(t) for t in config.tools}, set()


def check_metadata(metadata: Mapping[str, Any] | None, principal: Principal, config: Any, field: str) -> None:
    """`stead.parent` from a caller: 422 (only the kernel links runs). `stead.changes`: needs
    `agents:admin` (403), and may only remove, or add what the agent's own definition already has, for the
    agent itself (`scope: root`): a change never reaches a tool or sub-agent the definition does not give."""
    if not metadata:
        return
    if PARENT_KEY in metadata:
        raise ApiError(
            422,
            "invalid_input",
            f"{field}.{PARENT_KEY}: reserved: only the kernel links a run to its parent",
            errors=[{"loc": ["body", *field.split("."), PARENT_KEY], "msg": "reserved", "type": "reserved"}],
        )
    if CHANGES_KEY not in metadata:
        return
    if not principal.allows(ADMIN_SCOPE):
        raise ApiError(
            403, "missing_scope", f"{field}.{CHANGES_KEY}: runtime changes need the scope {ADMIN_SCOPE!r}"
        )
    raw = metadata[CHANGES_KEY]
    if not isinstance(raw, list):
        raise ApiError(422, "invalid_input", f"{field}.{CHANGES_KEY}: a list of runtime changes")
    tools, subs = own_lists(config)
    for i, item in enumerate(raw):
        try:
            change = stead.RuntimeChange.decode(item)
        except stead.InvalidInput as exc:
            raise ApiError(422, "invalid_input", f"{field}.{CHANGES_KEY}.{i}: {exc}") from None
        if change.action == "remove":
            continue
        own = tools if change.kind == "tool" else subs
        if change.scope != "root" or change.name not in own:
            raise ApiError(
                403,
                "beyond_definition",
                f"{field}.{CHANGES_KEY}.{i}: adding {change.kind} {change.name!r} (scope {change.scope}) "
                "goes beyond what the agent's definition gives it",
            )


# ------------------------------------------------------------------ Host and Origin (SEC5)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def _host_name(host: str) -> str:
    """`name` of a `Host` header value `name[:port]` / `[v6]:port`, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class HostOriginGuard:
    """Refuses, before any route runs: a `Host` outside `hosts` (when given: the no-token mode's localhost
    names and bound address — a DNS-rebinding page sends its own name), and a state-changing request
    (anything but GET, HEAD, OPTIONS) from another origin: an `Origin` that is not this service's own
    (`null` included), or `Sec-Fetch-Site: cross-site`. Both are 403 problems; nothing is read or
    written."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            response = problem_response(403, "host_not_allowed", "this service does not answer to that Host")
            await response(scope, receive, send)
            return
        if scope["method"] not in _SAFE:
            origin = headers.get("origin")
            cross = headers.get("sec-fetch-site") == "cross-site"
            if cross or (origin is not None and not _same_origin(origin, host, scope)):
                response = problem_response(
                    403, "cross_origin", "a state-changing request from another origin is refused"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _same_origin(origin: str, host: str, scope: Scope) -> bool:
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return parts.scheme == scope.get("scheme", "http") and parts.netloc.lower() == host.strip().lower()


UI_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
"""Sent with the viewer's page and assets (SEC7c): no script but its own, never framed."""
