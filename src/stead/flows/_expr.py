"""The flow expression language: JMESPath, compiled when a definition loads, evaluated over plain JSON.

Why JMESPath (../shared/reference/memory-approvals-realtime.md §6.2): it has no dependencies, a spec and a
compliance suite, and its model is JSON in, JSON out — an expression can read the data it is given and
nothing else: no attribute access, no calls into Python, no loops. Definitions may come from people who do not
run the process, so that matters more than readability.

Three limits keep hostile or accidental input cheap and predictable:
- at most `MAX_EXPRESSION_CHARS` (1,000) characters;
- at most `MAX_NESTING` (32) levels of brackets, braces and parentheses, counted on the source before the
  parser sees it (parsers recurse per level: 3,000 nested parentheses exhaust Python's stack);
- a `RecursionError` while parsing or evaluating becomes an `ExpressionError`, never a crash.

Conditions use JMESPath truthiness: `false`, `null`, `""`, `[]` and `{}` are false, everything else true, so a
missing key (`null`) is simply false. Number literals need backticks: ``payload.amount < `100` ``; string
literals use single quotes: `step.output.label == 'refund'`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.parser

__all__ = [
    "MAX_EXPRESSION_CHARS",
    "MAX_NESTING",
    "Expression",
    "ExpressionError",
    "compile_expression",
    "truthy",
]

MAX_EXPRESSION_CHARS = 1000
MAX_NESTING = 32

_OPEN = "([{"
_CLOSE = ")]}"
_QUOTES = "'`\""


class ExpressionError(ValueError):
    """An expression that does not compile, or failed while it was evaluated."""


def truthy(value: Any) -> bool:
    """JMESPath truthiness: false, null, empty strings, lists and objects are false."""
    if value is None or value is False:
        return False
    if isinstance(value, str | list | dict):
        return len(value) > 0
    return True


def nesting(source: str) -> int:
    """The deepest bracket nesting of `source`, ignoring brackets inside quoted literals."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for ch in source:
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in _QUOTES:
            quote = ch
        elif ch in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
    return deepest


@dataclass(frozen=True)
class Expression:
    """A compiled expression. `evaluate(context)` returns its JSON value; `test(context)` its truthiness."""

    source: str
    _parsed: Any = field(repr=False, compare=False)

    def evaluate(self, context: Any) -> Any:
        try:
            return self._parsed.search(context)
        except RecursionError:
            raise ExpressionError(f"{self.source!r}: too deeply nested to evaluate") from None
        except jmespath.exceptions.JMESPathError as e:
            raise ExpressionError(f"{self.source!r}: {_one_line(e)}") from None

    def test(self, context: Any) -> bool:
        return truthy(self.evaluate(context))


def compile_expression(source: Any) -> Expression:
    """Compile `source`; `ExpressionError` naming the problem (and where in the text it is)."""
    if not isinstance(source, str):
        raise ExpressionError(f"an expression must be a string, not {type(source).__name__}")
    if not source.strip():
        raise ExpressionError("the expression is empty")
    if len(source) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(
            f"the expression is {len(source):,} characters long; the limit is {MAX_EXPRESSION_CHARS:,}"
        )
    depth = nesting(source)
    if depth > MAX_NESTING:
        raise ExpressionError(f"the expression nests {depth} levels deep; the limit is {MAX_NESTING}")
    try:
        parsed = jmespath.compile(source)
    except RecursionError:
        raise ExpressionError("the expression is too deeply nested") from None
    except jmespath.exceptions.JMESPathError as e:
        raise ExpressionError(f"invalid expression {source!r}: {_one_line(e)}") from None
    return Expression(source, parsed)


def _one_line(error: Exception) -> str:
    """JMESPath's messages span lines (the source with a caret); say it in one, with the column."""
    if isinstance(error, jmespath.exceptions.LexerError):
        return f"{error.message} at column {error.lexer_position + 1}"
    if isinstance(error, jmespath.exceptions.IncompleteExpressionError):
        return "the expression ends too early (something is missing at the end)"
    if isinstance(error, jmespath.exceptions.ParseError):
        where = f" at column {error.lex_position + 1}" if isinstance(error.lex_position, int) else ""
        return f"{str(error.msg).rstrip(':. ')}{where}"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
