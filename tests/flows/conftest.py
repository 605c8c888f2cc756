"""Fixtures of the flow tests: fresh tool counters and a directory for definitions (with a placeholder model
file that tests replace with `providers={"scripted/NAME": prompt_model(...)}`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stead
from stead.tools.context import CallKV
from tests.fakes import flows as F


@pytest.fixture(autouse=True)
def flow_state() -> Iterator[None]:
    F.reset()
    yield
    F.reset()


@pytest.fixture
def team(tmp_path: Path) -> Path:
    directory = tmp_path / "team"
    F.write(directory, "model.yaml", F.PLACEHOLDER_MODEL)
    return directory


@pytest.fixture
async def ctx(db_url: str) -> Any:
    """A tool context of a `run_pipeline` call of agent `a0` on a fresh system (pipelines run directly)."""
    async with await stead.open(db_url) as system:
        yield stead.ToolContext(
            call_id="c0",
            tool_name="run_pipeline",
            agent_id="a0",
            run_id=None,
            permission_mode="auto",
            kv=CallKV(system.store, "a0", "c0"),
            store=system.store,
        )
