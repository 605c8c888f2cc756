"""Retrieval: scope isolation (tenant, user, agent; strict vs cascading secondary scopes), hostile lexical
input, reciprocal rank fusion, strategies, the reranker hook."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import stead
from stead.memory import HashEmbedder, Note, Scope, fts_query, lexical_tokens, rrf
from tests.memory.conftest import WORDS, open_memory, scoped


def texts(notes: list[Note]) -> list[str]:
    return [n.text for n in notes]


async def test_M5_user_a_never_sees_user_b(mem: stead.AgentSystem) -> None:
    m = mem.memory
    await m.add("Prefers tea over coffee.", type="preference", user="alice")
    await m.add("Prefers coffee over tea.", type="preference", user="bob")
    await m.add("The office coffee machine is on floor two.")  # global: everyone
    alice = texts(await m.search("coffee or tea", user="alice", limit=10))
    bob = texts(await m.search("coffee or tea", user="bob", limit=10))
    anonymous = texts(await m.search("coffee or tea", limit=10))
    assert "Prefers coffee over tea." not in alice and "Prefers tea over coffee." in alice
    assert "Prefers tea over coffee." not in bob and "Prefers coffee over tea." in bob
    assert anonymous == ["The office coffee machine is on floor two."]
    assert (
        "The office coffee machine is on floor two." in alice
        and "The office coffee machine is on floor two." in bob
    )


async def test_M5_tenant_isolation_and_agent_scope(mem: stead.AgentSystem) -> None:
    m = mem.memory
    await m.add("Invoices go out on the 5th.", tenant="acme", user="u1")
    await m.add("Invoices go out on the 20th.", tenant="globex", user="u1")
    await m.add("Invoices are reviewed by the billing agent.", tenant="acme", agent="billing")
    assert texts(await m.search("invoices", tenant="acme", user="u1", agent="support", limit=10)) == [
        "Invoices go out on the 5th."
    ]
    billing = texts(await m.search("invoices", tenant="acme", user="u1", agent="billing", limit=10))
    assert sorted(billing) == ["Invoices are reviewed by the billing agent.", "Invoices go out on the 5th."]
    assert texts(await m.search("invoices", tenant="globex", user="u1", limit=10)) == [
        "Invoices go out on the 20th."
    ]
    assert await m.search("invoices", user="u1", limit=10) == []  # no tenant: no tenant's notes


async def test_M5_primary_scope_and_secondary_cascading_vs_strict(db_url: str) -> None:
    async with open_memory(db_url) as system:
        m = system.memory
        await m.add("Account 42 is on the enterprise plan.", primary="account:42")
        await m.add("EU customers get invoices in euros.", secondary={"region": "eu"})
        await m.add("Support hours are 9 to 5.")
        other = texts(await m.search("enterprise plan support hours", limit=10, primary="account:7"))
        assert "Account 42 is on the enterprise plan." not in other and "Support hours are 9 to 5." in other
        assert "Account 42 is on the enterprise plan." not in texts(
            await m.search("enterprise plan", limit=10)
        )
        got = texts(await m.search("enterprise plan", limit=10, primary="account:42"))
        assert "Account 42 is on the enterprise plan." in got
        # cascading: a caller that does not name the region still sees the region's note
        assert "EU customers get invoices in euros." in texts(await m.search("invoices euros", limit=10))
        assert "EU customers get invoices in euros." not in texts(
            await m.search("invoices euros", limit=10, secondary={"region": "us"})
        )
        assert "EU customers get invoices in euros." in texts(
            await m.search("invoices euros", limit=10, secondary={"region": ["us", "eu"]})
        )
    async with open_memory(db_url, scope_mode="strict") as system:
        m = system.memory
        # strict: the caller must name the dimension with an equal value
        assert "EU customers get invoices in euros." not in texts(await m.search("invoices euros", limit=10))
        assert "EU customers get invoices in euros." in texts(
            await m.search("invoices euros", limit=10, secondary={"region": "eu"})
        )


def test_M5_scope_admits_secondary_dimensions() -> None:
    cascading, strict = Scope(), Scope(mode="strict")
    item = {"region": "eu", "team": ["a", "b"]}
    assert cascading.admits(item) and not strict.admits(item)
    assert Scope(secondary={"region": "eu", "team": "b"}, mode="strict").admits(item)
    assert not Scope(secondary={"region": "eu", "team": "c"}).admits(item)
    assert Scope(mode="strict").admits(None)


HOSTILE = [
    "dark-mode",
    "vim: always",
    '"x',
    "AND",
    "NEAR(",
    "'; DROP TABLE memory_notes; --",
    "OR OR",
    "*",
    ")(",
]


@pytest.mark.parametrize("query", HOSTILE)
async def test_M4_fts_query_sanitized_hostile_input(mem: stead.AgentSystem, query: str) -> None:
    m = mem.memory
    await m.add("Uses dark mode and vim, always.", user="u")
    found = await m.search(query, user="u", lists=["lexical"])  # never raises
    if any(t in query.lower() for t in ("dark", "vim", "always")):
        assert texts(found) == ["Uses dark mode and vim, always."]
    assert len(await m.notes()) == 1  # the table is still there


def test_M4_every_token_is_quoted() -> None:
    assert fts_query(lexical_tokens("dark-mode")) == '"dark" OR "mode"'
    assert fts_query(lexical_tokens('vim: always "x')) == '"vim" OR "always" OR "x"'
    assert lexical_tokens("AND") == ["and"]  # only stopwords: they are kept rather than searching nothing
    assert lexical_tokens("what is the capital of France") == ["capital", "france"]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='porter unicode61')")
    conn.execute("INSERT INTO t(body) VALUES ('dark mode, vim always')")
    for raw in HOSTILE:
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("SELECT * FROM t WHERE t MATCH ?", (raw,)).fetchall()
        safe = fts_query(lexical_tokens(raw))
        if safe:  # no word at all ("*"): the search skips the lexical list
            conn.execute("SELECT * FROM t WHERE t MATCH ?", (safe,)).fetchall()


def test_M3_rrf_scores_and_orders_the_union() -> None:
    fused = rrf([[1, 2, 3], [3, 4]])
    assert [i for i, _ in fused] == [3, 1, 2, 4]
    assert dict(fused)[3] == pytest.approx(1 / 63 + 1 / 61)
    assert dict(fused)[4] == pytest.approx(1 / 62)
    weighted = dict(rrf([[1], [2]], [0.2, 1.0]))
    assert weighted[1] == pytest.approx(0.2 / 61) and weighted[2] == pytest.approx(1 / 61)


async def test_M3_fused_search_orders_by_rrf_with_the_test_embedder(db_url: str) -> None:
    # pinned vectors place each note's cosine with the query exactly
    query = "ocean holiday"
    q, a, b, c = [1.0, 0.0, 0.0], [0.9, 0.436, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0]
    emb = HashEmbedder(3, pinned={query: q, "alpha trip": a, "beta ocean": b, "gamma ocean holiday": c})
    async with open_memory(db_url, embedder=emb, lexical_weight=0.5, min_similarity=0.5) as system:
        m = system.memory
        for t in ("alpha trip", "beta ocean", "gamma ocean holiday"):
            await m.add(t)
        vector = texts(await m.search(query, lists=["vector"]))
        lexical = texts(await m.search(query, lists=["lexical"]))
        fused = await m.search(query)
    assert vector == ["alpha trip", "beta ocean"]  # gamma's cosine 0 is below the floor
    assert lexical == ["gamma ocean holiday", "beta ocean"]  # bm25: both words first
    # beta: vector rank 2 + lexical rank 2 (weight 0.5); alpha: vector rank 1; gamma: lexical rank 1 only
    assert texts(fused) == ["beta ocean", "alpha trip", "gamma ocean holiday"]
    assert [n.score for n in fused] == [
        pytest.approx(1 / 62 + 0.5 / 62, abs=1e-6),
        pytest.approx(1 / 61, abs=1e-6),
        pytest.approx(0.5 / 61, abs=1e-6),
    ]


async def test_strategies_recent_and_priority(mem: stead.AgentSystem) -> None:
    m = mem.memory
    await m.add("Old context.", type="context", user="u")
    await m.add("A constraint.", type="constraint", user="u")
    await m.add("Important context.", type="context", user="u", priority=5)
    await m.add("Newest preference.", type="preference", user="u")
    assert texts(await m.search("", user="u", strategy="recent", limit=2)) == [
        "Newest preference.",
        "Important context.",
    ]
    assert texts(await m.search("anything", user="u", strategy="priority")) == [
        "Important context.",
        "A constraint.",
        "Newest preference.",
        "Old context.",
    ]


async def test_reranker_reorders_and_failure_keeps_fused_order(db_url: str) -> None:
    async def reverse(query: str, notes: list[Note]) -> list[Note]:
        return list(reversed(notes))

    async def broken(query: str, notes: list[Note]) -> list[Note]:
        raise RuntimeError("reranker down")

    async with open_memory(db_url) as system:
        for t in ("red apple", "red apple pie", "green pear"):
            await system.memory.add(t)
        plain = texts(await system.memory.search("red apple", limit=2))
    async with open_memory(db_url, reranker=reverse) as system:
        reranked = texts(await system.memory.search("red apple", limit=2))
    async with open_memory(db_url, reranker=broken) as system:
        kept = texts(await system.memory.search("red apple", limit=2))
    assert reranked != plain and set(reranked) <= {"red apple", "red apple pie", "green pear"}
    assert kept == plain


async def test_archive_delete_and_audit(mem: stead.AgentSystem, db_path: Path) -> None:
    m = mem.memory
    a = await m.add("Keeps a cat.", user="u")
    b = await m.add("Keeps a dog.", user="u")
    await m.archive(a.id)
    await m.delete(b.id)
    assert await m.search("keeps", user="u") == []
    assert [n.status for n in await m.notes(user="u")] == ["archived"]
    assert [e.event for e in await m.events()] == ["written", "written", "archived", "deleted"]
    with pytest.raises(stead.NotFound):
        await m.delete(b.id)


async def test_examples_are_searched_and_rated(mem: stead.AgentSystem) -> None:
    m = mem.memory
    await m.add_example("refund an order", "call refund(order_id)", rating=0.9, agent="support")
    await m.add_example("reset a password", "send the reset link", rating=0.4, agent="support")
    found = await m.search_examples("how do I refund this order", agent="support")
    assert [e.input for e in found][:1] == ["refund an order"]
    rated = await m.search_examples("", agent="support", strategy="priority")
    assert [e.rating for e in rated] == [0.9, 0.4]


async def test_changing_the_embedder_re_embeds_lazily_and_expiry_is_audited(db_url: str) -> None:
    import time

    from tests.memory.conftest import open_memory as _open

    async with _open(db_url, embedder=HashEmbedder(384)) as system:
        await system.memory.add("Keeps bees on the roof.", user="u")
        await system.memory.add("Old guess.", user="u", status="provisional", expires_at=time.time() - 1)
    async with _open(db_url, embedder=HashEmbedder(64)) as system:  # another model: "hash-64"
        found = await system.memory.search("bees roof", user="u", lists=["vector"])
        assert [n.text for n in found] == ["Keeps bees on the roof."]
        async with system.store.transaction() as tx:
            models = sorted(r[0] for r in await tx.fetch("SELECT model FROM memory_vectors"))
        assert models == ["hash-384", "hash-384", "hash-64"]  # the archived (expired) note is not re-embedded
        assert [e.event for e in await system.memory.events()][-1] == "expired"
        assert [n.status for n in await system.memory.notes() if n.text == "Old guess."] == ["archived"]


async def test_M5_a_scope_too_wide_to_list_gets_the_same_answer_and_isolation(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 4: past `WIDE_SCOPE` visible notes a search scores every vector first and asks SQL
    which of the best are visible. Same notes, same order, as listing the visible notes — and no note of
    another user, tenant, primary scope or secondary region, nor an archived or deleted one, ever shows."""
    import random

    import stead.memory._retrieval as retrieval

    rng = random.Random(5)
    words = WORDS
    async with open_memory(db_url) as system:
        m = system.memory
        made = []
        for i in range(120):
            text = " ".join(rng.choice(words) for _ in range(4)) + f" fact {i}."
            pick = i % 6
            made.append((await m.add(text, **scoped(pick, rng)), pick))  # type: ignore[arg-type]
        for note, pick in made[:12]:
            if pick == 0:
                await (m.archive if note.text < "m" else m.delete)(note.id)
        queries = [" ".join(rng.choice(words) for _ in range(3)) for _ in range(25)]
        callers: list[dict[str, object]] = [{}, {"user": "other"}, {"secondary": {"region": "eu"}}]

        async def answers() -> list[list[str]]:
            out = []
            for q in queries:
                for caller in callers:
                    out.append([n.id for n in await m.search(q, limit=8, **caller)])  # type: ignore[arg-type]
            return out

        listed = await answers()
        monkeypatch.setattr(retrieval, "WIDE_SCOPE", 3)
        wide = await answers()
        assert wide == listed and any(listed)
        hidden = {n.id for n, pick in made if pick in (2, 3)} | {n.id for n, _ in made[:12] if _ == 0}
        assert not hidden & {i for ids in wide for i in ids}
