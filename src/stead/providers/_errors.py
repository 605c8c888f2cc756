"""One error model for every real provider: SDK exceptions in, `ProviderError` out.

Retryable (the kernel backs off and tries again): HTTP 408, 409, 429 (with `Retry-After` honoured), every 5xx
including Anthropic's 529 `overloaded_error`, timeouts, connection failures, an error event in the middle of a
stream that is not about the request itself, and a stream that ends without its terminal event.

Fatal (retrying cannot help): 400 invalid request (with a clear message when the context is too long),
401/403 authentication and permission, 404 unknown model or endpoint, 413/422, and a 429 that means the
account is out of quota. A server may override either way with the `x-should-retry` header, as both
official SDKs do.
"""

from __future__ import annotations

import email.utils
import importlib
import ipaddress
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from stead.errors import CONTEXT_TOO_LONG as _CONTEXT_RE
from stead.errors import ProviderError

__all__ = [
    "ErrorMap",
    "connection_failed",
    "from_exception",
    "open_stream",
    "parse_retry_after",
    "read_stream",
    "status_error",
    "stream_ended",
]

_FATAL_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
        "insufficient_quota",
        "invalid_api_key",
    }
)


ErrorMap = Callable[[BaseException], ProviderError | None]
"""A driver's `from_exception` for its SDK: the ProviderError an exception means (None: not the SDK's)."""


def _raise_mapped(exc: Exception, error: ErrorMap) -> None:
    mapped = error(exc)
    if mapped is not None:
        raise mapped from exc


async def open_stream(request: Awaitable[Any], error: ErrorMap) -> Any:
    """The SDK's stream response to `request`; an SDK exception raised as the ProviderError it means."""
    try:
        return await request
    except Exception as exc:
        _raise_mapped(exc, error)
        raise


async def read_stream(response: Any, error: ErrorMap) -> AsyncGenerator[Any, None]:
    """Each raw event of an SDK stream response; an SDK exception while reading is raised as the ProviderError
    it means (only the reading: what the caller does with an event is not mapped). The response is closed
    however the reading ends: close this iterator deterministically (`contextlib.aclosing`)."""
    try:
        events = response.__aiter__()
        while True:
            try:
                event = await events.__anext__()
            except StopAsyncIteration:
                break
            except Exception as exc:
                _raise_mapped(exc, error)
                raise
            yield event
    finally:
        await response.close()


def stream_ended(vendor: str) -> ProviderError:
    """The response stream stopped before its terminal event (a dropped connection or a cut proxy)."""
    return ProviderError(f"{vendor}: stream ended before completion", retryable=True)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms`, `retry-after` (seconds or an HTTP date); None when absent."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if seconds != seconds or seconds < 0 or seconds == float("inf"):
            return None
        return seconds
    value = headers.get("retry-after")
    if value:
        parsed = email.utils.parsedate_tz(value)
        if parsed is not None:
            return max(0.0, float(email.utils.mktime_tz(parsed) - time.time()))
    return None


def _error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from either vendor's error body (whole body or its inner `error` object)."""
    if isinstance(body, str):
        raw = body
        try:
            body = json.loads(raw)
        except ValueError:
            return None, None, raw or None
    if not isinstance(body, Mapping):
        return None, None, None
    inner = body.get("error")
    if isinstance(inner, Mapping):
        body = inner
    elif isinstance(inner, str):
        return None, None, inner

    def text(key: str) -> str | None:
        value = body.get(key)
        return str(value) if value is not None else None

    return text("type"), text("code"), text("message")


def status_error(
    vendor: str,
    status: int,
    *,
    body: object = None,
    headers: Mapping[str, str] | None = None,
    fallback: str = "",
    key_env: str | None = None,
) -> ProviderError:
    """Map an HTTP error status (or, with a 2xx status, an error event inside a stream) to a ProviderError."""
    err_type, code, message = _error_fields(body)
    detail = message or fallback or f"HTTP {status}"
    label = f"HTTP {status}" if status >= 300 else "stream error"
    if err_type:
        label += f" {err_type}"
    retry_after = parse_retry_after(headers)

    if status >= 300:
        retryable = status in (408, 409, 429) or status >= 500
    else:
        retryable = (err_type or "") not in _FATAL_TYPES
    if code == "insufficient_quota" or err_type == "insufficient_quota":
        retryable = False
    if headers is not None:
        should_retry = headers.get("x-should-retry")
        if should_retry == "true":
            retryable = True
        elif should_retry == "false":
            retryable = False

    if status in (400, 413) and (code == "context_length_exceeded" or _CONTEXT_RE.search(detail)):
        text = (
            f"{vendor}: context too long: the conversation does not fit the model's context window ({detail})"
        )
    elif status in (401, 403) or err_type in ("authentication_error", "permission_error"):
        what = (
            "permission denied"
            if status == 403 or err_type == "permission_error"
            else "authentication failed"
        )
        hint = f"check {key_env}" if key_env else "check the API key"
        text = f"{vendor}: {what} ({label}): {detail}; {hint}"
    elif status == 429 and not retryable:
        text = f"{vendor}: quota exhausted ({label}): {detail}"
    elif status == 429 or err_type == "rate_limit_error":
        text = f"{vendor}: rate limited ({label}): {detail}"
    elif status == 529 or err_type == "overloaded_error":
        text = f"{vendor}: overloaded ({label}): {detail}"
    elif status == 404:
        text = f"{vendor}: not found ({label}): {detail}"
    else:
        text = f"{vendor}: {label}: {detail}"
    return ProviderError(text, retryable=retryable, retry_after=retry_after if retryable else None)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """HTTP transport failures raised while reading a stream (httpx2 in current SDKs, httpx in older ones)."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx2", "httpx"):
        try:
            module: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, "TransportError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "host.docker.internal") or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def connection_failed(vendor: str, url: str | None, cause: BaseException | None) -> ProviderError:
    """No connection could be made (refused, unresolvable host, unreachable network): one line naming the
    endpoint and what to check. Retryable: a server that is starting up may answer the next attempt."""
    why = f" ({_one_line(str(cause))})" if cause is not None and str(cause).strip() else ""
    if url is None:
        return ProviderError(f"{vendor}: connection failed{why}", retryable=True)
    hint = "is the server running?" if _is_local(url) else "check the network and the URL"
    return ProviderError(f"{vendor}: connection failed to {url}{why}: {hint}", retryable=True)


def from_exception(
    vendor: str,
    exc: BaseException,
    sdk: Any,
    *,
    key_env: str | None = None,
    base_url: str | None = None,
) -> ProviderError | None:
    """Map an exception raised by the `openai` or `anthropic` SDK (passed as `sdk`); None if it is not one.

    Both SDKs share the class layout: `APIStatusError` (with `.status_code`, `.response`, `.body`),
    `APITimeoutError` (a subclass of `APIConnectionError`), and `APIError` for an error sent inside a stream.
    `base_url` is the endpoint the driver talks to, named when no connection can be made (the SDK's default
    endpoint, from the failed request, when it is None).
    """
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError(f"{vendor}: request timed out", retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        return status_error(
            vendor,
            int(exc.status_code),
            body=getattr(exc, "body", None),
            headers=headers,
            fallback=str(getattr(exc, "message", "") or exc),
            key_env=key_env,
        )
    if isinstance(exc, sdk.APIConnectionError):
        url = base_url
        if url is None:
            request = getattr(exc, "request", None)
            target = getattr(request, "url", None)
            if target is not None:
                parts = urlsplit(str(target))
                url = f"{parts.scheme}://{parts.netloc}" if parts.netloc else None
        return connection_failed(vendor, url, exc.__cause__ or exc.__context__)
    if isinstance(exc, sdk.APIError):
        # An error object sent inside an otherwise successful stream.
        return status_error(vendor, 200, body=getattr(exc, "body", None), fallback=str(exc), key_env=key_env)
    if _TRANSPORT_ERRORS and isinstance(exc, _TRANSPORT_ERRORS):
        kind = type(exc).__name__
        return ProviderError(f"{vendor}: connection lost while streaming ({kind}: {exc})", retryable=True)
    if isinstance(exc, json.JSONDecodeError):
        return ProviderError(f"{vendor}: malformed stream data ({exc})", retryable=True)
    return None
