"""Artifacts: large tool outputs (and inputs) stored by id, paged by the model with typed tools, for loop
agents that opt in (`builtin_tools: [artifacts]`).

A tool output longer than `THRESHOLD` (16,000 characters) does not enter the conversation: the
`tool_output` hook replaces it with a short manifest — the artifact's id, its kind (JSON, CSV or text), its
size and shape, and how to page through it — and the content is written in the transaction that commits the
call's result (so an artifact exists exactly when the result that mentions it does; its id derives from the
call id, so a re-run durable call names the same artifact). `put_artifact` stores an input artifact.

The model reads artifacts with `artifact_json` (a JMESPath path, lists paged by offset/limit),
`artifact_keys`, `artifact_lines`, `artifact_grep` and `artifact_rows` (CSV rows as objects); every answer is
capped at `MAX_RESULT_CHARS` (10,000) with a note on how to page on. Artifacts live in the agent's KV
(`kv.a.stead.art.<id>`, metadata under `kv.a.stead.artmeta.<id>`): they last as long as the agent, and are
parsed once per process (a small cache keyed by id; artifacts never change).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

from stead.extend import InvalidInput, Store, Tool, ToolContext, Tx, dumps, new_id, tool
from stead.flows._compute import MAX_REGEX_CHARS, MAX_RESULT_CHARS
from stead.flows._sandbox import ComputeFailed, ComputeTimeout, compute

__all__ = [
    "ARTIFACT_TOOLS",
    "MAX_RESULT_CHARS",
    "THRESHOLD",
    "ArtifactCache",
    "artifact_id_for_call",
    "artifact_tools",
    "describe",
    "list_artifacts",
    "put_artifact",
    "write_artifact",
]

THRESHOLD = 16_000
DEADLINE = 10.0
"""Seconds one artifact read may take (SEC4: then its worker process is killed and the call fails)."""
CONTENT = "kv.a.stead.art."
META = "kv.a.stead.artmeta."
ARTIFACT_TOOLS = ("artifact_json", "artifact_keys", "artifact_lines", "artifact_grep", "artifact_rows")


def artifact_id_for_call(call_id: str) -> str:
    """The id of the artifact holding a call's output (stable across re-runs of the call)."""
    return f"art-{call_id}"


def _kind(content: str) -> str:
    stripped = content.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            json.loads(content)
            return "json"
        except (ValueError, RecursionError):  # a document nested too deeply to parse is read as text
            pass
    head = content[:4096].splitlines()[:5]
    if (
        len(head) >= 2
        and head[0].count(",") >= 1
        and all(line.count(",") == head[0].count(",") for line in head[:-1])
    ):
        return "csv"
    return "text"


def describe(content: str, kind: str) -> str:
    """A one-line shape of the content (what the manifest tells the model)."""
    if kind == "json":
        value = json.loads(content)
        if isinstance(value, dict):
            keys = list(value)
            parts = []
            for k in keys[:8]:
                v = value[k]
                parts.append(f"{k} ({len(v):,} items)" if isinstance(v, list) else k)
            more = f", … ({len(keys)} keys)" if len(keys) > 8 else ""
            return f"a JSON object with keys {', '.join(parts)}{more}"
        if isinstance(value, list):
            return f"a JSON list of {len(value):,} items"
        return f"a JSON {type(value).__name__}"
    lines = content.count("\n") + (0 if content.endswith("\n") else 1)
    if kind == "csv":
        header = content.splitlines()[0] if content else ""
        return f"CSV with {max(lines - 1, 0):,} rows; columns: {header[:300]}"
    return f"text of {lines:,} lines"


def _meta(artifact_id: str, name: str, kind: str, content: str, source: str) -> dict[str, Any]:
    return {
        "id": artifact_id,
        "name": name,
        "kind": kind,
        "chars": len(content),
        "lines": content.count("\n") + (0 if content.endswith("\n") or not content else 1),
        "shape": describe(content, kind),
        "source": source,
    }


async def write_artifact(
    tx: Tx, agent_id: str, artifact_id: str, content: str, *, name: str, kind: str | None, source: str
) -> dict[str, Any]:
    """Store an artifact inside `tx`; return its metadata."""
    k = kind or _kind(content)
    if k not in ("json", "csv", "text"):
        raise InvalidInput(f"artifact kind must be json, csv or text, not {k!r}")
    if k == "json":
        try:
            json.loads(content)
        except ValueError as e:
            raise InvalidInput(f"artifact {name!r} is not valid JSON: {e}") from None
        except RecursionError:
            raise InvalidInput(f"artifact {name!r} is JSON nested too deeply to read") from None
    meta = _meta(artifact_id, name, k, content, source)
    await tx.write(agent_id, CONTENT + artifact_id, content)
    await tx.write(agent_id, META + artifact_id, dumps(meta))
    return meta


async def put_artifact(
    store: Store, agent_id: str, content: str, *, name: str = "input", kind: str | None = None
) -> str:
    """Store `content` as an input artifact of agent `agent_id` and return its id (mention it in the message,
    or let the instructions template list `artifacts`)."""
    artifact_id = f"art-{new_id()}"
    async with store.transaction() as tx:
        await write_artifact(tx, agent_id, artifact_id, content, name=name, kind=kind, source="input")
    return artifact_id


async def list_artifacts(tx: Tx, agent_id: str) -> list[dict[str, Any]]:
    return [json.loads(v) for _, v in await tx.read_prefix(agent_id, META) if v]


def manifest(meta: dict[str, Any], tool_name: str) -> str:
    aid = meta["id"]
    how = {
        "json": f'artifact_json(id="{aid}", path="...") (lists are paged with offset and limit), '
        f'artifact_keys(id="{aid}")',
        "csv": f'artifact_rows(id="{aid}", offset=0, limit=50), artifact_grep(id="{aid}", pattern="...")',
        "text": f'artifact_lines(id="{aid}", start=1, count=100), artifact_grep(id="{aid}", pattern="...")',
    }[meta["kind"]]
    return (
        f"The output of {tool_name} is large ({meta['chars']:,} characters), so it was stored as artifact "
        f"{aid}: {meta['shape']}. Read the parts you need with {how}."
    )


class ArtifactCache:
    """Artifacts (metadata, content) by (agent, id), as read from the store: immutable content, so a cache
    can never be stale (a deleted agent's entries are dropped when the deletion commits)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], str]] = OrderedDict()

    def forget(self, agent_id: str) -> None:
        """SEC2: drop a deleted agent's artifacts (a re-created id must not read them)."""
        for key in [k for k in self._items if k[0] == agent_id]:
            del self._items[key]

    async def get(
        self, store: Store, agent_id: str, artifact_id: str, kind: str
    ) -> tuple[dict[str, Any], str]:
        key = (agent_id, artifact_id)
        found = self._items.get(key)
        if found is None:
            async with store.transaction() as tx:
                raw_meta = await tx.get(agent_id, META + artifact_id)
                content = await tx.get(agent_id, CONTENT + artifact_id) if raw_meta is not None else None
            if raw_meta is None or content is None:
                raise InvalidInput(f"no artifact {artifact_id!r} (artifacts are listed in your instructions)")
            found = (json.loads(raw_meta), content)
            self._items[key] = found
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        meta = found[0]
        if kind == "lines" and meta["kind"] == "json":
            raise InvalidInput(f"{artifact_id} is JSON: read it with artifact_json")
        if kind == "json" and meta["kind"] != "json":
            raise InvalidInput(
                f"{artifact_id} is {meta['kind']}: read it with artifact_lines or artifact_rows"
            )
        if kind == "rows" and meta["kind"] != "csv":
            raise InvalidInput(f"{artifact_id} is {meta['kind']}, not CSV")
        return found


async def _answer(
    cache: ArtifactCache, ctx: ToolContext, id: str, kind: str, op: str, args: dict[str, Any]
) -> str:
    """SEC4: the answer computed in a worker process, by `DEADLINE` seconds from now."""
    meta, content = await cache.get(ctx.store, ctx.agent_id, id, kind)
    try:
        text: str = await compute(
            "artifact", op, meta["kind"], content, args, deadline=time.monotonic() + DEADLINE
        )
    except ComputeTimeout:
        raise InvalidInput(
            f"reading {id} did not finish within {DEADLINE:g} seconds (stopped): ask for a narrower path, "
            "a simpler pattern or fewer items"
        ) from None
    except ComputeFailed as e:
        raise InvalidInput(str(e)) from None
    return text


def artifact_tools(cache: ArtifactCache) -> list[Tool]:
    async def artifact_json(
        ctx: ToolContext, id: str, path: str = "@", offset: int = 0, limit: int = 50
    ) -> str:
        """Read part of a JSON artifact: the value at a JMESPath `path` ("@" is the whole document,
        "items[3].name", "items[?price > `10`].id"); a list is returned one page at a time.

        Args:
            id: The artifact's id.
            path: A JMESPath expression.
            offset: For a list: the first item to return.
            limit: For a list: how many items to return (at most 500).
        """
        return await _answer(cache, ctx, id, "json", "json", {"path": path, "offset": offset, "limit": limit})

    async def artifact_keys(ctx: ToolContext, id: str, path: str = "@") -> str:
        """The keys of the object at `path` in a JSON artifact, with the type and size of each value.

        Args:
            id: The artifact's id.
            path: A JMESPath expression ("@" is the whole document).
        """
        return await _answer(cache, ctx, id, "json", "keys", {"path": path})

    async def artifact_lines(ctx: ToolContext, id: str, start: int = 1, count: int = 100) -> str:
        """Lines of a text (or CSV) artifact, numbered from 1.

        Args:
            id: The artifact's id.
            start: The first line to return (1 is the first line).
            count: How many lines (at most 500).
        """
        return await _answer(cache, ctx, id, "lines", "lines", {"start": start, "count": count})

    async def artifact_grep(
        ctx: ToolContext, id: str, pattern: str, max_matches: int = 50, ignore_case: bool = False
    ) -> str:
        """Lines of a text or CSV artifact that match a regular expression, with their line numbers.

        Args:
            id: The artifact's id.
            pattern: A regular expression (at most 200 characters).
            max_matches: Stop after this many matching lines (at most 500).
            ignore_case: Match regardless of case.
        """
        if not pattern or len(pattern) > MAX_REGEX_CHARS:
            raise InvalidInput(f"pattern must be 1-{MAX_REGEX_CHARS} characters")
        args = {"pattern": pattern, "max_matches": max_matches, "ignore_case": ignore_case}
        return await _answer(cache, ctx, id, "lines", "grep", args)

    async def artifact_rows(
        ctx: ToolContext, id: str, offset: int = 0, limit: int = 50, columns: list[str] | None = None
    ) -> str:
        """Rows of a CSV artifact as objects (keyed by the header), one page at a time.

        Args:
            id: The artifact's id.
            offset: The first row (0 is the first row after the header).
            limit: How many rows (at most 500).
            columns: Only these columns.
        """
        args = {"offset": offset, "limit": limit, "columns": columns}
        return await _answer(cache, ctx, id, "rows", "rows", args)

    return [
        tool(durable=True)(artifact_json),
        tool(durable=True)(artifact_keys),
        tool(durable=True)(artifact_lines),
        tool(durable=True)(artifact_grep),
        tool(durable=True)(artifact_rows),
    ]
