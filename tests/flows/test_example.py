"""examples/triage runs offline with its scripted models (issue 16, "Done when"): both paths from the command
line, the run tree, and the payload from Python."""

from __future__ import annotations

import json
from pathlib import Path

import stead
from tests.fakes.cli import invoke

ROOT = Path(__file__).resolve().parent.parent.parent
TRIAGE = ROOT / "examples" / "triage"


def test_F12_the_triage_example_refunds_or_escalates_and_shows_its_run_tree(tmp_path: Path) -> None:
    db = str(tmp_path / "triage.db")
    code, out, err = invoke(
        "run", str(TRIAGE), "triage", "My order 1042 arrived damaged, I want a refund", "--db", db
    )
    assert code == 0, err
    assert out.strip() == "Refunded $39.50 for order 1042 (arrived damaged); refund R-1042."
    assert "→ lookup_order(order_id=1042)" in err and "→ issue_refund(" in err

    message = "Order 2001 never arrived and nobody answers my emails"
    code, out, err = invoke("run", str(TRIAGE), "triage", message, "--db", db)
    assert code == 0, err
    assert out.strip().startswith("Escalated to the support desk as ticket T-")
    assert "→ escalation(request=" in err and "  escalation → open_ticket(" in err

    code, out, _ = invoke("runs", "--db", db, "--json")
    roots = [r for r in json.loads(out) if r["parent_run_id"] is None]
    code, out, err = invoke("runs", "show", roots[0]["id"], "--db", db)  # newest first: the escalation
    assert code == 0, err
    for line in (
        "prompt triage: classify",
        "tool triage: classify (answer)",
        "tool triage: lookup",
        "sub_agent triage: escalate",
        "escalation  run",
        "tool triage → escalation: open_ticket",
    ):
        assert line in out, out
    assert "final message: Escalated to the support desk" in out


async def test_PY1_the_triage_example_carries_its_payload(tmp_path: Path) -> None:
    async with await stead.open(f"sqlite:///{tmp_path / 'triage.db'}", definitions=TRIAGE) as system:
        agent = await system.create(definition="triage")
        result = await agent.run(
            "My order 1042 arrived damaged, I want a refund", payload={"channel": "email"}
        )
    assert result.ok, result.error
    assert result.payload is not None
    assert result.payload["channel"] == "email"
    assert result.payload["ticket"] == {"category": "refund", "order_id": 1042, "reason": "arrived damaged"}
    assert result.payload["order"]["total"] == 39.5
    assert result.payload["resolution"] == result.text
