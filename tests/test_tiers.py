"""Public tiers (issue 8): `stead` (daily use), `stead.extend` (plugin authors), `stead.testing` (scripted
models, fault injection). Each tier's `__all__` is pinned and also derived from the module, so an accidental
new public name fails; each public class and function reports its tier as `__module__`; `import stead`
stays light.

The pins are `tests/api/stead.extend.txt` and `tests/api/stead.testing.txt`."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import stead
import stead.extend
import stead.testing

API = Path(__file__).parent / "api"


def pinned(tier: str) -> list[str]:
    """The pinned `__all__` of `tier`: `tests/api/<tier>.txt`, one name a line (a change to a tier is a
    change to that file, reviewed as such)."""
    return (API / f"{tier}.txt").read_text().split()


EXTEND = pinned("stead.extend")
TESTING = pinned("stead.testing")
TIERS = [stead, stead.extend, stead.testing]


def public_names(module: ModuleType) -> set[str]:
    """What a module actually exposes: every name not starting with `_` that is not a submodule."""
    return {n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)}


def test_extend_and_testing_are_pinned() -> None:
    assert stead.extend.__all__ == EXTEND
    assert stead.testing.__all__ == TESTING


@pytest.mark.parametrize("tier", TIERS, ids=lambda m: m.__name__)
def test_all_is_what_the_module_exposes(tier: ModuleType) -> None:
    assert public_names(tier) == {n for n in tier.__all__ if not n.startswith("_")}


@pytest.mark.parametrize("tier", TIERS, ids=lambda m: m.__name__)
def test_each_public_name_reports_its_tier(tier: ModuleType) -> None:
    for name in tier.__all__:
        obj = getattr(tier, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        expected = "stead" if name in stead.__all__ else tier.__name__
        assert obj.__module__ == expected, f"{tier.__name__}.{name} reports {obj.__module__}"


def test_shared_names_are_the_same_objects() -> None:
    for name in set(stead.__all__) & set(stead.extend.__all__):
        assert getattr(stead, name) is getattr(stead.extend, name)
    assert stead.testing.StoreCrashed is stead.StoreCrashed


def test_import_stead_is_light() -> None:
    code = (
        "import sys, stead\n"
        "heavy = [m for m in ('jinja2', 'stead.definitions', 'stead.orchestration') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
