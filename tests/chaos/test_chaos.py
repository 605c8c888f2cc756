"""Randomized kill -9 chaos (docs/promises.md, §12) — the CI slice of `python scripts/chaos.py`.

Each seed starts real worker processes on a fresh database, drives a seeded random workload, SIGKILLs the
worker at seeded random moments (2–4 times), finishes in a clean incarnation, and checks the invariants from
the store alone (tests/chaos/harness.py). A failure names the one-line command that replays the seed.

The checker is itself tested below on hand-made broken stores, so that a passing seed means something.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import stead
from tests.chaos import harness as H
from tests.chaos import requests as R

CI_SEEDS = range(24)


@pytest.mark.parametrize("seed", CI_SEEDS)
async def test_chaos_seed(seed: int, tmp_path: Path) -> None:
    result = await H.run_seed(seed, tmp_path)
    assert result.ok, "\n".join([*result.violations, "replay: " + H.replay_command(seed)])
    assert result.stats["messages"] > 0
    assert result.stats["requests_checked"] > 0  # the request checker saw this seed's provider requests


async def test_chaos_compacts_automatically_and_on_request(tmp_path: Path) -> None:
    """The CI seeds exercise compaction (K1) — requested ones and automatic ones — under the kills."""
    plans = [H.make_plan(s) for s in CI_SEEDS]
    assert any(op.kind == "compact" for p in plans for inc in p.incarnations for t in inc for op in t)
    result = await H.run_seed(3, tmp_path)
    assert result.ok and result.stats["compactions"] > 0


def test_plans_are_deterministic_per_seed() -> None:
    assert H.make_plan(7) == H.make_plan(7)
    assert H.make_plan(7) != H.make_plan(8)
    assert all(2 <= H.make_plan(s).kills <= 4 for s in range(50))


# ---------------------------------------------------------------------------------- the checker bites
def _user(mid: str) -> dict[str, object]:
    return {"k": "u", "id": mid, "r": "user", "c": [{"t": "x", "x": f"{mid} :: T"}]}


def _call(cid: str, name: str = "plain_op") -> dict[str, object]:
    return {"k": "b", "i": "inf1", "b": {"t": "c", "n": name, "a": {"ms": 0}, "i": cid}}


def _result(cid: str, out: str) -> dict[str, object]:
    return {"k": "t", "b": {"t": "r", "i": cid, "o": out}}


def _snap(history: list[dict[str, object]], kv: dict[str, str] | None = None) -> H.Snapshot:
    a = H.agent_id(0)
    ids = [str(r["id"]) for r in history if r["k"] == "u"]
    base = {f"msg.{i}": "send" for i in ids}
    base["kv.a.ledger"] = json.dumps([["a", "run1", False, 1], ["s", "run1", None, 1]])
    base.update(kv or {})
    return H.Snapshot({a: base}, {a: history})


def _markers(*ids: str) -> H.Markers:
    m = H.Markers()
    for i in ids:
        m.feed(1, f"SEND 0 {i}")
        m.feed(1, f"ACC 0 {i} 1")
    return m


def test_a_clean_store_passes() -> None:
    snap = _snap([_user("m1"), _call("c1"), _result("c1", "plain_op done")])
    effects = [(1, "agent0", "plain_op", "c1", "-")]
    assert H.check_final(snap, _markers("m1"), effects, {"c1": 1}) == []


def test_the_checker_catches_broken_stores() -> None:
    def final(snap: H.Snapshot, effects: list[tuple[int, str, str, str, str]] | None = None) -> list[str]:
        return H.check_final(snap, _markers("m1"), effects or [], {"c1": 1})

    assert final(_snap([_user("m1"), _user("m1")]))  # duplicated message
    assert final(_snap([]))  # lost message
    assert final(_snap([_user("m1"), _user("zz")]))  # a message nobody sent
    assert final(_snap([_user("m1")], {"q.send.1.0": json.dumps({"id": "m1", "r": "user", "c": []})}))
    assert final(_snap([_user("m1"), _call("c1")]))  # a call without a result
    assert final(_snap([_user("m1"), _call("c1"), _result("c1", "x"), _result("c1", "y")]))
    ran_twice = [(1, "agent0", "plain_op", "c1", "-"), (2, "agent0", "plain_op", "c1", "-")]
    assert final(_snap([_user("m1"), _call("c1"), _result("c1", "plain_op done")]), ran_twice)
    rerun = [(1, "agent0", "durable_op", "c1", "k"), (2, "agent0", "durable_op", "c1", "k")]
    assert final(_snap([_user("m1"), _call("c1", "durable_op"), _result("c1", "durable_op done")]), rerun)
    new_key = [(1, "agent0", "durable_op", "c1", "k1"), (1, "agent0", "durable_op", "c1", "k2")]
    assert final(_snap([_user("m1"), _call("c1", "durable_op"), _result("c1", "durable_op done")]), new_key)
    lost_id = [(1, "agent0", "durable_op", "other", "k")]
    assert final(_snap([_user("m1"), _call("c1", "durable_op"), _result("c1", "durable_op done")]), lost_id)
    assert final(_snap([_user("m1"), _call("c1", "tx_op"), _result("c1", "tx_op done")]))  # no tx effect
    unpaired = json.dumps([["a", "run1", False, 1], ["a", "run2", False, 1], ["s", "run2", None, 1]])
    assert final(_snap([_user("m1")], {"kv.a.ledger": unpaired}))
    assert final(_snap([_user("m1")], {"pending": json.dumps({"st": "inference", "run": "run1"})}))


def test_markers_catch_a_second_creation() -> None:
    m = H.Markers()
    m.feed(1, "ACC 0 m1 1")
    m.feed(2, "ACC 0 m1 1")
    assert m.violations and Counter(m.accepted) == Counter({(0, "m1"): 1})


# ---------------------------------------------------------------------------------- the request checker
def _request(*messages: stead.Message) -> dict[str, object]:
    req = stead.ProviderRequest("m", "", list(messages), [], agent_id="agent0", inference_id="inf9")
    return R.encode_request(req, "test")


def _calls(*ids: str) -> stead.Message:
    return stead.Message(
        "assistant", [stead.Text("calling"), *(stead.ToolCall("plain_op", {}, i) for i in ids)]
    )


def _results(*pairs: tuple[str, str]) -> stead.Message:
    return stead.Message("tool", [stead.ToolResult(cid, out) for cid, out in pairs])


ASK = stead.Message("user", [stead.Text("m1 :: T")])
STORED = R.stored_from_records(
    [
        ("agent0", _call("c1")),
        ("agent0", _call("c2")),
        ("agent0", _result("c1", "one")),
        ("agent0", _result("c2", "two")),
    ]
)


def test_the_request_checker_passes_a_well_formed_request() -> None:
    req = _request(ASK, _calls("c1", "c2"), _results(("c1", "one"), ("c2", "two")))
    assert R.check_request(req, STORED) == []
    assert R.check_request(_request(ASK), STORED) == []


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ((ASK, _calls("c1", "c2"), _results(("c1", "one"))), "['c2'] have no result"),  # a missing result
        ((ASK, _calls("c1", "c2")), "no result before the end of the request"),  # none at all
        ((ASK, _calls("c1"), ASK, _results(("c1", "one"))), "no result before a user message"),
        ((ASK, _calls("c1", "c2"), _results(("c1", "one"), ("c1", "one"), ("c2", "two"))), "appears twice"),
        ((ASK, _calls("c1", "c2"), _results(("c2", "two"), ("c1", "one"))), "not in call order"),
        ((ASK, _calls("c1", "c2"), _results(("c1", "one"), ("c2", "TWO"))), "differs from the committed"),
        (
            (ASK, _calls("c1", "c3"), _results(("c1", "one"), ("c3", "x"))),
            "result of call c3 is not committed",
        ),
        ((ASK, _calls("c1"), _results(("c1", "one"), ("zz", "x"))), "which the request does not contain"),
        (
            (ASK, _calls("c1"), _results(("c1", "one")), _calls("c1"), _results(("c1", "one"))),
            "c1 appears twice",
        ),
        (
            (
                ASK,
                _calls("c1"),
                _results(("c1", "one")),
                _calls("c2"),
                _results(("c2", "two"), ("c1", "one")),
            ),
            "do not answer the calls right before them",
        ),
    ],
)
def test_the_request_checker_catches_planted_flaws(
    messages: tuple[stead.Message, ...], expected: str
) -> None:
    violations = R.check_request(_request(*messages), STORED)
    assert any(expected in v for v in violations), violations


def test_the_request_checker_lets_held_calls_answer_last_and_reads_every_stored_version() -> None:
    """T2: a held call's result commits with its decision, after the later calls' results; a compaction may
    keep a shortened copy of a result (K1): either stored version is the committed one."""
    gated = stead.Message(
        "assistant", [stead.ToolCall("gated_op", {}, "c1"), stead.ToolCall("plain_op", {}, "c2")]
    )
    req = _request(ASK, gated, _results(("c2", "two"), ("c1", "one")))
    assert R.check_request(req, STORED, frozenset({"gated_op"})) == []
    assert R.check_request(req, STORED)  # without the exception: out of call order
    stored = R.stored_from_records(
        [("agent0", _call("c1")), ("agent0", _result("c1", "one")), ("agent0", _result("c1", "o…"))]
    )
    assert R.check_request(_request(ASK, _calls("c1"), _results(("c1", "o…"))), stored) == []


def test_the_request_log_survives_and_is_checked_against_the_store(tmp_path: Path) -> None:
    log = R.RequestLog(tmp_path / "r.jsonl", "test")
    good = stead.ProviderRequest(
        "m", "", [ASK, _calls("c1", "c2"), _results(("c1", "one"), ("c2", "two"))], [], agent_id="agent0"
    )
    bad = stead.ProviderRequest(
        "m", "", [ASK, _calls("c1", "c2"), _results(("c2", "two"))], [], agent_id="agent0"
    )
    summary = stead.ProviderRequest("m", "", [ASK, _calls("c1")], [], agent_id="agent0", purpose="compaction")
    for req in (good, bad, summary):
        log(req)
    logged = R.read_requests([tmp_path / "r.jsonl"])
    assert len(logged) == 2  # summary requests are not conversations
    violations = R.check_requests(logged, STORED)
    assert len(violations) == 1 and "['c1'] have no result" in violations[0], violations


def test_a_turn_failure_the_plan_did_not_script_is_a_violation(tmp_path: Path) -> None:
    """A responder bug (`_events()` called with a missing argument, once) fails every flawed turn with a
    TypeError: the retries the flaws exist to exercise would never run, so such a failure is a violation."""
    import sqlite3

    db = tmp_path / "planted.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE history(agent_id TEXT, seq INTEGER, record TEXT)")
    ok = {"k": "s", "x": "The last turn failed: rate limited (scripted)"}
    bad = {"k": "s", "x": "The last turn failed: TypeError: _events() missing 1 required positional argument"}
    conn.executemany(
        "INSERT INTO history VALUES(?,?,?)", [("agent0", 1, json.dumps(ok)), ("agent1", 1, json.dumps(bad))]
    )
    conn.commit()
    conn.close()
    (violation,) = H.unexpected_turn_failures(db)
    assert violation.startswith("agent1: unexpected turn failure: The last turn failed: TypeError")
