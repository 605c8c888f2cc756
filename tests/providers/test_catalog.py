"""The model catalog: loading and overriding, model strings, resolution, cost, compatibility, drivers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stead.errors import ConfigurationError
from stead.messages import Text, Usage
from stead.providers.anthropic import AnthropicProvider
from stead.providers.base import BlockEnd, Done, UsageEvent
from stead.providers.catalog import (
    Prices,
    Route,
    compatible,
    cost,
    load_catalog,
    make_provider,
    parse_model,
    resolve,
)
from stead.providers.openai import OpenAIProvider
from tests.fakes import Reply
from tests.fakes.openai_server import OpenAIFakeServer
from tests.providers.conftest import collect

OPENAI = {"OPENAI_API_KEY": "sk-test"}
ANTHROPIC = {"ANTHROPIC_API_KEY": "sk-ant-test"}
BOTH = {**OPENAI, **ANTHROPIC}


# -- the shipped catalog ------------------------------------------------------------------------------------


def test_shipped_catalog_is_valid() -> None:
    catalog = load_catalog()
    assert catalog.vendors["openai"].driver == "openai"
    assert catalog.vendors["openai"].key_env == "OPENAI_API_KEY"
    assert catalog.vendors["anthropic"].driver == "anthropic"
    assert catalog.vendors["anthropic"].key_env == "ANTHROPIC_API_KEY"
    assert catalog.vendors["ollama"].driver == "openai-compatible"
    assert catalog.vendors["ollama"].key_required is False
    for model in catalog.models.values():
        assert model.vendor in catalog.vendors
        assert model.prices is not None and model.prices.input > 0 and model.prices.output > 0
        assert model.context_window and model.context_window > 0
    assert catalog.models["gpt-realtime"].realtime is True


def test_by_power_is_ordered_and_skips_realtime() -> None:
    catalog = load_catalog()
    ranked = catalog.by_power()
    assert [m.power for m in ranked] == sorted((m.power for m in ranked), reverse=True)
    assert all(not m.realtime for m in ranked)
    assert [m.name for m in catalog.by_power(realtime=True)] == ["gpt-realtime"]


# -- model strings ------------------------------------------------------------------------------------------


def test_vendor_prefixed_model() -> None:
    route = parse_model("openai:gpt-4.1-mini")
    assert (route.vendor, route.driver, route.model, route.key_env) == (
        "openai",
        "openai",
        "gpt-4.1-mini",
        "OPENAI_API_KEY",
    )
    assert route.base_url is None
    assert route.prices == Prices(0.40, 1.60, 0.10)
    assert route.context_window == 1047576
    assert str(route) == "openai:gpt-4.1-mini"


def test_bare_model_uses_the_catalog_vendor() -> None:
    route = parse_model("claude-sonnet-4-6")
    assert (route.vendor, route.driver, route.key_env) == ("anthropic", "anthropic", "ANTHROPIC_API_KEY")
    assert route.prices == Prices(3.0, 15.0, 0.30)


def test_vendor_prefixed_model_not_in_catalog_has_no_price() -> None:
    route = parse_model("anthropic:claude-sonnet-9")
    assert route.driver == "anthropic" and route.model == "claude-sonnet-9"
    assert route.prices is None and route.power is None


def test_openai_compatible_model_with_url() -> None:
    route = parse_model("openai-compatible:llama3.2@http://localhost:11434/v1")
    assert route.driver == "openai-compatible"
    assert route.model == "llama3.2"
    assert route.base_url == "http://localhost:11434/v1"
    assert route.key_required is False
    assert str(route) == "openai-compatible:llama3.2@http://localhost:11434/v1"


def test_model_names_may_contain_colons() -> None:
    route = parse_model("ollama:qwen2.5:7b-instruct")
    assert (route.vendor, route.model, route.base_url) == (
        "ollama",
        "qwen2.5:7b-instruct",
        "http://localhost:11434/v1",
    )
    other = parse_model("openai-compatible:llama3.2:3b@http://gpu-box:8000/v1")
    assert (other.model, other.base_url) == ("llama3.2:3b", "http://gpu-box:8000/v1")


def test_url_overrides_a_vendor_endpoint() -> None:
    route = parse_model("openai:gpt-4.1-mini@http://proxy.internal/v1")
    assert route.base_url == "http://proxy.internal/v1"
    assert route.prices is not None


def test_openai_compatible_needs_a_url() -> None:
    with pytest.raises(ConfigurationError, match="needs a base URL"):
        parse_model("openai-compatible:llama3.2")


def test_unknown_bare_model() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown model 'gpt-nope'.*openai:gpt-nope"):
        parse_model("gpt-nope")


@pytest.mark.parametrize("spec", ["", "   ", "openai:", "openai-compatible:@", "openai:gpt-4.1@"])
def test_malformed_model_strings(spec: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_model(spec)


# -- resolution ---------------------------------------------------------------------------------------------


def test_resolve_explicit() -> None:
    route = resolve("openai:gpt-4.1-mini", OPENAI)
    assert route == parse_model("openai:gpt-4.1-mini")


def test_resolve_bare_name() -> None:
    assert resolve("gpt-4.1-mini", OPENAI).vendor == "openai"


def test_resolve_walks_candidates_in_order() -> None:
    candidates = ["anthropic:claude-sonnet-4-6", "gpt-nope", "openai:gpt-4.1-mini", "openai:gpt-5.4"]
    route = resolve(candidates, OPENAI)
    assert route.model == "gpt-4.1-mini"
    assert resolve(candidates, BOTH).model == "claude-sonnet-4-6"


def test_resolve_missing_key_names_the_env_var() -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve("anthropic:claude-sonnet-4-6", {})
    message = str(info.value)
    assert "anthropic:claude-sonnet-4-6" in message
    assert "set ANTHROPIC_API_KEY" in message


def test_resolve_failure_lists_every_candidate_and_why() -> None:
    candidates = ["anthropic:claude-haiku-4-5", "gpt-nope", "openai-compatible:llama3.2", "openai:gpt-5.4"]
    with pytest.raises(ConfigurationError) as info:
        resolve(candidates, {"ANTHROPIC_API_KEY": ""})
    lines = str(info.value).splitlines()
    assert lines[0] == "none of the models given can be used:"
    assert lines[1] == "  - anthropic:claude-haiku-4-5: no API key for anthropic: set ANTHROPIC_API_KEY"
    assert lines[2].startswith("  - gpt-nope: unknown model 'gpt-nope'")
    assert lines[3].startswith("  - openai-compatible:llama3.2: ") and "base URL" in lines[3]
    assert lines[4] == "  - openai:gpt-5.4: no API key for openai: set OPENAI_API_KEY"


def test_resolve_openai_compatible_needs_no_key() -> None:
    route = resolve("openai-compatible:llama3.2@http://localhost:11434/v1", {})
    assert route.driver == "openai-compatible" and route.base_url == "http://localhost:11434/v1"
    assert resolve("ollama:llama3.2", {}).base_url == "http://localhost:11434/v1"


def test_resolve_without_preference_takes_the_strongest_usable_model() -> None:
    catalog = load_catalog()
    strongest = catalog.by_power()
    top_openai = next(m.name for m in strongest if m.vendor == "openai")
    top_anthropic = next(m.name for m in strongest if m.vendor == "anthropic")
    assert resolve(None, OPENAI).model == top_openai
    assert resolve([], ANTHROPIC).model == top_anthropic
    assert resolve(None, BOTH).model == strongest[0].name


def test_resolve_without_preference_and_without_keys() -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve(None, {})
    message = str(info.value)
    assert message.startswith("no model of the catalog can be used:")
    for model in load_catalog().by_power():
        assert f"  - {model.name}: " in message
    assert "gpt-realtime" not in message
    assert "Set ANTHROPIC_API_KEY or OPENAI_API_KEY" in message
    assert "openai-compatible:llama3.2@http://localhost:11434/v1" in message


def test_resolve_never_picks_a_realtime_model_for_text() -> None:
    catalog = load_catalog(None)
    assert all(resolve(None, OPENAI, catalog=catalog).model != m for m in ("gpt-realtime",))
    assert resolve(None, OPENAI, realtime=True).model == "gpt-realtime"


def test_resolve_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    assert resolve("anthropic:claude-haiku-4-5").vendor == "anthropic"


# -- overriding the catalog ---------------------------------------------------------------------------------

OVERRIDE = """
vendors:
  together:
    driver: openai-compatible
    base_url: https://api.together.xyz/v1
    key_env: TOGETHER_API_KEY
    key_required: true
    priority: 5
models:
  gpt-4.1-mini:
    prices: {input: 0.30}
  gpt-5.5: null
  llama-3.3-70b:
    vendor: together
    power: 99
    context: 131072
    prices: {input: 0.88, output: 0.88}
"""


def test_user_catalog_merges_over_the_shipped_one(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(OVERRIDE)
    catalog = load_catalog(path)
    assert catalog.models["gpt-4.1-mini"].prices == Prices(0.30, 1.60, 0.10)  # one field overridden
    assert catalog.models["gpt-4.1-mini"].context_window == 1047576  # the rest kept
    assert "gpt-5.5" not in catalog.models
    assert catalog.models["llama-3.3-70b"].vendor == "together"
    assert "anthropic" in catalog.vendors
    # The shipped catalog itself is untouched.
    assert load_catalog().models["gpt-4.1-mini"].prices == Prices(0.40, 1.60, 0.10)

    # The new vendor needs its key; once set, its model (power 99) wins the walk.
    with pytest.raises(ConfigurationError, match="set TOGETHER_API_KEY"):
        resolve("llama-3.3-70b", {}, catalog=catalog)
    route = resolve(None, {**BOTH, "TOGETHER_API_KEY": "t"}, catalog=catalog)
    assert (route.vendor, route.driver, route.model) == ("together", "openai-compatible", "llama-3.3-70b")
    assert route.base_url == "https://api.together.xyz/v1"


def test_stead_catalog_env_var(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(OVERRIDE)
    route = resolve(None, {**BOTH, "TOGETHER_API_KEY": "t", "STEAD_CATALOG": str(path)})
    assert route.model == "llama-3.3-70b"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("models: [1, 2]", "'models' must be a mapping"),
        ("model:\n  x: {}", "unknown top-level keys"),
        ("vendors:\n  v: {driver: grpc}", "driver must be one of"),
        ("models:\n  m: {vendor: nobody}", "is not a vendor of the catalog"),
        ("models:\n  m: {vendor: openai, contex: 5}", "unknown fields"),
        ("models:\n  m: {vendor: openai, prices: {input: 1}}", "needs input and output"),
        ("models:\n  m: {vendor: openai, prices: {input: cheap, output: 1}}", "must be a number"),
        ("vendors: [", "invalid YAML"),
    ],
)
def test_bad_user_catalog(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=error) as info:
        load_catalog(path)
    assert str(path) in str(info.value)


def test_missing_user_catalog(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read model catalog"):
        load_catalog(tmp_path / "nope.yaml")


# -- cost ---------------------------------------------------------------------------------------------------


def test_cost_prices_cached_input_at_the_cached_rate() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cached_tokens=400_000)
    # gpt-4.1-mini: 0.40 input, 0.10 cached input, 1.60 output per million.
    expected = 0.6 * 0.40 + 0.4 * 0.10 + 1.0 * 1.60
    assert cost(parse_model("openai:gpt-4.1-mini"), usage) == pytest.approx(expected)
    assert cost("gpt-4.1-mini", usage) == pytest.approx(expected)
    assert cost("openai:gpt-4.1-mini", usage) == pytest.approx(expected)


def test_cost_of_a_small_request() -> None:
    usage = Usage(input_tokens=12_345, output_tokens=678, cached_tokens=10_000)
    # claude-haiku-4-5: 1.00 input, 0.10 cached, 5.00 output per million.
    expected = (2_345 * 1.00 + 10_000 * 0.10 + 678 * 5.00) / 1_000_000
    assert cost("claude-haiku-4-5", usage) == pytest.approx(expected)


def test_cost_without_cached_price_uses_the_input_price() -> None:
    prices = Prices(input=2.0, output=4.0)
    assert prices.cost(Usage(1_000_000, 0, 500_000)) == pytest.approx(2.0)


def test_cost_unknown() -> None:
    usage = Usage(100, 100)
    assert cost("openai:brand-new-model", usage) is None
    assert cost("not a model", usage) is None
    assert cost(Route("x", "openai-compatible", "m", base_url="http://h/v1"), usage) is None


def test_cost_of_nothing_is_zero() -> None:
    assert cost("gpt-4.1-mini", Usage()) == 0.0


# -- compatibility ------------------------------------------------------------------------------------------


def test_compatible() -> None:
    mini, big = parse_model("openai:gpt-4.1-mini"), parse_model("openai:gpt-5.4")
    haiku, sonnet = parse_model("claude-haiku-4-5"), parse_model("claude-sonnet-4-6")
    llama = parse_model("ollama:llama3.2")
    qwen = parse_model("ollama:qwen2.5")
    other_server = parse_model("openai-compatible:llama3.2@http://gpu:8000/v1")
    assert compatible(mini, big) is True
    assert compatible(haiku, sonnet) is True
    assert compatible(llama, qwen) is True
    assert compatible(mini, haiku) is False
    assert compatible(haiku, mini) is False
    assert compatible(mini, llama) is False  # same wire protocol, another vendor
    assert compatible(llama, other_server) is False
    assert compatible(None, mini) is False
    assert compatible(mini, None) is False
    assert compatible(None, None) is False


# -- drivers ------------------------------------------------------------------------------------------------


def test_make_provider_builds_the_driver() -> None:
    openai_driver = make_provider(resolve("openai:gpt-4.1-mini", OPENAI), OPENAI)
    assert isinstance(openai_driver, OpenAIProvider)
    assert openai_driver.model == "gpt-4.1-mini" and openai_driver.prices == Prices(0.40, 1.60, 0.10)

    anthropic_driver = make_provider(resolve("claude-haiku-4-5", ANTHROPIC), ANTHROPIC)
    assert isinstance(anthropic_driver, AnthropicProvider)
    assert anthropic_driver.model == "claude-haiku-4-5"

    local = make_provider(resolve("ollama:llama3.2", {}), {})
    assert isinstance(local, OpenAIProvider)
    assert local.base_url == "http://localhost:11434/v1" and local.name == "ollama"


def test_make_provider_without_key() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        make_provider(parse_model("openai:gpt-4.1-mini"), {})


async def test_resolved_route_streams_and_prices_usage(openai_server: OpenAIFakeServer) -> None:
    route = resolve(f"openai:gpt-4.1-mini@{openai_server.base_url}", OPENAI)
    provider = make_provider(route, OPENAI)
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cached_tokens=400_000)
    openai_server.push(Reply([Text("priced")], usage=usage))
    events = await collect(provider)
    assert openai_server.requests[-1].body["model"] == "gpt-4.1-mini"
    assert openai_server.requests[-1].headers["authorization"] == "Bearer sk-test"
    assert BlockEnd(Text("priced")) in events
    usage_event = events[-2]
    assert isinstance(usage_event, UsageEvent)
    assert usage_event.usage.cost == pytest.approx(cost(route, usage))
    assert events[-1] == Done("stop")
    assert isinstance(provider, OpenAIProvider)
    await provider.aclose()
