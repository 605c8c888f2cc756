"""The real-model lane (issue 24, item 2): stead against a real llama.cpp server with a small model.

Every test here is marked `realllm` and skipped unless `STEAD_TEST_LLM_URL` names an OpenAI-compatible
server (`export STEAD_TEST_LLM_URL=$(scripts/local-llm)`), so CI — which sets no such variable — skips them.
`STEAD_TEST_LLM_MODEL` names the model in reports (default `smollm2`); the server serves whatever it loaded.
The kill-and-restart test starts its own server with the helpers of `scripts/local-llm` (the binary from
`STEAD_LLAMA_SERVER`, or the one that script built and cached).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-llm"
URL = os.environ.get("STEAD_TEST_LLM_URL", "").rstrip("/")
MODEL = os.environ.get("STEAD_TEST_LLM_MODEL", "smollm2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(
        reason="set STEAD_TEST_LLM_URL (scripts/local-llm prints one) to run the real-model lane"
    )
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.realllm)
            if not URL:
                item.add_marker(skip)


def local_llm() -> ModuleType:
    """`scripts/local-llm`, imported for its helpers (`start`, `ensure_model`, `binary_path`)."""
    loader = importlib.machinery.SourceFileLoader("stead_local_llm", str(SCRIPT))
    spec = importlib.util.spec_from_loader("stead_local_llm", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def model() -> str:
    """The model string of the server under test."""
    return f"openai-compatible:{MODEL}@{URL}"


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/real.db"
