"""The project states its own promises (issue 8 item 7): every promise code used in a test name is defined,
with one sentence, in docs/promises.md, and the page defines the codes DESIGN lists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "promises.md"
CODE_IN_TEST = re.compile(r"def test_([A-Z]{1,3}\d+(?:[a-z]\d*)?)_")
ROW = re.compile(r"^\| ([A-Z]{1,3}\d+(?:[a-z]\d*)?) \| (.+) \|$", re.MULTILINE)


def defined() -> dict[str, str]:
    return dict(ROW.findall(PAGE.read_text(encoding="utf-8")))


def test_the_design_codes_are_defined() -> None:
    expected = (
        [f"A{i}" for i in range(1, 8)]
        + [f"C{i}" for i in range(1, 7)]
        + [f"S{i}" for i in range(1, 5)]
        + [f"T{i}" for i in range(1, 8)]
        + ["K1", "K2", "P1"]
        + [f"R{i}" for i in range(1, 5)]
        + [f"X{i}" for i in range(1, 5)]
    )
    page = defined()
    assert [c for c in expected if c not in page] == []
    assert all(len(sentence) > 20 for sentence in page.values())


def test_every_code_used_in_a_test_name_is_defined() -> None:
    used: dict[str, str] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for code in CODE_IN_TEST.findall(path.read_text(encoding="utf-8")):
            used.setdefault(code, str(path.relative_to(ROOT)))
    missing = {code: where for code, where in used.items() if code not in defined()}
    assert missing == {}, f"promise codes used in tests but not defined in docs/promises.md: {missing}"
