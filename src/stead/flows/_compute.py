"""The model-controlled computations of the built-in tools, as pure functions run in a worker process
(`stead.flows._sandbox`): artifact reads (parsing, JMESPath, paging, grep) and the data stages of a pipeline
(SEC4).

Everything here takes plain data and returns plain data, bounded as it grows: regular expressions compile
with RE2 (linear time: no pattern backtracks), every answer and every pipeline value is serialized with a
budget (`bounded_dumps` stops at its limit instead of building a huge string first), and a failure is a
`ComputeError` whose message is meant for the model. The worker that runs these also has a memory limit and
is killed at its deadline, so a computation that is merely slow or large ends too.
"""

from __future__ import annotations

import csv
import io
import json
from collections import OrderedDict
from typing import Any

import re2

from stead.flows._expr import ExpressionError, compile_expression

__all__ = [
    "MAX_PAGE",
    "MAX_REGEX_CHARS",
    "MAX_RESULT_CHARS",
    "MAX_VALUE_CHARS",
    "ComputeError",
    "artifact",
    "bounded_dumps",
    "compile_regex",
    "evaluate",
    "stage",
]

MAX_RESULT_CHARS = 10_000
"""An artifact tool's answer, at most (cut with a note)."""
MAX_VALUE_CHARS = 1_000_000
"""A pipeline value between stages, serialized, at most."""
MAX_PAGE = 500
MAX_REGEX_CHARS = 200


class ComputeError(Exception):
    """A computation that cannot be done (the message is for the model)."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def bounded_dumps(value: Any, limit: int) -> str | None:
    """Compact JSON of `value`, or None when it would be longer than `limit` characters: encoded piece by
    piece and abandoned at the limit, so a value that shares sub-values (small in memory, huge as text)
    costs at most `limit` characters of work."""
    text, complete = _encode_upto(value, limit)
    return text if complete else None


def _encode_upto(value: Any, limit: int) -> tuple[str, bool]:
    """The first `limit` characters of `value`'s compact JSON, and whether that is all of it."""
    size = 0
    parts: list[str] = []
    try:
        for chunk in _ENCODER.iterencode(value):
            size += len(chunk)
            parts.append(chunk)
            if size > limit:
                return "".join(parts)[:limit], False
    except RecursionError:
        raise ComputeError("the value is too deeply nested") from None
    return "".join(parts), True


def compile_regex(pattern: Any, ignore_case: bool = False) -> Any:
    """An RE2 regular expression of at most `MAX_REGEX_CHARS` characters (RE2 matches in linear time; it has
    no backreferences or lookaround, which a pattern here therefore cannot use)."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_REGEX_CHARS:
        raise ComputeError(f"a regular expression of 1-{MAX_REGEX_CHARS} characters")
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.max_mem = 8 << 20
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        detail = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ComputeError(
            f"invalid regular expression (RE2 syntax: no backreferences or lookaround): {detail}"
        ) from None


def evaluate(source: str, data: Any) -> Any:
    try:
        return compile_expression(source).evaluate(data)
    except ExpressionError as e:
        raise ComputeError(str(e)) from None


# ------------------------------------------------------------------------------------------------ artifacts
_PARSED: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
"""Parsed artifacts by (kind, length, hash of the content): this worker's few most recent (content never
changes for an id, and the parent process always sends the content it read, so nothing can be stale)."""


def _parsed(kind: str, content: str) -> Any:
    key = (kind, len(content), hash(content))
    found = _PARSED.get(key)
    if found is not None:
        _PARSED.move_to_end(key)
        return found
    parsed: Any
    if kind == "json":
        try:
            parsed = json.loads(content)
        except RecursionError:
            raise ComputeError("the artifact is too deeply nested to read") from None
    elif kind == "csv":
        parsed = list(csv.DictReader(io.StringIO(content)))
    else:
        parsed = content.splitlines()
    _PARSED[key] = parsed
    while len(_PARSED) > 4:
        _PARSED.popitem(last=False)
    return parsed


def _cap(text: str, hint: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return text[:MAX_RESULT_CHARS] + f"…[cut at {MAX_RESULT_CHARS:,} of {len(text):,} characters; {hint}]"


def _capped(prefix: str, value: Any, hint: str) -> str:
    """`prefix` and the JSON of `value`, cut at `MAX_RESULT_CHARS` with a note (never encoding more than
    a few times that, however large the value)."""
    budget = 8 * MAX_RESULT_CHARS
    text, complete = _encode_upto(value, budget)
    if complete:
        return _cap(prefix + text, hint)
    head = (prefix + text)[:MAX_RESULT_CHARS]
    return f"{head}…[cut at {MAX_RESULT_CHARS:,} of more than {budget:,} characters; {hint}]"


def _page(items: list[Any], offset: int, limit: int) -> tuple[list[Any], str]:
    if offset < 0 or limit < 1:
        raise ComputeError("offset must be 0 or more and limit at least 1")
    limit = min(limit, MAX_PAGE)
    page = items[offset : offset + limit]
    end = offset + len(page)
    more = f"; next: offset={end}" if end < len(items) else ""
    return page, f"items {offset}-{max(end - 1, offset)} of {len(items):,}{more}"


def artifact(op: str, kind: str, content: str, args: dict[str, Any]) -> str:
    """One artifact tool's answer (`op`: json, keys, lines, grep, rows) over an artifact's content."""
    if op == "json":
        value = evaluate(args["path"], _parsed("json", content))
        if isinstance(value, list):
            page, where = _page(value, args["offset"], args["limit"])
            return _capped(where + "\n", page, "ask for fewer items (limit) or a narrower path")
        if isinstance(value, dict) and bounded_dumps(value, MAX_RESULT_CHARS) is None:
            keys = ", ".join(list(value)[:50])
            return (
                f"an object too large to return whole ({len(value):,} keys: {keys}); ask for a narrower path"
            )
        return _capped("", value, "ask for a narrower path")
    if op == "keys":
        value = evaluate(args["path"], _parsed("json", content))
        if not isinstance(value, dict):
            return f"not an object: {type(value).__name__}" + (
                f" of {len(value):,} items" if isinstance(value, list) else ""
            )
        lines = []
        for k, v in value.items():
            if isinstance(v, list | dict):
                size = f"{len(v):,} items"
            else:
                text = bounded_dumps(v, MAX_RESULT_CHARS)
                size = f"{len(text)} chars" if text is not None else f"over {MAX_RESULT_CHARS:,} chars"
            lines.append(f"{k}: {type(v).__name__} ({size})")
            if sum(len(line) for line in lines) > MAX_RESULT_CHARS:
                break
        return _cap("\n".join(lines), "ask for a narrower path")
    lines = content.splitlines() if kind == "csv" else _parsed("text", content)
    if op == "lines":
        start, count = args["start"], args["count"]
        if start < 1 or count < 1:
            raise ComputeError("start must be 1 or more and count at least 1")
        count = min(count, MAX_PAGE)
        chunk = lines[start - 1 : start - 1 + count]
        end = start - 1 + len(chunk)
        more = f" (next: start={end + 1})" if end < len(lines) else ""
        head = f"lines {start}-{end} of {len(lines):,}{more}"
        body = "\n".join(f"{start + i}: {line}" for i, line in enumerate(chunk))
        return _cap(f"{head}\n{body}", "ask for fewer lines")
    if op == "grep":
        regex = compile_regex(args["pattern"], args["ignore_case"])
        limit = min(max(args["max_matches"], 1), MAX_PAGE)
        hits: list[str] = []
        total = 0
        for n, line in enumerate(lines, 1):
            if regex.search(line):
                total += 1
                if len(hits) < limit:
                    hits.append(f"{n}: {line}")
        more = f" (showing the first {len(hits)})" if total > len(hits) else ""
        return _cap(f"{total:,} matching lines{more}\n" + "\n".join(hits), "use a narrower pattern")
    if op == "rows":
        page, where = _page(_parsed("csv", content), args["offset"], args["limit"])
        columns = args.get("columns")
        if columns:
            page = [{c: r.get(c) for c in columns} for r in page]
        return _capped(f"rows {where.removeprefix('items ')}\n", page, "ask for fewer rows or columns")
    raise ComputeError(f"unknown artifact operation {op!r}")  # pragma: no cover


# ------------------------------------------------------------------------------------------------ pipelines
def _sized(value: Any, where: str) -> tuple[Any, int]:
    text = bounded_dumps(value, MAX_VALUE_CHARS)
    if text is None:
        raise ComputeError(
            f"{where}: the value grew past {MAX_VALUE_CHARS:,} characters (reduce it with select, head or "
            "count first)"
        )
    return value, len(text)


def _need_list(where: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    raise ComputeError(f"{where}: needs a list, got {kind_of(value)}")


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing (start with a value or tool stage)"
    return {dict: "an object", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", [], {})


def _sort_key(key: Any) -> tuple[int, Any]:
    if key is None:
        return (0, 0)
    if isinstance(key, bool):
        return (1, int(key))
    if isinstance(key, int | float):
        return (2, key)
    if isinstance(key, str):
        return (3, key)
    return (4, bounded_dumps(key, MAX_VALUE_CHARS) or "")


def path(source: str, value: Any, where: str) -> tuple[Any, int]:
    """A JMESPath path into a value (pipeline tool arguments), sized."""
    try:
        return _sized(compile_expression(source).evaluate(value), where)
    except ExpressionError as e:
        raise ComputeError(f"{where}: {e}") from None


def stage(where: str, verb: str, arg: Any, options: dict[str, Any], value: Any) -> tuple[Any, int]:
    """One data stage of a pipeline over `value`: (the new value, its size in characters)."""
    try:
        return _sized(_stage(where, verb, arg, options, value), where)
    except ExpressionError as e:
        raise ComputeError(f"{where}: {e}") from None


def _stage(where: str, verb: str, arg: Any, options: dict[str, Any], value: Any) -> Any:
    if verb == "path":
        return compile_expression(arg).evaluate(value)
    if verb == "lines":
        if not isinstance(value, str):
            raise ComputeError(f"{where}: needs text, got {kind_of(value)}")
        return value.splitlines()
    if verb == "grep":
        try:
            regex = compile_regex(arg, bool(options.get("ignore_case")))
        except ComputeError as e:
            raise ComputeError(f"{where}: {e}") from None
        items = value.splitlines() if isinstance(value, str) else _need_list(where, value)
        return [s for s in items if isinstance(s, str) and regex.search(s)]
    if verb == "count":
        return len(value) if isinstance(value, list | dict | str) else (0 if value is None else 1)
    items = _need_list(where, value)
    expr = compile_expression(arg) if isinstance(arg, str) and verb in _EXPR_VERBS else None
    if verb == "where":
        assert expr is not None
        return [x for x in items if _truthy(expr.evaluate(x))]
    if verb == "select":
        if expr is not None:
            return [expr.evaluate(x) for x in items]
        fields = [str(f) for f in arg]
        return [{f: x.get(f) for f in fields} if isinstance(x, dict) else x for x in items]
    if verb == "sort":
        keys = [(expr.evaluate(x) if expr is not None else x) for x in items]
        try:
            order = sorted(
                range(len(items)), key=lambda i: _sort_key(keys[i]), reverse=bool(options.get("desc"))
            )
        except TypeError:
            raise ComputeError(f"{where}: the sort keys cannot be compared") from None
        return [items[i] for i in order]
    if verb == "group_by":
        assert expr is not None
        groups: dict[str, list[Any]] = {}
        for x in items:
            key = expr.evaluate(x)
            groups.setdefault(key if isinstance(key, str) else _key(key), []).append(x)
        return groups
    if verb == "distinct":
        seen: set[str] = set()
        out: list[Any] = []
        for x in items:
            key = _key(expr.evaluate(x) if expr is not None else x)
            if key not in seen:
                seen.add(key)
                out.append(x)
        return out
    if verb == "flatten":
        return [y for x in items for y in (x if isinstance(x, list) else [x])]
    if verb in ("first", "head"):
        if verb == "first" and arg == 1:
            return items[0] if items else None
        return items[:arg]
    if verb in ("last", "tail"):
        if verb == "last" and arg == 1:
            return items[-1] if items else None
        return items[len(items) - arg :] if arg else []
    raise ComputeError(f"{where}: unknown verb")  # pragma: no cover - the pipeline compiler refuses it


_EXPR_VERBS = ("where", "select", "sort", "group_by", "distinct")


def _key(value: Any) -> str:
    text = bounded_dumps(value, MAX_VALUE_CHARS)
    if text is None:
        raise ComputeError(f"a key is longer than {MAX_VALUE_CHARS:,} characters")
    return text
