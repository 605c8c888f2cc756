"""Tool-loop workload on LangGraph with its SQLite checkpointer.

A ReAct graph from ``langgraph.prebuilt.create_react_agent`` (deprecated in LangGraph 1.x in favour
of ``langchain.agents.create_agent``, which lives in the separate ``langchain`` package; the graph
is the same model -> tools -> model loop) with a scripted ``BaseChatModel``. One ``thread_id`` per
conversation; one ``invoke`` per conversation.

Variants:

- ``sync`` / ``default``: ``SqliteSaver`` + ``graph.invoke`` with ``durability="sync"`` (each
  checkpoint is written before the next step starts) or the default (``"async"``: the write of
  step N overlaps step N+1);
- ``aio-sync`` / ``aio-default``: the same with ``AsyncSqliteSaver`` (aiosqlite) + ``ainvoke`` and
  an async tool and model.

Run: ``bench/.peers/venv/bin/python bench/peers/langgraph_loop.py --n 200 --variant sync``
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
import warnings
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from _common import (
    COUNTER,
    Clock,
    call_id,
    conv_from_text,
    conv_id,
    db_bytes,
    effective_synchronous,
    emit,
    final_text,
    install_sqlite_hooks,
    parse_args,
    user_text,
)
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

VARIANTS = ["sync", "default", "aio-sync", "aio-default"]
CLOCK = Clock()
K = 5


def scripted_reply(messages: Sequence[BaseMessage], k: int) -> AIMessage:
    """Tool call while fewer than k tool results follow the last user message, then the answer."""
    rounds = 0
    conv = ""
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            conv = conv_from_text(str(m.content))
            break
        if isinstance(m, ToolMessage):
            rounds += 1
    if rounds < k:
        return AIMessage(
            content="",
            tool_calls=[{"name": "add", "args": {"a": rounds, "b": 1}, "id": call_id(conv, rounds)}],
        )
    return AIMessage(content=final_text(k))


class ScriptedChatModel(BaseChatModel):
    """A deterministic chat model: no network, no state (the script is a function of the input)."""

    k: int = K

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with CLOCK.model():
            reply = scripted_reply(messages, self.k)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with CLOCK.model():
            reply = scripted_reply(messages, self.k)
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    with CLOCK.tool():
        return a + b


@tool("add")
async def aadd(a: int, b: int) -> int:
    """Add two integers."""
    with CLOCK.tool():
        return a + b


def _check(result: dict[str, Any], k: int) -> None:
    last = result["messages"][-1]
    if not (isinstance(last, AIMessage) and last.content == final_text(k)):
        raise SystemExit(f"unexpected final message: {last!r}")


def run_sync(path: Path, ids: list[str], k: int, durability: str | None, counted: bool) -> float:
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(ScriptedChatModel(k=k), [add], checkpointer=saver)
    kwargs: dict[str, Any] = {} if durability is None else {"durability": durability}
    saver.setup()
    COUNTER.enabled = counted
    t0 = time.perf_counter()
    for conv in ids:
        config: Any = {"configurable": {"thread_id": conv}, "recursion_limit": 4 * k + 10}
        _check(graph.invoke({"messages": [HumanMessage(user_text(conv))]}, config, **kwargs), k)
    wall = time.perf_counter() - t0
    COUNTER.enabled = False
    conn.close()
    return wall


async def run_aio(path: Path, ids: list[str], k: int, durability: str | None, counted: bool) -> float:
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = create_react_agent(ScriptedChatModel(k=k), [aadd], checkpointer=saver)
        kwargs: dict[str, Any] = {} if durability is None else {"durability": durability}
        await saver.setup()
        COUNTER.enabled = counted
        t0 = time.perf_counter()
        for conv in ids:
            config: Any = {"configurable": {"thread_id": conv}, "recursion_limit": 4 * k + 10}
            _check(await graph.ainvoke({"messages": [HumanMessage(user_text(conv))]}, config, **kwargs), k)
        wall = time.perf_counter() - t0
        COUNTER.enabled = False
    return wall


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", VARIANTS)
    install_sqlite_hooks(args.sync)
    durability = "sync" if args.variant.endswith("sync") else None
    aio = args.variant.startswith("aio")

    def run(path: Path, ids: list[str], counted: bool) -> float:
        if aio:
            return asyncio.run(run_aio(path, ids, args.k, durability, counted))
        return run_sync(path, ids, args.k, durability, counted)

    with tempfile.TemporaryDirectory(prefix="bench-langgraph-", dir=args.dir) as tmp:
        warm = Path(tmp) / "warmup.db"
        run(warm, ["warm-setup"], counted=False)
        commits = None
        if args.warmup:
            before = COUNTER.commits
            run(warm, [f"warm-{i}" for i in range(args.warmup)], counted=True)
            commits = (COUNTER.commits - before) / args.warmup
        CLOCK.reset()
        db = Path(tmp) / "langgraph.db"
        wall = run(db, [conv_id(i) for i in range(args.n)], counted=False)
        size = db_bytes(db)
        sync_mode = effective_synchronous(db)

    api = "AsyncSqliteSaver+ainvoke" if aio else "SqliteSaver+invoke"
    emit(
        framework="langgraph",
        variant=f"{api} durability={durability or 'async (default)'}",
        version=f"langgraph {version('langgraph')}, "
        f"checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}",
        n=args.n,
        k=args.k,
        wall=wall,
        clock=CLOCK,
        commits=commits,
        db_bytes_total=size,
        synchronous=sync_mode,
    )


if __name__ == "__main__":
    main()
