"""Compaction benchmark (issue 10): a 300-round tool conversation with large tool results on a scripted model
with an 8,000-token window.

The scripted "server" counts every request's tokens (o200k_base when `bpe-openai` is installed, else
stead's own estimate) and refuses any request larger than its window with OpenAI's
`context_length_exceeded` error, like a real server. It reports no usage (like a llama.cpp server
streaming), so stead estimates it. Reported: the largest request (must stay ≤ the window), the number of
compactions and summary requests, the tokens sent in total with compaction — and without it, where the
conversation fails at the round whose request no longer fits — and the compaction overhead per round
(wall time and summary tokens).

    python bench/compaction.py [--rounds 300] [--window 8000] [--result-chars 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import stead
from stead._tokens import estimate_messages, estimate_text, estimate_tools
from stead.providers.scripted import ScriptedProvider, ScriptedResponse

try:  # exact counts for the fake server when available (pip install bpe-openai)
    import bpe_openai

    _ENC: Any = bpe_openai.get_encoding("o200k_base")
except ImportError:  # pragma: no cover
    _ENC = None


def server_tokens(request: stead.ProviderRequest) -> int:
    if _ENC is None:
        return (
            estimate_text(request.instructions)
            + estimate_tools(request.tools)
            + estimate_messages(request.messages)
        )
    text = [request.instructions, *(f"{t.name} {t.description} {t.parameters}" for t in request.tools)]
    n = 0
    for m in request.messages:
        n += 4
        for b in m.content:
            text.append(
                getattr(b, "text", None) or getattr(b, "output", None) or str(getattr(b, "arguments", ""))
            )
    return n + sum(len(_ENC.encode(t)) for t in text if t)


class Server:
    def __init__(self, window: int, rounds: int, result_chars: int, enforce: bool = True) -> None:
        self.window, self.rounds, self.result_chars, self.enforce = window, rounds, result_chars, enforce
        self.failed_at: int | None = None
        self.sent_before_failure = 0
        self.largest = 0
        self.sent = 0
        self.summary_sent = 0
        self.summaries = 0
        self.refused = 0
        self.provider = ScriptedProvider(self.respond)

    def respond(self, request: stead.ProviderRequest) -> ScriptedResponse:
        size = server_tokens(request)
        if size > self.window and self.failed_at is None:
            self.failed_at = len(self.provider.requests) - 1
            self.sent_before_failure = self.sent
        if size > self.window and self.enforce:
            self.refused += 1
            return ScriptedResponse(
                error=f"This model's maximum context length is {self.window} tokens. However, your "
                f"messages resulted in {size} tokens (context_length_exceeded)"
            )
        self.largest = max(self.largest, size)
        self.sent += size
        if request.purpose == "compaction":
            self.summaries += 1
            self.summary_sent += size
            text = request.messages[-1].text
            pages = sorted({w for w in text.split() if w.startswith("page-")})
            return ScriptedResponse(
                blocks=[stead.Text(f"Fetched {', '.join(pages[-20:])} so far; continue with the next page.")],
                report_usage=False,
            )
        n = 0
        for m in reversed(request.messages):
            calls = [b for b in m.content if isinstance(b, stead.ToolCall)]
            if calls and isinstance(calls[-1].arguments, dict):
                n = int(calls[-1].arguments["n"]) + 1
                break
        if n < self.rounds:
            return ScriptedResponse(blocks=[stead.ToolCall("fetch", {"n": n})], report_usage=False)
        return ScriptedResponse(blocks=[stead.Text(f"done after {n} rounds")], report_usage=False)


async def run(rounds: int, window: int, result_chars: int, compact: bool) -> dict[str, Any]:
    @stead.tool
    async def fetch(n: int) -> str:
        "Fetch page n."
        words = " ".join(f"line {i} of page-{n}: value {i * 7919 % 10007}" for i in range(result_chars // 30))
        return f"page-{n} " + words[:result_chars]

    # without compaction the server still answers every request, so the point where a real one would
    # have refused (and every later request with it) is measured, not hit
    server = Server(window, rounds, result_chars, enforce=compact)
    with tempfile.TemporaryDirectory() as d:
        async with await stead.open(
            f"sqlite:///{d}/bench.db", providers={"m": server.provider}, tools=[fetch]
        ) as system:
            agent = await system.create(
                provider="m",
                tools=["fetch"],
                context_window=window if compact else None,
                context=None if compact else {"auto": False},
            )
            t0 = time.perf_counter()
            result = await agent.run("Fetch the pages one by one.")
            elapsed = time.perf_counter() - t0
            runs = await system.run(result.run_id)
            compactions = [s for s in runs.steps if s.type == "compaction"]
            spent = sum((s.duration or 0.0) for s in compactions)
    turns = len(server.provider.requests) - server.summaries - server.refused
    return {
        "completed": result.ok,
        "error": result.error,
        "rounds": min(turns, rounds + 1) - 1,
        "largest": server.largest,
        "sent": server.sent,
        "summary_sent": server.summary_sent,
        "compactions": len(compactions),
        "summaries": server.summaries,
        "refused": server.refused,
        "elapsed": elapsed,
        "failed_at": server.failed_at,
        "sent_before_failure": server.sent_before_failure,
        "compaction_seconds": spent,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--window", type=int, default=8000)
    ap.add_argument("--result-chars", type=int, default=3000)
    a = ap.parse_args()
    counter = "o200k_base (bpe-openai)" if _ENC is not None else "stead's estimate"
    print(
        f"{a.rounds} rounds, {a.result_chars:,}-character results, {a.window:,}-token window; "
        f"server counts {counter}"
    )
    on = asyncio.run(run(a.rounds, a.window, a.result_chars, True))
    off = asyncio.run(run(a.rounds, a.window, a.result_chars, False))
    print(
        f"with compaction:    completed={on['completed']} rounds={on['rounds']} "
        f"largest request={on['largest']:,} "
        f"(window {a.window:,}) compactions={on['compactions']} summary requests={on['summaries']} "
        f"refused={on['refused']} tokens sent={on['sent']:,} (summaries {on['summary_sent']:,})"
    )
    print(
        f"without compaction: the request of round {off['failed_at']} exceeds the window (a real server "
        f"refuses it and every later one: the conversation fails); tokens sent until then "
        f"{off['sent_before_failure']:,}; all {a.rounds} rounds would send {off['sent']:,} tokens, "
        f"the largest request {off['largest']:,}"
    )
    per = on["rounds"] or 1
    print(
        f"overhead per round: {on['compaction_seconds'] / per * 1000:.2f} ms compaction wall time "
        f"(of {on['elapsed'] / per * 1000:.2f} ms per round), "
        f"{on['summary_sent'] / per:,.0f} summary-request tokens"
    )


if __name__ == "__main__":
    main()
