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
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stead.extend import load_yaml_model

__all__ = [
    "DEFAULT_TENANT",
    "SCOPES",
    "Auth",
    "Principal",
    "RateLimit",
    "TenantPolicy",
    "Token",
    "hash_token",
    "load_tokens",
]

SCOPES = (
    "agents:read",
    "agents:write",
    "agents:admin",
    "messages:write",
    "runs:read",
    "approvals:decide",
    "admin",
)
Scope = Literal[
    "agents:read", "agents:write", "agents:admin", "messages:write", "runs:read", "approvals:decide", "admin"
]
PermissionMode = Literal["read_only", "workspace_write", "auto", "full_access"]
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


@dataclass(frozen=True)
class TenantPolicy:
    """What the operator lets one tenant choose beyond the defaults (the token file's `tenants:`):
    `allowed_models`, patterns of model strings with a base URL or a scripted file (as
    `stead serve --allow-model`, docs/security.md); `max_permission_mode`, the highest permission mode an
    agent of the tenant may be created with or switched to (None: no ceiling beyond the agent's own)."""

    allowed_models: tuple[str, ...] = ()
    max_permission_mode: str | None = None


class _TenantEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allowed_models: list[str] = Field(default_factory=list)
    max_permission_mode: PermissionMode | None = None


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
    tenants: dict[str, _TenantEntry] = Field(default_factory=dict)


_HASHED = re.compile(r"^sha256:[0-9a-f]{64}$")


def load_tokens(path: str | Path) -> Auth:
    """Read a token file (YAML; see docs/server.md) into an `Auth`. Raises `stead.ConfigurationError`
    (via the YAML loader) with file and line on a malformed file."""
    from stead.extend import ConfigurationError

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
    tenants = {
        name: TenantPolicy(tuple(t.allowed_models), t.max_permission_mode)
        for name, t in parsed.tenants.items()
    }
    return Auth(tokens, default_tenant=parsed.default_tenant, tenants=tenants)


@dataclass
class _Bucket:
    tokens: float
    at: float


def _take(bucket: _Bucket, limit: RateLimit, now: float) -> float | None:
    """Take one from a token bucket: None if there was one, else the seconds until there is."""
    bucket.tokens = min(limit.burst, bucket.tokens + (now - bucket.at) * limit.rate)
    bucket.at = now
    if bucket.tokens >= 1:
        bucket.tokens -= 1
        return None
    return (1 - bucket.tokens) / limit.rate


FAILED_ATTEMPTS = RateLimit(10 / 60, 10)
"""Failed token attempts allowed per client address: 10, then one more every 6 seconds."""


@dataclass
class Auth:
    """The service's accepted tokens (none: one implicit tenant with every scope), sessions and buckets.

    Bounded: at most `max_sessions` browser sessions (the oldest goes first when a new one would exceed
    it), failed token attempts per client address limited by `failed_attempts` (at most
    `max_addresses` addresses remembered, the least recent forgotten first)."""

    tokens: list[Token] = field(default_factory=list)
    default_tenant: str | None = None
    session_seconds: float = 12 * 3600
    clock: Callable[[], float] = time.monotonic
    tenants: dict[str, TenantPolicy] = field(default_factory=dict)
    max_sessions: int = 10_000
    failed_attempts: RateLimit = FAILED_ATTEMPTS
    max_addresses: int = 10_000

    def __post_init__(self) -> None:
        self._by_hash = {t.hash: t for t in self.tokens}
        self._by_id = {t.id: t for t in self.tokens}
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._buckets: dict[str, _Bucket] = {}
        self._failures: OrderedDict[str, _Bucket] = OrderedDict()
        if not self.tokens and self.default_tenant is None:
            self.default_tenant = DEFAULT_TENANT

    @property
    def required(self) -> bool:
        """Whether requests must authenticate (a token file was given)."""
        return bool(self.tokens)

    def implicit(self) -> Principal:
        return Principal(DEFAULT_TENANT, frozenset(SCOPES), "implicit")

    def policy(self, tenant: str) -> TenantPolicy:
        """The operator's policy for a tenant (the defaults when the token file names none)."""
        return self.tenants.get(tenant) or TenantPolicy()

    def _principal(self, token: Token, *, via_cookie: bool = False) -> Principal | None:
        if token.expires_at is not None and time.time() >= token.expires_at:
            return None
        return Principal(token.tenant, token.scopes, token.id, token.name, via_cookie)

    # -- failed attempts -------------------------------------------------------------------------
    def throttled(self, address: str) -> float | None:
        """Seconds until `address` may try a token again (its failures used up its bucket), or None."""
        bucket = self._failures.get(address)
        if bucket is None:
            return None
        limit = self.failed_attempts
        now = self.clock()
        available = min(limit.burst, bucket.tokens + (now - bucket.at) * limit.rate)
        return None if available >= 1 else (1 - available) / limit.rate

    def failed(self, address: str) -> None:
        """Count one failed token attempt from `address`."""
        bucket = self._failures.pop(address, None)
        if bucket is None:
            bucket = _Bucket(self.failed_attempts.burst, self.clock())
        _take(bucket, self.failed_attempts, self.clock())
        self._failures[address] = bucket  # most recent last
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)

    def check_secret(self, secret: str) -> Principal | None:
        """The principal of a bearer secret, or None."""
        token = self._by_hash.get(hash_token(secret))
        if token is None:
            return None
        # the dict lookup found it; compare again in constant time so no timing tells a near miss
        if not hmac.compare_digest(token.hash, hash_token(secret)):
            return None  # pragma: no cover
        return self._principal(token)

    # -- browser sessions ------------------------------------------------------------------------
    def open_session(self, secret: str) -> tuple[str, Principal] | None:
        principal = self.check_secret(secret)
        if principal is None:
            return None
        now = self.clock()
        while self._sessions:  # expired sessions first (the oldest expire first: one lifetime for all)
            _, (_, expires) = next(iter(self._sessions.items()))
            if expires > now:
                break
            self._sessions.popitem(last=False)
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = (hash_token(secret), now + self.session_seconds)
        return sid, principal

    def sessions(self) -> int:
        """How many browser sessions are kept."""
        return len(self._sessions)

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
        token = self._by_id.get(principal.token_id)
        if token is None or token.rate_limit is None:
            return None
        bucket = self._buckets.get(token.hash)
        if bucket is None:
            bucket = self._buckets[token.hash] = _Bucket(token.rate_limit.burst, self.clock())
        return _take(bucket, token.rate_limit, self.clock())


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
