"""Usage and cost per inference through the kernel, against the catalog prices (issue #3).

cost = (fresh input · input + cached input · cached_input + output · output) / 1e6 USD, where fresh input is
the input minus its prompt-cache reads (`catalog.Prices.cost`). The drivers price each inference with their
route's prices; the kernel carries the usage on `Done` events and on the assistant message in history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import stead
from stead.messages import Text, ToolCall, Usage
from stead.providers.catalog import Prices, cost, load_catalog, resolve
from tests.fakes import Reply
from tests.fakes.anthropic_server import AnthropicFakeServer
from tests.fakes.openai_server import OpenAIFakeServer
from tests.providers.test_kernel_providers import FAST, ask, lookup

pytestmark = pytest.mark.usefixtures("fake_api_keys")


def by_hand(prices: Prices, usage: Usage) -> float:
    cached_rate = prices.input if prices.cached_input is None else prices.cached_input
    fresh = usage.input_tokens - usage.cached_tokens
    return (
        fresh * prices.input + usage.cached_tokens * cached_rate + usage.output_tokens * prices.output
    ) / 1e6


def test_prices_cost_formula() -> None:
    prices = Prices(input=0.40, output=1.60, cached_input=0.10)
    usage = Usage(input_tokens=1200, output_tokens=300, cached_tokens=200)
    assert prices.cost(usage) == pytest.approx((1000 * 0.40 + 200 * 0.10 + 300 * 1.60) / 1e6)
    assert Prices(input=1.0, output=2.0).cost(usage) == pytest.approx((1200 * 1.0 + 300 * 2.0) / 1e6)
    # cached tokens beyond the input are clamped
    assert prices.cost(Usage(10, 0, 50)) == pytest.approx(10 * 0.10 / 1e6)
    assert cost("openai:gpt-4.1-mini", usage) == pytest.approx(prices.cost(usage))
    assert cost("openai:some-new-model", usage) is None  # an unlisted model has no price


CASES = [
    ("openai", "gpt-4.1-mini"),
    ("anthropic", "claude-haiku-4-5"),
]


@pytest.mark.parametrize("vendor,model", CASES)
async def test_cost_per_inference_matches_catalog_prices(
    vendor: str, model: str, oai: OpenAIFakeServer, ant: AnthropicFakeServer, db_url: str
) -> None:
    server = oai if vendor == "openai" else ant
    spec = f"{vendor}:{model}@{server.base_url}"
    prices = load_catalog().models[model].prices
    assert prices is not None
    first = Usage(input_tokens=1200, output_tokens=300, cached_tokens=200)
    second = Usage(input_tokens=1600, output_tokens=45, cached_tokens=1100)
    server.push(
        Reply([ToolCall("lookup", {"city": "Kyoto"})], usage=first),
        Reply([Text("Kyoto is sunny.")], usage=second),
    )
    async with await stead.open(db_url, retry=FAST, tools=[lookup]) as system:
        agent = await system.create(model=spec, tools=["lookup"])
        watch = await ask(agent, "Kyoto?")
        history = await agent.history()
    expected = [
        Usage(u.input_tokens, u.output_tokens, u.cached_tokens, by_hand(prices, u)) for u in (first, second)
    ]
    # on each Done event of the turn (one per inference that ended a response) and on the usage events
    assert [e.usage for e in watch.of(stead.UsageEvent)] == pytest.approx(expected)
    dones = watch.of(stead.Done)
    assert dones[-1].usage == pytest.approx(expected[-1])
    # on each assistant message in history
    assistant = [m for m in history if m.role == "assistant"]
    assert [m.usage for m in assistant] == pytest.approx(expected)
    for m, u in zip(assistant, (first, second), strict=True):
        assert m.usage is not None and m.usage.cost == pytest.approx(cost(resolve(spec), u))
    total = sum(m.usage.cost for m in assistant if m.usage is not None and m.usage.cost is not None)
    assert total == pytest.approx(by_hand(prices, first) + by_hand(prices, second))


async def test_overridden_prices_apply(
    oai: OpenAIFakeServer, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tmp_path / "prices.yaml"
    catalog.write_text("models:\n  gpt-4.1-mini:\n    prices: {input: 1.0}\n")
    monkeypatch.setenv("STEAD_CATALOG", str(catalog))
    usage = Usage(input_tokens=2000, output_tokens=100, cached_tokens=500)
    oai.push(Reply([Text("ok")], usage=usage))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model=f"openai:gpt-4.1-mini@{oai.base_url}")
        await ask(agent, "hi")
        (_, answer) = await agent.history()
    # input overridden; output and cached_input merged from the shipped entry
    assert answer.usage == Usage(2000, 100, 500, pytest.approx((1500 * 1.0 + 500 * 0.10 + 100 * 1.60) / 1e6))


async def test_local_server_through_a_catalog_vendor_with_prices(
    oai: OpenAIFakeServer, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog file can declare an OpenAI-compatible vendor (base URL, no key) and price its models."""
    catalog = tmp_path / "local.yaml"
    catalog.write_text(
        "vendors:\n"
        f"  lab:\n    driver: openai-compatible\n    base_url: {oai.base_url}\n"
        "models:\n"
        "  lab-llama:\n    vendor: lab\n    power: 10\n    context: 8192\n"
        "    prices: {input: 0.5, output: 0.5}\n"
    )
    monkeypatch.setenv("STEAD_CATALOG", str(catalog))
    monkeypatch.delenv("OPENAI_API_KEY")
    oai.push(Reply([Text("local")], usage=Usage(400, 100)))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model="lab-llama")
        watch = await ask(agent, "hi")
    (done,) = watch.of(stead.Done)
    assert done.usage == Usage(400, 100, 0, pytest.approx(500 * 0.5 / 1e6))
    assert oai.requests[-1].body["model"] == "lab-llama"
    assert oai.requests[-1].headers["authorization"] != "Bearer sk-test"  # the OpenAI key stays home


async def test_unpriced_model_has_usage_without_cost(oai: OpenAIFakeServer, db_url: str) -> None:
    oai.push(Reply([Text("ok")], usage=Usage(10, 5)))
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model=f"openai-compatible:llama3.2@{oai.base_url}")
        await ask(agent, "hi")
        (_, answer) = await agent.history()
    assert answer.usage == Usage(10, 5, 0, None)


async def test_failed_inference_keeps_no_measurement(oai: OpenAIFakeServer, db_url: str) -> None:
    """S4: a retried (failed) inference records no usage; only the completed one counts."""
    oai.push(
        Reply([Text("cut text")], chunk=2, cut_after=3, usage=Usage(999, 999)),
        Reply([Text("ok")], usage=Usage(100, 10)),
    )
    async with await stead.open(db_url, retry=FAST) as system:
        agent = await system.create(model=f"openai:gpt-4.1-mini@{oai.base_url}")
        watch = await ask(agent, "hi")
        history = await agent.history()
    assert [m.usage for m in history if m.role == "assistant"] == [
        Usage(100, 10, 0, pytest.approx((100 * 0.40 + 10 * 1.60) / 1e6))
    ]
    assert [e.usage.input_tokens for e in watch.of(stead.UsageEvent)] == [100]
