"""The `stead` command with a definitions directory: `stead run DIR AGENT MESSAGE` (sub-agent progress on
stderr), `stead runs` and `stead runs show RUN_ID` (the run tree)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.cli import empty_store, invoke

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "examples" / "team"
ASK = "Write a short brief about durable agents"


def test_run_the_team_then_list_and_show_runs(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    code, out, err = invoke("run", str(TEAM), "orchestrator", ASK, "--db", db)
    assert code == 0, err
    assert "Here is the brief, researched and written by the team:" in out
    assert "Durable agents keep everything that matters" in out
    # the orchestrator's delegations and the sub-agents' own tool calls, as they happen
    assert err.count('→ researcher(request="') == 2 and '→ writer(request="' in err
    assert err.count("  researcher → search(") == 2 and err.count("← researcher: Findings:") == 2

    code, out, err = invoke("runs", "--db", db, "--json")
    assert code == 0, err
    runs = json.loads(out)
    assert sorted(r["agent_name"] for r in runs) == ["orchestrator", "researcher", "researcher", "writer"]
    assert all(r["status"] == "completed" for r in runs)
    (root,) = [r for r in runs if r["parent_run_id"] is None]

    code, out, _ = invoke("runs", "--db", db, "--limit", "2")
    assert code == 0 and len([ln for ln in out.splitlines() if "completed" in ln]) == 2
    code, out, _ = invoke("runs", "--db", db, "--agent", root["agent_id"])
    assert code == 0 and root["id"] in out and "orchestrator → researcher" not in out

    code, out, err = invoke("runs", "show", root["id"], "--db", db)
    assert code == 0, err
    assert out.count("sub_agent orchestrator: researcher") == 2
    assert "sub_agent orchestrator: writer" in out
    assert out.count("tool orchestrator → researcher: search") == 2
    assert "tokens" in out and "final message: Here is the brief" in out
    code, out, _ = invoke("runs", "show", root["id"], "--db", db, "--json")
    tree = json.loads(out)
    assert len(tree["children"]) == 3 and [s["type"] for s in tree["steps"]].count("sub_agent") == 3


def test_run_errors(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    empty_store(Path(db))  # read commands never create a database (issue 9): make one first
    code, _, err = invoke("run", str(TEAM), "--db", db)
    assert code == 2 and "AGENT_NAME is required" in err
    code, _, err = invoke("run", str(TEAM), "orchestrator", "--db", db)
    assert code == 2 and "MESSAGE is required" in err
    code, _, err = invoke("run", str(TEAM), "nobody", "hi", "--db", db)
    assert code == 1 and "no definition named 'nobody'" in err and "orchestrator, researcher, writer" in err
    code, _, err = invoke("runs", "show", "nosuchrun", "--db", db)
    assert code == 1 and "no run with id 'nosuchrun'" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.yaml").write_text("name: a\nmodel: scripted:m.yaml\nsub_agents: [ghost]\n")
    (bad / "m.yaml").write_text("scripted: true\nrules:\n  - responses:\n      - text: hi\n")
    code, _, err = invoke("run", str(bad), "a", "hi", "--db", db)
    assert code == 1 and f"{bad / 'a.yaml'}:3: sub_agents[0]: unknown sub-agent 'ghost'" in err


def test_a_team_member_file_brings_its_directory(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    code, out, err = invoke("run", str(TEAM / "orchestrator.yaml"), ASK, "--db", db)
    assert code == 0, err
    assert "Here is the brief" in out
