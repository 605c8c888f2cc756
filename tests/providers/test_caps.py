"""Issue 25: every model request carries an output cap (MR1), a response cut by it is recorded as `length`
(MR2), and the retry budget can be a number of seconds (MR3) — through the kernel, against the fake OpenAI
and Anthropic servers on 127.0.0.1 reached through the catalog (`openai-compatible:…@URL`,
`openai:…@URL`, `anthropic:…@URL`), which record every request's `max_tokens` / `max_completion_tokens`."""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from stead.core.compaction import DEFAULT_MAX_OUTPUT
from stead.messages import Text
from tests.fakes import RUNAWAY_WORD, FakeServer, Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.openai_server import OpenAIFakeServer

FAST = stead.RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


def _compatible(server: OpenAIFakeServer) -> str:
    return f"openai-compatible:local-model@{server.base_url}"


async def test_MR1_every_request_carries_an_output_cap(tmp_path: Path, oai: OpenAIFakeServer) -> None:
    """A turn of a model the catalog does not know gets the default cap, never more than the window minus
    the request; a summary request (compaction) gets its own budget; the agent's cap wins and is durable."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    async with await stead.open(url, retry=FAST) as system:
        roomy = await system.create(model=_compatible(oai))
        oai.push(Reply([Text("hi")]))
        await roomy.run("hello")
        assert oai.caps == [DEFAULT_MAX_OUTPUT]  # no window known: the default, sent as max_tokens
        assert "max_completion_tokens" not in oai.requests[-1].body

        # a 4,000-token window and a long message: the cap is the room left, not the default
        small = await system.create(model=_compatible(oai), context_window=4_000)
        oai.push(Reply([Text("ok")]))
        await small.run("word " * 1_500)
        cap = oai.caps[-1]
        assert cap is not None and 256 <= cap <= 4_000 - 1_000

        # compaction: the summary request gets the summary budget (window / 8 = 500, plus the half the clip
        # tolerates), the turn after it the room left in the window
        oai.push(Reply([Text("the summary")]), Reply([Text("after")]))
        await small.compact()
        summary = next(r for r in reversed(oai.requests) if "running summary" in str(r.body["messages"][0]))
        assert summary.body["max_tokens"] == 750
        await small.run("and now?")
        assert oai.caps[-1] is not None and oai.caps[-1] > cap  # the history shrank: more room

        capped = await system.create(model=_compatible(oai), max_output_tokens=123)
        oai.push(Reply([Text("short")]))
        await capped.run("hello")
        assert oai.caps[-1] == 123
    async with await stead.open(url, retry=FAST) as system:  # another process: the cap is durable
        again = await system.get(capped.id)
        oai.push(Reply([Text("again")]))
        await again.run("once more")
        assert oai.caps[-1] == 123


async def test_MR1_the_catalog_limit_is_sent_the_way_each_vendor_expects(
    tmp_path: Path, oai: OpenAIFakeServer, ant: AnthropicFakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI's own API gets `max_completion_tokens` (its reasoning models refuse `max_tokens`), Anthropic
    `max_tokens`; both the catalog's output limit of the model."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    async with await stead.open(f"sqlite:///{tmp_path / 'a.db'}", retry=FAST) as system:
        gpt = await system.create(model=f"openai:gpt-4.1-mini@{oai.base_url}")
        claude = await system.create(model=f"anthropic:claude-haiku-4-5@{ant.url}")
        oai.push(Reply([Text("hi")]))
        ant.push(Reply([Text("hi")]))
        await gpt.run("hello")
        await claude.run("hello")
    assert oai.requests[-1].body["max_completion_tokens"] == 32_768
    assert "max_tokens" not in oai.requests[-1].body
    assert ant.requests[-1].body["max_tokens"] == 64_000


async def test_MR1_a_definition_sets_the_cap(tmp_path: Path, oai: OpenAIFakeServer) -> None:
    (tmp_path / "agent.yaml").write_text(
        f"name: brief\nmodel: {_compatible(oai)}\ncontext:\n  max_output_tokens: 77\n", encoding="utf-8"
    )
    async with await stead.open(f"sqlite:///{tmp_path / 'a.db'}", definitions=tmp_path, retry=FAST) as system:
        agent = await system.create(definition="brief")
        oai.push(Reply([Text("hi")]))
        await agent.run("hello")
    assert oai.caps == [77]


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_MR2_a_response_cut_by_the_cap_is_recorded_as_length(
    vendor: str,
    tmp_path: Path,
    oai: OpenAIFakeServer,
    ant: AnthropicFakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that streams until stopped honours the cap; the response is recorded `length`: in the
    history (the message's metadata) and in the run record (the prompt step's reason)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    server: FakeServer = oai if vendor == "openai" else ant
    model = _compatible(oai) if vendor == "openai" else f"anthropic:claude-haiku-4-5@{ant.url}"
    async with await stead.open(f"sqlite:///{tmp_path / 'a.db'}", retry=FAST) as system:
        agent = await system.create(model=model, max_output_tokens=40)
        server.push(Reply(runaway=True))
        result = await agent.run("talk forever")
        assert server.caps == [40]
        assert result.text == RUNAWAY_WORD * 40  # the server stopped at the cap
        last = (await agent.history())[-1]
        assert last.role == "assistant" and last.metadata == {"finish_reason": "length"}
        run = await system.run(result.run_id)
        prompts = [s for s in run.steps if s.type == "prompt"]
        assert [s.output["reason"] for s in prompts] == ["length"]
        # a response that stopped by itself is not marked
        server.push(Reply([Text("done")]))
        await agent.run("stop now")
        assert (await agent.history())[-1].metadata is None


def test_MR3_retry_policy_budget_by_elapsed_time() -> None:
    """`max_elapsed` replaces the count of attempts: retries go on until the deadline, the last delay is
    shortened to land on it, and past it the request fails."""
    counted = stead.RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=1.0)
    assert counted.next_delay(2, 0.0) is not None and counted.next_delay(3, 0.0) is None
    timed = stead.RetryPolicy(max_attempts=3, base_delay=1.0, max_delay=1.0, max_elapsed=20.0)
    assert timed.next_delay(50, 5.0) is not None  # far more attempts than max_attempts
    assert timed.next_delay(50, 19.75) == 0.25  # the last delay lands on the deadline
    assert timed.next_delay(50, 20.0) is None
    late = timed.next_delay(5_000, 1.0)  # hours of attempts: the backoff stays within max_delay
    assert late is not None and 0.5 <= late <= 1.0
    with pytest.raises(ValueError):
        stead.RetryPolicy(max_elapsed=-1)


async def test_MR3_the_kernel_retries_until_max_elapsed(tmp_path: Path, oai: OpenAIFakeServer) -> None:
    """More failures than `max_attempts` allows, inside `max_elapsed`: the turn completes; with no time
    budget left (`max_elapsed=0`), the first failure fails the turn."""
    overloaded = [Reply(status=503) for _ in range(8)]
    patient = stead.RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02, max_elapsed=60)
    async with await stead.open(f"sqlite:///{tmp_path / 'a.db'}", retry=patient) as system:
        agent = await system.create(model=_compatible(oai))
        oai.push(*overloaded, Reply([Text("finally")]))
        result = await agent.run("hello")
        assert result.text == "finally" and len(oai.requests) == 9
    impatient = stead.RetryPolicy(max_attempts=5, base_delay=0.01, max_delay=0.02, max_elapsed=0)
    async with await stead.open(f"sqlite:///{tmp_path / 'b.db'}", retry=impatient) as system:
        agent = await system.create(model=_compatible(oai))
        oai.push(Reply(status=503), Reply([Text("too late")]))
        result = await agent.run("hello")
        assert result.error is not None and "503" in result.error
        assert len(oai.requests) == 10  # one attempt only
