"""The definition's `memory:` section, the README's two-session example, and `stead memory ...`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import stead
from stead.definitions import load_definition
from tests.fakes.cli import empty_store, run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "memory"


def test_the_definition_memory_section_is_checked_and_reaches_the_agent(tmp_path: Path) -> None:
    d = load_definition(EXAMPLE / "assistant.yaml", providers=["demo"])
    assert d.memory is not None and d.memory.write and d.memory.notes == 5 and d.memory.strategy == "relevant"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: demo:any\nmemory:\n  notes: 5\n  remember: yes\n")
    with pytest.raises(stead.DefinitionError) as e:
        load_definition(bad, providers=["demo"])
    assert "bad.yaml:5" in str(e.value) and "remember" in str(e.value)


async def test_readme_example_second_session_uses_what_the_first_remembered(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("memory_example", EXAMPLE / "run.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    db = str(tmp_path / "demo.db")
    first = await example.session(db, "Please remember that I prefer a window seat on trains.")
    second = await example.session(db, "Book me a train to Porto tomorrow morning.")
    assert first == "Noted — I will remember that."
    assert second == "Booked Lisbon → Porto at 9:00, window seat as you prefer."
    async with stead.open(f"sqlite:///{db}", memory=True, readonly=True) as system:
        (note,) = await system.memory.notes()
    assert (note.text, note.user, note.agent, note.status) == (
        "Prefers a window seat on trains.",
        "sam",
        "travel-1",
        "provisional",
    )


def test_stead_memory_add_list_search_promote_delete(tmp_path: Path) -> None:
    db = str(tmp_path / "cli.db")
    empty_store(tmp_path / "cli.db")  # `memory add` never creates a database
    env_db = ["--db", db]
    added = run_cli(
        "memory",
        "add",
        "Prefers tea in the afternoon.",
        "--user",
        "sam",
        "--type",
        "preference",
        *env_db,
        cwd=tmp_path,
    )
    assert added.returncode == 0, added.stderr
    note_id = added.stdout.strip()
    other = run_cli("memory", "add", "Prefers coffee.", "--user", "kim", *env_db, cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    listed = run_cli("memory", "list", "--user", "sam", "--json", *env_db, cwd=tmp_path)
    assert [n["id"] for n in json.loads(listed.stdout)] == [note_id]
    found = run_cli("memory", "search", "tea afternoon", "--user", "sam", *env_db, cwd=tmp_path)
    assert found.returncode == 0 and note_id in found.stdout and "Prefers coffee" not in found.stdout
    promoted = run_cli("memory", "promote", note_id, *env_db, cwd=tmp_path)
    assert promoted.stdout.strip() == f"{note_id} active trusted"
    deleted = run_cli("memory", "delete", note_id, *env_db, cwd=tmp_path)
    assert deleted.returncode == 0 and deleted.stdout.strip() == f"deleted {note_id}"
    missing = run_cli("memory", "delete", note_id, *env_db, cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "no memory note" in missing.stderr
    empty = run_cli("memory", "list", "--db", str(tmp_path / "nothing.db"), cwd=tmp_path)
    assert empty.returncode == 1 and "no such database file" in empty.stderr
