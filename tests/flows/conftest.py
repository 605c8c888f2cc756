"""Fixtures of the flow tests: fresh tool counters and a directory for definitions (with a placeholder model
file that tests replace with `providers={"scripted/NAME": prompt_model(...)}`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
