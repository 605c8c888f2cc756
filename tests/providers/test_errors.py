"""The shared error model, unit by unit (the fault suite covers it end to end over HTTP)."""

from __future__ import annotations

import email.utils
import time

import pytest

from stead.providers._context import arguments_json, parse_arguments
from stead.providers._errors import parse_retry_after, status_error, stream_ended


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-4"}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    assert parse_retry_after(headers) == seconds


def test_parse_retry_after_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    value = parse_retry_after({"retry-after": when})
    assert value is not None and 25 <= value <= 31


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (409, True),
        (413, False),
        (422, False),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (529, True),
    ],
)
def test_status_classification(status: int, retryable: bool) -> None:
    assert status_error("v", status).retryable is retryable


def test_retry_after_only_on_retryable_errors() -> None:
    assert status_error("v", 429, headers={"retry-after": "2"}).retry_after == 2.0
    assert status_error("v", 400, headers={"retry-after": "2"}).retry_after is None


def test_in_stream_errors_classified_by_type() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert status_error("anthropic", 200, body=overloaded).retryable is True
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert status_error("anthropic", 200, body=invalid).retryable is False
    openai_inner = {"message": "boom", "type": "server_error", "param": None, "code": None}
    err = status_error("openai", 200, body=openai_inner)
    assert err.retryable is True and "boom" in str(err)


def test_context_too_long_messages() -> None:
    openai_body = {"message": "maximum context length is 8192 tokens", "code": "context_length_exceeded"}
    assert "context too long" in str(status_error("openai", 400, body=openai_body))
    anthropic_body = {"error": {"type": "invalid_request_error", "message": "prompt is too long: 1 > 0"}}
    assert "context too long" in str(status_error("anthropic", 400, body=anthropic_body))
    other = {"error": {"type": "invalid_request_error", "message": "tools.0.name: invalid"}}
    assert "context" not in str(status_error("anthropic", 400, body=other))


def test_error_body_as_text() -> None:
    err = status_error("v", 502, body="<html>Bad Gateway</html>")
    assert err.retryable is True and "Bad Gateway" in str(err)


def test_stream_ended() -> None:
    err = stream_ended("openai")
    assert err.retryable is True and str(err) == "openai: stream ended before completion"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("", {}),
        ("  ", {}),
        ('{"a": 1}', {"a": 1}),
        ('{"a": ', '{"a": '),
        ("[1, 2]", "[1, 2]"),
        ("null", "null"),
        ('"text"', '"text"'),
    ],
)
def test_parse_arguments(raw: str, parsed: object) -> None:
    assert parse_arguments(raw) == parsed


def test_arguments_json_round_trip() -> None:
    assert arguments_json({"city": "Zürich", "n": 1}) == '{"city":"Zürich","n":1}'
    assert arguments_json('{"broken') == '{"broken'
    assert parse_arguments(arguments_json({"k": [1, {"x": None}]})) == {"k": [1, {"x": None}]}
