"""The model router (one grammar for every model string) and the driver registry, unit by unit.

End to end through definitions, `create`, `send` and the command line: tests/providers/test_model_strings.py.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import stead.providers
from stead.cli._models import check_model, model_rows
from stead.errors import ConfigurationError, ProviderError
from stead.providers import _errors
from stead.providers.catalog import DRIVER_KINDS, load_catalog, make_provider, parse_model, resolve
from stead.providers.drivers import DRIVERS, driver
from stead.providers.router import CATALOG, SCRIPTED_FILE, ModelRouter, parse_spec
from stead.providers.scripted import ScriptedProvider

SCRIPT = "scripted: true\nrules:\n  - responses:\n      - text: hi\n"
PROVIDERS = Path(stead.providers.__file__).parent


def scripted() -> ScriptedProvider:
    return ScriptedProvider(lambda r: [])


# -------------------------------------------------------------------------------------------- the grammar
@pytest.mark.parametrize(
    ("spec", "kind", "provider", "model"),
    [
        ("mine:any", "registered", "mine", "any"),
        ("mine:qwen2.5:7b", "registered", "mine", "qwen2.5:7b"),
        ("openai:gpt-4.1-mini", "catalog", CATALOG, "openai:gpt-4.1-mini"),
        ("ollama:llama3.2", "catalog", CATALOG, "ollama:llama3.2"),
        ("openai-compatible:m@http://h:1/v1", "catalog", CATALOG, "openai-compatible:m@http://h:1/v1"),
        ("anthropic:claude-sonnet-9@http://h:2", "catalog", CATALOG, "anthropic:claude-sonnet-9@http://h:2"),
        ("claude-haiku-4-5", "catalog", CATALOG, "claude-haiku-4-5"),
        ("  gpt-4.1  ", "catalog", CATALOG, "gpt-4.1"),
    ],
)
def test_model_string_grammar(spec: str, kind: str, provider: str, model: str) -> None:
    parsed = parse_spec(spec, registered=["mine"])
    assert (parsed.kind, parsed.provider, parsed.model) == (kind, provider, model)
    assert (parsed.route is not None) == (kind == "catalog")


def test_scripted_file_is_relative_to_base_dir_and_stored_absolute(tmp_path: Path) -> None:
    parsed = parse_spec("scripted:models/a.yaml", base_dir=tmp_path)
    assert (parsed.kind, parsed.provider) == ("scripted", SCRIPTED_FILE)
    assert parsed.path == (tmp_path / "models" / "a.yaml").resolve()
    assert parsed.model == f"scripted:{parsed.path}"
    assert parse_spec(f"scripted:{tmp_path}/b.yaml").path == (tmp_path / "b.yaml").resolve()


def test_a_registered_prefix_wins_over_a_catalog_vendor_and_scripted() -> None:
    assert parse_spec("openai:gpt-4.1", registered=["openai"]).provider == "openai"
    assert parse_spec("scripted:demo", registered=["scripted"]).model == "demo"


def test_a_bare_catalog_name_may_contain_a_colon(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  qwen2.5:7b:\n    vendor: ollama\n")
    parsed = parse_spec("qwen2.5:7b", catalog=load_catalog(path))
    assert parsed.route is not None and (parsed.route.vendor, parsed.route.model) == ("ollama", "qwen2.5:7b")


def test_within_a_registered_provider_bare_names_and_unknown_prefixes_are_its_models() -> None:
    assert parse_spec("qwen2.5:7b", registered=["local"], within="local").model == "qwen2.5:7b"
    assert parse_spec("gpt-4.1-mini", registered=["local"], within="local").provider == "local"
    assert parse_spec("anthropic:claude-haiku-4-5", registered=["local"], within="local").provider == CATALOG


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("acme:x", "unknown provider 'acme' in 'acme:x'; known: registered providers: mine;"),
        ("gpt-nope", "unknown model 'gpt-nope': not a model of the catalog"),
        ("", "empty model name"),
        ("mine:", "no model name after 'mine:'"),
        ("scripted:", "no file after 'scripted:'"),
        ("openai-compatible:llama3.2", "needs a base URL"),
        ("openai:gpt-4.1@", "nothing after '@'"),
    ],
)
def test_what_the_grammar_refuses(spec: str, error: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_spec(spec, registered=["mine"])
    assert error in str(info.value)


def test_unknown_names_suggest_what_makes_sense() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_model("nosuchvendor:foo")
    message = str(info.value)
    assert "unknown vendor 'nosuchvendor'" in message and "openai:nosuchvendor" not in message
    assert "known vendors: anthropic, ollama, openai, openai-compatible" in message
    with pytest.raises(ConfigurationError) as info:
        parse_spec("gpt-nope", registered=["mine"])
    message = str(info.value)
    assert "e.g. openai:gpt-nope or openai-compatible:gpt-nope@http://host:port/v1" in message
    assert "registered providers: mine" in message


# -------------------------------------------------------------------------------------------- resolve
def test_resolve_stores_the_chosen_candidate() -> None:
    router = ModelRouter({"mine": scripted()}, env={})
    chosen = router.resolve(["openai:gpt-4.1-mini", "anthropic:claude-haiku-4-5", "mine:any", "ollama:x"])
    assert (chosen.provider, chosen.model, chosen.index) == ("mine", "any", 2)
    chosen = router.resolve(["gpt-4.1-mini", "ollama:llama3.2"])
    assert (chosen.provider, chosen.model, chosen.index) == (CATALOG, "ollama:llama3.2", 1)


def test_resolve_a_single_unusable_string_names_it_and_what_to_set() -> None:
    router = ModelRouter({}, env={})
    with pytest.raises(ConfigurationError) as info:
        router.resolve("openai:gpt-4.1-mini")
    assert str(info.value) == "openai:gpt-4.1-mini cannot be used: no API key for openai: set OPENAI_API_KEY"


def test_resolve_with_an_explicit_provider() -> None:
    router = ModelRouter({"p": scripted()}, env={"OPENAI_API_KEY": "k"})
    assert router.resolve("anthropic:anything", provider="p").settings() == {
        "provider": "p",
        "model": "anthropic:anything",  # a registered provider's model names are its own
    }
    assert router.resolve(provider="p").model == "default"
    assert router.resolve("gpt-4.1", provider=CATALOG).settings() == {"provider": CATALOG, "model": "gpt-4.1"}
    with pytest.raises(ConfigurationError, match="takes catalog model strings"):
        router.resolve("p:x", provider=CATALOG)
    with pytest.raises(ConfigurationError, match="unknown provider 'nope'; known: registered providers: p;"):
        router.resolve("x", provider="nope")


def test_the_default_model_rule() -> None:
    assert ModelRouter({"only": scripted()}, env={}).default().settings() == {
        "provider": "only",
        "model": "default",
    }
    with pytest.raises(ConfigurationError, match=r"registered providers \(a, b\)"):
        ModelRouter({"a": scripted(), "b": scripted()}, env={}).default()
    top = resolve(None, {"ANTHROPIC_API_KEY": "k"})
    chosen = ModelRouter({}, env={"ANTHROPIC_API_KEY": "k"}).default()
    assert chosen.settings() == {"provider": CATALOG, "model": f"anthropic:{top.model}"}
    with pytest.raises(ConfigurationError, match=r"model=.*set ANTHROPIC_API_KEY or OPENAI_API_KEY"):
        ModelRouter({}, env={}).default()


# -------------------------------------------------------------------------------------------- serving
async def test_provider_for_builds_each_route_once_and_loads_scripted_files_lazily(tmp_path: Path) -> None:
    router = ModelRouter({}, env={})
    local = {"provider": CATALOG, "model": "ollama:llama3.2"}
    first = router.provider_for(local)
    assert first is not None and router.provider_for(dict(local)) is first
    assert router.provider_for({"provider": CATALOG, "model": "openai:gpt-4.1"}) is None  # no key
    script = tmp_path / "s.yaml"
    for name in (SCRIPTED_FILE, "scripted/some-definition"):
        assert router.provider_for({"provider": name, "model": f"scripted:{script}"}) is None  # not yet
    script.write_text(SCRIPT)
    served = router.provider_for({"provider": SCRIPTED_FILE, "model": f"scripted:{script}"})
    assert isinstance(served, ScriptedProvider)
    assert (
        router.provider_for({"provider": "scripted/some-definition", "model": f"scripted:{script}"}) is served
    )
    assert (
        router.provider_for({"provider": SCRIPTED_FILE, "model": "scripted:s.yaml"}) is None
    )  # not absolute
    assert router.provider_for({"provider": "mine", "model": f"scripted:{script}"}) is None  # not a script's
    await router.aclose()


# ------------------------------------------------------------------------------------ the driver registry
def test_the_driver_registry_is_the_one_table_of_drivers() -> None:
    assert DRIVER_KINDS == tuple(DRIVERS) == ("openai", "anthropic", "openai-compatible")
    assert stead.providers.OpenAIProvider is DRIVERS["openai"].load() is DRIVERS["openai-compatible"].load()
    assert stead.providers.AnthropicProvider is DRIVERS["anthropic"].load()
    with pytest.raises(ConfigurationError, match="driver kinds: openai, anthropic, openai-compatible"):
        driver("grpc")


def test_catalog_router_and_cli_ask_the_driver_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A driver whose package is missing is unusable everywhere at once: in the catalog's resolution, the
    router, `stead models` and `--model`."""
    path = tmp_path / "models.yaml"  # an ollama model, so `stead models` has a row for the vendor
    path.write_text("models:\n  llama3.2:\n    vendor: ollama\n")
    missing = dataclasses.replace(DRIVERS["openai-compatible"], package="stead_test_not_installed")
    monkeypatch.setitem(DRIVERS, "openai-compatible", missing)  # type: ignore[index]
    install = "pip install 'stead[stead_test_not_installed]'"
    with pytest.raises(ConfigurationError, match=re.escape(install)):
        resolve("ollama:llama3.2", {})
    assert ModelRouter({}, env={}).unusable("ollama:llama3.2") == (
        f"the openai-compatible driver needs the 'stead_test_not_installed' package: {install}"
    )
    with pytest.raises(ConfigurationError, match=f"--model ollama:llama3.2: .*{re.escape(install)}"):
        check_model("ollama:llama3.2", {})
    rows = {r.vendor: r for r in model_rows(load_catalog(path), {"OPENAI_API_KEY": "k"})}
    assert rows["openai"].usable and (rows["ollama"].usable, rows["ollama"].why) == (False, install)
    with pytest.raises(ConfigurationError, match=re.escape(install)):
        make_provider(parse_model("openai-compatible:m@http://h/v1"), {})


def test_the_drivers_import_neither_the_catalog_nor_the_registry() -> None:
    """The catalog ↔ driver cycle is broken: the drivers import what they share with the catalog (prices,
    wire names) from modules below both."""
    for name in ("openai.py", "anthropic.py"):
        tree = ast.parse((PROVIDERS / name).read_text())
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        above = {"stead.providers.catalog", "stead.providers.drivers", "stead.providers.router"}
        assert not imported & above, (name, imported & above)


# -------------------------------------------------------------------------------------------- error lines
def test_a_connection_that_cannot_be_made_names_the_url_in_one_line() -> None:
    local = _errors.connection_failed("ollama", "http://127.0.0.1:11434/v1", OSError("refused\n  twice"))
    assert (
        str(local)
        == "ollama: connection failed to http://127.0.0.1:11434/v1 (refused twice): is the server running?"
    )
    assert local.retryable
    remote = _errors.connection_failed("openai", "https://api.openai.com", None)
    assert str(remote) == "openai: connection failed to https://api.openai.com: check the network and the URL"
    assert isinstance(remote, ProviderError)
