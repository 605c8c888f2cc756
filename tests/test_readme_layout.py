"""README's "Layout" section names every module and package at the top of `src/stead/` (issue 8: the layout
section matches the tree), so a new module cannot land without saying where it sits."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_layout_names_every_top_level_module_and_package() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py|/)", section))
    src = ROOT / "src" / "stead"
    entries = {
        p.name + ("/" if p.is_dir() else "")
        for p in src.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert entries, "no modules found"
    assert sorted(entries - named) == []
