"""Bearer tokens, tenants, scopes, browser sessions and per-token rate limits.

Tokens are kept only as SHA-256 hashes: a token file may list `sha256:<hex>` (recommended) or a plain secret
(hashed when loaded, never kept). A request authenticates with `Authorization: Bearer <token>`, or — from
the viewer — with the HttpOnly `stead_session` cookie it got by posting a token once to `/v1/sessions`
(long-lived tokens never travel in URLs). Writes authenticated by the cookie must also carry
`X-Stead-Request: 1`, which a cross-site form cannot send.

A principal acts inside its token's tenant only; `admin` grants every scope there, never another tenant.
Without a token file the service has one implicit tenant (`default`) with every scope, and listens on
loopback only.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stead._yaml import load_yaml_model

__all__ = [
    "DEFAULT_TENANT",
    "SCOPES",
    "Auth",
    "Principal",
    "RateLimit",
    "Token",
    "hash_token",
    "load_tokens",
]

SCOPES = ("agents:read", "agents:write", "messages:write", "runs:read", "approvals:decide", "admin")
Scope = Literal["agents:read", "agents:write", "messages:write", "runs:read", "approvals:decide", "admin"]
DEFAULT_TENANT = "default"
SESSION_COOKIE = "stead_session"
CSRF_HEADER = "x-stead-request"
NAME_PATTERN = r"^[A-Za-z0-9._:@-]{1,128}$"


def hash_token(secret: str) -> str:
    """The stored form of a token: `sha256:<hex>`."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: `rate` requests per second sustained, bursts of up to `burst`."""

    rate: float
    burst: float

    @staticmethod
    def parse(text: str) -> RateLimit:
        """`"20/s"`, `"600/min"`, `"10000/h"` (the count is also the burst)."""
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*", text)
        if m is None:
            raise ValueError(f"rate limit {text!r} is not like '20/s', '600/min' or '10000/h'")
        n = float(m.group(1))
        if n <= 0:
            raise ValueError("a rate limit must be positive")
        period = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
        return RateLimit(n / period[m.group(2)], n)


@dataclass(frozen=True)
class Token:
    """One accepted token: its hash, tenant and scopes."""

    hash: str
    tenant: str
    scopes: frozenset[str]
    name: str | None = None
    rate_limit: RateLimit | None = None
    expires_at: float | None = None

    @staticmethod
    def from_secret(
        secret: str,
        tenant: str,
        scopes: tuple[str, ...] | list[str] | frozenset[str] = SCOPES,
        *,
        name: str | None = None,
        rate_limit: str | RateLimit | None = None,
        expires_at: float | None = None,
    ) -> Token:
        limit = RateLimit.parse(rate_limit) if isinstance(rate_limit, str) else rate_limit
        return Token(hash_token(secret), tenant, frozenset(scopes), name, limit, expires_at)

    @property
    def id(self) -> str:
        """A short, non-secret label for logs: the first 12 hex digits of the hash."""
        return self.hash.removeprefix("sha256:")[:12]


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant and the scopes granted there."""

    tenant: str
    scopes: frozenset[str]
    token_id: str
    name: str | None = None
    via_cookie: bool = False

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1)
    tenant: str = Field(pattern=NAME_PATTERN)
    scopes: list[Scope] = Field(min_length=1)
    name: str | None = None
    rate_limit: str | None = None
    expires_at: datetime.datetime | None = None


class _TokenFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[_TokenEntry] = Field(min_length=1)
    default_tenant: str | None = Field(default=None, pattern=NAME_PATTERN)


_HASHED = re.compile(r"^sha256:[0-9a-f]{64}$")


def load_tokens(path: str | Path) -> Auth:
    """Read a token file (YAML; see docs/server.md) into an `Auth`. Raises `stead.ConfigurationError`
    (via the YAML loader) with file and line on a malformed file."""
    from stead.errors import ConfigurationError

    parsed, _ = load_yaml_model(Path(path), _TokenFile, what="token file")
    tokens: list[Token] = []
    for entry in parsed.tokens:
        raw = entry.token
        hashed = raw.lower() if _HASHED.match(raw.lower()) else hash_token(raw)
        try:
            limit = RateLimit.parse(entry.rate_limit) if entry.rate_limit is not None else None
        except ValueError as e:
            raise ConfigurationError(f"{path}: {e}") from None
        expires = entry.expires_at.timestamp() if entry.expires_at is not None else None
        tokens.append(Token(hashed, entry.tenant, frozenset(entry.scopes), entry.name, limit, expires))
    return Auth(tokens, default_tenant=parsed.default_tenant)


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Auth:
    """The service's accepted tokens (none: one implicit tenant with every scope), sessions and buckets."""

    tokens: list[Token] = field(default_factory=list)
    default_tenant: str | None = None
    session_seconds: float = 12 * 3600
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._by_hash = {t.hash: t for t in self.tokens}
        self._sessions: dict[str, tuple[str, float]] = {}
        self._buckets: dict[str, _Bucket] = {}
        if not self.tokens and self.default_tenant is None:
            self.default_tenant = DEFAULT_TENANT

    @property
    def required(self) -> bool:
        """Whether requests must authenticate (a token file was given)."""
        return bool(self.tokens)

    def implicit(self) -> Principal:
        return Principal(DEFAULT_TENANT, frozenset(SCOPES), "implicit")

    def _principal(self, token: Token, *, via_cookie: bool = False) -> Principal | None:
        if token.expires_at is not None and time.time() >= token.expires_at:
            return None
        return Principal(token.tenant, token.scopes, token.id, token.name, via_cookie)

    def check_secret(self, secret: str) -> Principal | None:
        """The principal of a bearer secret, or None."""
        token = self._by_hash.get(hash_token(secret))
        if token is None:
            return None
        # the dict lookup found it; compare again in constant time so no timing tells a near miss
        if not hmac.compare_digest(token.hash, hash_token(secret)):
            return None  # pragma: no cover
        return self._principal(token)

    def token_of(self, secret: str) -> Token | None:
        return self._by_hash.get(hash_token(secret))

    # -- browser sessions ------------------------------------------------------------------------
    def open_session(self, secret: str) -> tuple[str, Principal] | None:
        principal = self.check_secret(secret)
        if principal is None:
            return None
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = (hash_token(secret), self.clock() + self.session_seconds)
        return sid, principal

    def session(self, sid: str) -> Principal | None:
        entry = self._sessions.get(sid)
        if entry is None:
            return None
        token_hash, expires = entry
        token = self._by_hash.get(token_hash)
        if token is None or self.clock() >= expires:
            self._sessions.pop(sid, None)
            return None
        return self._principal(token, via_cookie=True)

    def close_session(self, sid: str) -> None:
        self._sessions.pop(sid, None)

    # -- rate limits -----------------------------------------------------------------------------
    def limit(self, principal: Principal) -> float | None:
        """Take one request from the principal's bucket; None if allowed, else seconds to wait."""
        token = next((t for t in self.tokens if t.id == principal.token_id), None)
        if token is None or token.rate_limit is None:
            return None
        limit = token.rate_limit
        now = self.clock()
        bucket = self._buckets.get(token.hash)
        if bucket is None:
            bucket = self._buckets[token.hash] = _Bucket(limit.burst, now)
        bucket.tokens = min(limit.burst, bucket.tokens + (now - bucket.at) * limit.rate)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / limit.rate


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
