"""The store contract as a suite: `stead.testing.check_store(factory)` exercises every promise of
`stead.store.base` (`Store`, `Tx`) against one store, so that an outside store can prove it is one, and the
built-in stores prove it too.

`factory()` opens the store under test: the same database on every call (the suite closes what it opens,
and reopens it to see that commits last). The database may be fresh or used: every check works on agent ids
of its own. The relational checks use the kernel's own `kv` and `agents` tables through `execute`,
`write_sql` and `fetch` (`?` placeholders), as plugins do with theirs. A broken promise raises
`AssertionError` naming the check and what it saw; a store error raised by the store propagates, noted
with the check it happened in.

    async def test_my_store(tmp_path):
        await stead.testing.check_store(lambda: MyStore.open(f"mine:///{tmp_path}/x.db"))
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable

from stead.errors import Closed
from stead.store.base import AgentRow, Capabilities, Store

__all__ = ["CHECKS", "StoreFactory", "check_store"]

StoreFactory = Callable[[], Awaitable[Store]]
"""Opens the store under test (the same database each call)."""


class _Boom(Exception):
    """Raised inside transactions to make them roll back."""


def _fail(check: str, what: str) -> AssertionError:
    return AssertionError(f"store contract, {check}: {what}")


def _eq(check: str, what: str, got: object, want: object) -> None:
    if got != want:
        raise _fail(check, f"{what}: got {got!r}, expected {want!r}")


def _true(check: str, what: str, cond: object) -> None:
    if not cond:
        raise _fail(check, what)


def _ids(n: int) -> list[str]:
    """`n` fresh agent ids, in increasing order."""
    base = "ck" + secrets.token_hex(8)
    return [f"{base}{i:02d}" for i in range(n)]


async def _raises_boom(check: str, body: Callable[[], Awaitable[None]]) -> None:
    try:
        await body()
    except _Boom:
        return
    raise _fail(check, "an exception raised inside a transaction (or savepoint) was not re-raised")


# ---------------------------------------------------------------------------------------------- checks
async def check_attributes(store: Store) -> None:
    """The store names itself: url, dialect, ops, modules, capabilities; no transaction is open."""
    c = "attributes"
    _true(c, f"url must be a str, got {store.url!r}", isinstance(store.url, str))
    _true(c, f"dialect must be a non-empty str, got {store.dialect!r}", isinstance(store.dialect, str))
    _true(c, "dialect must be a non-empty str", store.dialect)
    _true(c, f"ops must be an int, got {store.ops!r}", isinstance(store.ops, int))
    _true(c, f"modules must be a frozenset, got {store.modules!r}", isinstance(store.modules, frozenset))
    caps = store.capabilities
    _true(
        c,
        f"capabilities must be a stead.store.base.Capabilities, got {caps!r}",
        isinstance(caps, Capabilities),
    )
    _eq(c, "current() outside every transaction", store.current(), None)
    before = store.ops
    async with store.transaction() as tx:
        await tx.get(_ids(1)[0], "k")
    _true(c, f"ops must count operations (was {before}, still {store.ops})", store.ops > before)


async def check_kv(store: Store) -> None:
    """The per-agent ordered KV: get, write (overwrites), write_if_absent arbitrates, read_prefix is sorted
    by code point and bounded by its prefix, last_key, delete reports whether it existed, delete_prefix."""
    c = "kv"
    a, b = _ids(2)
    async with store.transaction() as tx:
        _eq(c, "get of a missing key", await tx.get(a, "k"), None)
        await tx.write(a, "k", "1")
        await tx.write(a, "k", "2")
        _eq(c, "get after two writes (the last one wins)", await tx.get(a, "k"), "2")
        _eq(c, "get of another agent's key", await tx.get(b, "k"), None)
        _true(
            c, "write_if_absent of an absent key must return True", await tx.write_if_absent(a, "w", "first")
        )
        _true(
            c,
            "write_if_absent of a present key must return False",
            not await tx.write_if_absent(a, "w", "2nd"),
        )
        _eq(c, "the value after a refused write_if_absent", await tx.get(a, "w"), "first")
        _true(c, "write_if_absent is per agent", await tx.write_if_absent(b, "w", "other agent"))
    async with store.transaction() as tx:
        _true(
            c,
            "write_if_absent of a committed key must return False",
            not await tx.write_if_absent(a, "w", "3"),
        )
        _eq(c, "get of a committed value", await tx.get(a, "k"), "2")

    a, b = _ids(2)
    keys = ["q.send.3", "q.send.1", "q.steer.2", "q.send.10", "q", "qa", "q.send.2", "r.send.1", "q.z", "q.Z"]
    keys += ["q.é", "q.\u4e2d", "q.\U0001f600", "q.send.\u00ff"]
    async with store.transaction() as tx:
        for k in keys:
            await tx.write(a, k, k.upper())
        await tx.write(b, "q.send.0", "other agent")
        want = [(k, k.upper()) for k in sorted(k for k in keys if k.startswith("q.send."))]
        _eq(
            c,
            "read_prefix('q.send.') (sorted by key, code point order)",
            await tx.read_prefix(a, "q.send."),
            want,
        )
        got = [k for k, _ in await tx.read_prefix(a, "q.")]
        _eq(c, "read_prefix('q.') keys", got, sorted(k for k in keys if k.startswith("q.")))
        _eq(
            c,
            "read_prefix('') keys (every key of the agent)",
            [k for k, _ in await tx.read_prefix(a, "")],
            sorted(keys),
        )
        _eq(c, "read_prefix of a prefix nothing has", await tx.read_prefix(a, "zzz"), [])
        _eq(c, "last_key('q.')", await tx.last_key(a, "q."), max(k for k in keys if k.startswith("q.")))
        _eq(
            c,
            "last_key('q.send.')",
            await tx.last_key(a, "q.send."),
            max(k for k in keys if k.startswith("q.send.")),
        )
        _eq(c, "last_key of another agent", await tx.last_key(b, "q.s"), "q.send.0")
        _eq(c, "last_key of a prefix nothing has", await tx.last_key(a, "nothing."), None)

    a, b = _ids(2)
    async with store.transaction() as tx:
        for k in ["kv.c.1.a", "kv.c.1.b", "kv.c.10.a", "kv.c.2.a", "pending"]:
            await tx.write(a, k, "x")
        await tx.write(b, "kv.c.1.a", "x")
        _true(c, "delete of a present key must return True", await tx.delete(a, "pending"))
        _true(c, "delete of an absent key must return False", not await tx.delete(a, "pending"))
        _eq(c, "delete_prefix('kv.c.1.') count", await tx.delete_prefix(a, "kv.c.1."), 2)
        _eq(
            c,
            "keys left after delete_prefix",
            [k for k, _ in await tx.read_prefix(a, "")],
            ["kv.c.10.a", "kv.c.2.a"],
        )
        _eq(c, "another agent's key after delete_prefix", await tx.get(b, "kv.c.1.a"), "x")
        _eq(c, "delete_prefix of a prefix nothing has", await tx.delete_prefix(a, "nothing."), 0)
    async with store.transaction() as tx:
        _eq(c, "a committed delete", await tx.get(a, "pending"), None)
        _eq(c, "committed keys", [k for k, _ in await tx.read_prefix(a, "")], ["kv.c.10.a", "kv.c.2.a"])


async def check_batches(store: Store) -> None:
    """`write_if_absent_many` and `get_many`: the answers of the single operations one after another, in
    order — a present key is not written, a key given twice is written by its first row only — and what
    a rolled-back batch wrote is gone."""
    c = "batches"
    a, b = _ids(2)
    async with store.transaction() as tx:
        await tx.write(a, "taken", "old")
        _eq(c, "write_if_absent_many of nothing", await tx.write_if_absent_many([]), [])
        _eq(c, "get_many of nothing", await tx.get_many([]), [])
        won = await tx.write_if_absent_many(
            [(a, "m1", "x"), (a, "taken", "new"), (b, "m1", "y"), (a, "m1", "again"), (a, "m2", "z")]
        )
        _eq(c, "write_if_absent_many answers (in order; a repeated key: its first row)", won,
            [True, False, True, False, True])  # fmt: skip
        _eq(
            c,
            "get_many after write_if_absent_many",
            await tx.get_many([(a, "m1"), (a, "taken"), (b, "m1"), (a, "absent"), (a, "m2"), (a, "m1")]),
            ["x", "old", "y", None, "z", "x"],
        )
    async with store.transaction() as tx:
        _eq(c, "committed batch", await tx.get_many([(a, "m1"), (b, "m1")]), ["x", "y"])
        _eq(c, "the same batch again", await tx.write_if_absent_many([(a, "m1", "x"), (b, "m2", "w")]),
            [False, True])  # fmt: skip

    async def rolled_back() -> None:
        async with store.transaction() as tx:
            await tx.write_if_absent_many([(a, "lost", "1"), (b, "lost", "2")])
            raise _Boom

    await _raises_boom(c, rolled_back)
    async with store.transaction() as tx:
        _eq(c, "a rolled-back batch", await tx.get_many([(a, "lost"), (b, "lost")]), [None, None])


async def check_history(store: Store) -> None:
    """The append-only history: append in order (across transactions), per agent, clear, load_before
    pages from the end, and a rolled-back append leaves nothing behind."""
    c = "history"
    a, b = _ids(2)
    async with store.transaction() as tx:
        await tx.append(a, ["r1", "r2"])
        await tx.append(a, [])
        await tx.append(b, ["b1"])
        _eq(c, "load inside the appending transaction", await tx.load(a), ["r1", "r2"])
    async with store.transaction() as tx:
        await tx.append(a, ["r3"])
        _eq(c, "load after appends of two transactions", await tx.load(a), ["r1", "r2", "r3"])
        _eq(c, "load of another agent", await tx.load(b), ["b1"])
    async with store.transaction() as tx:
        await tx.append(a, ["r4", "r5"])
    async with store.transaction() as tx:
        newest = await tx.load_before(a, None, 2)
        _eq(c, "load_before(None, 2) records (newest first)", [r for _, r in newest], ["r5", "r4"])
        _true(c, f"load_before seqs must decrease, got {newest}", newest[0][0] > newest[1][0])
        older = await tx.load_before(a, newest[1][0], 10)
        _eq(c, "load_before(seq of r4, 10) records", [r for _, r in older], ["r3", "r2", "r1"])
        seqs = [s for s, _ in newest + older]
        _eq(
            c,
            "load_before seqs (strictly decreasing, all below `before`)",
            seqs,
            sorted(set(seqs), reverse=True),
        )
        _eq(c, "load_before(None, 0)", await tx.load_before(a, None, 0), [])
        _eq(c, "load_before of an agent without history", await tx.load_before(_ids(1)[0], None, 5), [])
        _eq(
            c,
            "load_before(None, 100) (the whole history)",
            [r for _, r in await tx.load_before(a, None, 100)],
            ["r5", "r4", "r3", "r2", "r1"],
        )
    async with store.transaction() as tx:
        await tx.clear(a)
        _eq(c, "load after clear", await tx.load(a), [])
        await tx.append(a, ["after clear"])
    async with store.transaction() as tx:
        _eq(c, "load after clear and append", await tx.load(a), ["after clear"])
        _eq(c, "another agent's history after clear", await tx.load(b), ["b1"])

    async def lost() -> None:
        async with store.transaction() as tx:
            await tx.append(a, ["lost"])
            raise _Boom

    await _raises_boom(c, lost)
    async with store.transaction() as tx:
        await tx.append(a, ["r2"])
    async with store.transaction() as tx:
        _eq(c, "load after a rolled-back append", await tx.load(a), ["after clear", "r2"])
        page = await tx.load_before(a, None, 10)
        _eq(c, "load_before after a rolled-back append", [r for _, r in page], ["r2", "after clear"])


async def check_archive(store: Store) -> None:
    """archive_history moves the whole history, in order and tagged, to the end of the archive."""
    c = "archive"
    a, b = _ids(2)
    async with store.transaction() as tx:
        await tx.append(a, ["r1", "r2"])
        await tx.append(b, ["b1"])
        _eq(c, "archive_history count", await tx.archive_history(a, "c1"), 2)
        _eq(c, "history after archive_history", await tx.load(a), [])
        await tx.append(a, ["r3"])
    async with store.transaction() as tx:
        _eq(c, "history appended after the archive", await tx.load(a), ["r3"])
        _eq(c, "archive_history count (second)", await tx.archive_history(a, "c2"), 1)
        _eq(c, "archive_history of an empty history", await tx.archive_history(a, "c3"), 0)
    async with store.transaction() as tx:
        want = [("c1", "r1"), ("c1", "r2"), ("c2", "r3")]
        _eq(c, "load_archive (in archiving order, tagged)", await tx.load_archive(a), want)
        _eq(c, "another agent's history", await tx.load(b), ["b1"])
        _eq(c, "another agent's archive", await tx.load_archive(b), [])


async def check_agents(store: Store) -> None:
    """The agents table: insert (refuses a duplicate), get, list with whether work is owed (ordered by
    creation), agents_owing_work, delete_agent removes the row, its KV, history and archive."""
    c = "agents"
    a, b, d = _ids(3)
    mine = {a, b, d}
    async with store.transaction() as tx:
        _true(
            c, "insert_agent of a new id must return True", await tx.insert_agent(AgentRow(a, "a", "{}", 1.5))
        )
        _true(
            c,
            "insert_agent of a present id must return False",
            not await tx.insert_agent(AgentRow(a, "dup", '{"x":1}', 9.0)),
        )
        _true(c, "insert_agent", await tx.insert_agent(AgentRow(b, None, '{"k": "v"}', 2.25)))
        _true(c, "insert_agent", await tx.insert_agent(AgentRow(d, "d", "{}", 0.5)))
        await tx.write(b, "pending", '{"stage": "x"}')
        await tx.write(a, "other", "x")
        await tx.append(a, ["r"])
        await tx.archive_history(a, "c1")
        await tx.append(a, ["r2"])
    async with store.transaction() as tx:
        _eq(c, "get_agent", await tx.get_agent(a), AgentRow(a, "a", "{}", 1.5))
        _eq(c, "get_agent (no name)", await tx.get_agent(b), AgentRow(b, None, '{"k": "v"}', 2.25))
        _eq(c, "get_agent of a missing id", await tx.get_agent(_ids(1)[0]), None)
        listed = [(r.id, owes) for r, owes in await tx.list_agents() if r.id in mine]
        _eq(
            c,
            "list_agents (by created_at, with whether work is owed)",
            listed,
            [(d, False), (a, False), (b, True)],
        )
        owing = [(r.id, p) for r, p in await tx.agents_owing_work() if r.id in mine]
        _eq(c, "agents_owing_work", owing, [(b, '{"stage": "x"}')])
        _true(c, "delete_agent of a present agent must return True", await tx.delete_agent(a))
        _true(c, "delete_agent of a missing agent must return False", not await tx.delete_agent(a))
        _eq(c, "get_agent after delete_agent", await tx.get_agent(a), None)
    async with store.transaction() as tx:
        _eq(c, "history after delete_agent", await tx.load(a), [])
        _eq(c, "archive after delete_agent", await tx.load_archive(a), [])
        _eq(c, "kv after delete_agent", await tx.read_prefix(a, ""), [])
        left = [r.id for r, _ in await tx.list_agents() if r.id in mine]
        _eq(c, "list_agents after delete_agent", left, [d, b])
        await tx.append(a, ["new life"])  # a deleted agent's history starts again
        _eq(c, "history of a deleted agent appended again", await tx.load(a), ["new life"])


async def check_relational(store: Store) -> None:
    """execute (row count), write_sql and fetch reach the same transaction as the KV operations."""
    c = "relational"
    a, b = _ids(2)
    async with store.transaction() as tx:
        await tx.write(a, "x.1", "one")
        await tx.write(a, "x.2", "two")
        await tx.write(b, "x.1", "other agent")
        rows = await tx.fetch("SELECT value FROM kv WHERE agent_id = ? AND key = ?", (a, "x.1"))
        _eq(c, "fetch of a value written in the transaction", [tuple(r) for r in rows], [("one",)])
        n = await tx.execute(
            "UPDATE kv SET value = ? WHERE agent_id = ? AND key >= ? AND key < ?", ("new", a, "x.", "x/")
        )
        _eq(c, "execute row count", n, 2)
        _eq(c, "get after execute", await tx.get(a, "x.2"), "new")
        await tx.write_sql("DELETE FROM kv WHERE agent_id = ? AND key = ?", (a, "x.1"))
        _eq(c, "get after write_sql", await tx.get(a, "x.1"), None)
        _true(c, "insert_agent", await tx.insert_agent(AgentRow(a, "before", "{}", 1.0)))
        await tx.write_sql("UPDATE agents SET name = ? WHERE id = ?", ("after", a))
    async with store.transaction() as tx:
        rows = await tx.fetch("SELECT key, value FROM kv WHERE agent_id = ? ORDER BY key", (a,))
        _eq(c, "committed rows", [tuple(r) for r in rows], [("x.2", "new")])
        row = await tx.get_agent(a)
        _eq(c, "an agent row changed by write_sql", row.name if row else None, "after")
        _eq(
            c,
            "fetch of nothing",
            await tx.fetch("SELECT value FROM kv WHERE agent_id = ?", (_ids(1)[0],)),
            [],
        )

    async def rolled_back() -> None:
        async with store.transaction() as tx:
            _eq(c, "execute row count", await tx.execute("DELETE FROM kv WHERE agent_id = ?", (a,)), 1)
            await tx.write_sql("UPDATE agents SET name = ? WHERE id = ?", ("lost", a))
            raise _Boom

    await _raises_boom(c, rolled_back)
    async with store.transaction() as tx:
        _eq(c, "get after a rolled-back execute", await tx.get(a, "x.2"), "new")
        row = await tx.get_agent(a)
        _eq(c, "an agent row after a rolled-back write_sql", row.name if row else None, "after")


async def check_atomicity(store: Store) -> None:
    """A raised exception rolls back everything the transaction wrote; nested transactions join the
    outer one (a failure in one rolls back both; the inner exit commits nothing)."""
    c = "atomicity"
    a = _ids(1)[0]

    async def everything() -> None:
        async with store.transaction() as tx:
            _true(c, "tx.store must be the store", tx.store is store)
            await tx.write(a, "k1", "v1")
            await tx.append(a, ["r1"])
            _true(c, "insert_agent", await tx.insert_agent(AgentRow(a, None, "{}", 0.0)))
            await tx.write_sql("UPDATE agents SET name = ? WHERE id = ?", ("n", a))
            raise _Boom

    await _raises_boom(c, everything)
    async with store.transaction() as tx:
        _eq(c, "kv after a rolled-back transaction", await tx.read_prefix(a, ""), [])
        _eq(c, "history after a rolled-back transaction", await tx.load(a), [])
        _eq(c, "agent row after a rolled-back transaction", await tx.get_agent(a), None)

    async with store.transaction() as outer:
        _true(c, "current() inside a transaction must be it", store.current() is outer)
        async with store.transaction() as inner:
            _true(c, "a nested transaction() of the same task must join the open one", inner is outer)
            await inner.write(a, "k", "v")
        _true(
            c, "current() after a nested exit must still be the outer transaction", store.current() is outer
        )
        _eq(c, "a nested write, read by the outer transaction", await outer.get(a, "k"), "v")
    _eq(c, "current() after the transaction", store.current(), None)
    async with store.transaction() as tx:
        _eq(c, "a nested write after the outer commit", await tx.get(a, "k"), "v")

    async def inner_exit_commits_nothing() -> None:
        async with store.transaction() as outer:
            async with store.transaction() as inner:
                await inner.write(a, "inner", "1")
            await outer.write(a, "outer", "1")
            raise _Boom

    await _raises_boom(c, inner_exit_commits_nothing)

    async def nested_failure() -> None:
        async with store.transaction() as outer:
            await outer.write(a, "outer2", "1")
            async with store.transaction() as inner:
                await inner.write(a, "inner2", "1")
                raise _Boom

    await _raises_boom(c, nested_failure)
    async with store.transaction() as tx:
        got = [k for k, _ in await tx.read_prefix(a, "")]
        _eq(c, "keys after failures of nested transactions (all rolled back)", got, ["k"])
    _eq(c, "current() after failed transactions", store.current(), None)


async def check_after_commit(store: Store) -> None:
    """after_commit callbacks run once, in registration order, only after the outermost commit; never
    after a rollback (with or without writes); a failing callback is not raised and the next ones run."""
    c = "after_commit"
    a = _ids(1)[0]
    ran: list[str] = []
    async with store.transaction() as outer:
        outer.after_commit(lambda: ran.append("outer"))
        async with store.transaction() as inner:
            await inner.write(a, "k", "v")
            inner.after_commit(lambda: ran.append("inner"))
        _eq(c, "callbacks run before the outermost commit", ran, [])
        await outer.get(a, "k")
        _eq(c, "callbacks run before the outermost commit", ran, [])
    _eq(c, "callbacks after the outermost commit (registration order, once)", ran, ["outer", "inner"])

    ran.clear()
    async with store.transaction() as tx:
        await tx.get(a, "k")
        tx.after_commit(lambda: ran.append("read-only"))
    _eq(c, "a callback of a transaction that only read", ran, ["read-only"])

    for writes in (True, False):
        ran.clear()

        async def rolled_back(writes: bool = writes) -> None:
            async with store.transaction() as tx:
                if writes:
                    await tx.write(a, "k", "lost")
                else:
                    await tx.get(a, "k")
                tx.after_commit(lambda: ran.append("callback"))
                async with store.transaction() as inner:
                    inner.after_commit(lambda: ran.append("inner"))
                raise _Boom

        await _raises_boom(c, rolled_back)
        await asyncio.sleep(0)
        what = "writing" if writes else "read-only"
        _eq(c, f"callbacks after a rolled-back {what} transaction", ran, [])

    ran.clear()

    def bad() -> None:
        raise RuntimeError("a callback's bug (expected by the store contract suite)")

    log = logging.getLogger("stead.store")
    was = log.disabled
    log.disabled = True  # the failure is expected: keep it out of the caller's log
    try:
        async with store.transaction() as tx:
            await tx.write(a, "k2", "v")
            tx.after_commit(bad)
            tx.after_commit(lambda: ran.append("next"))
    except RuntimeError:
        raise _fail(c, "a failing after-commit callback was raised into the committed caller") from None
    finally:
        log.disabled = was
    _eq(c, "callbacks after a failing one", ran, ["next"])
    async with store.transaction() as tx:
        _eq(c, "a commit whose callback failed", await tx.get(a, "k2"), "v")


async def check_savepoints(store: Store) -> None:
    """An exception inside a savepoint rolls back only that section (writes and callbacks) and is
    re-raised; a released savepoint keeps its writes; nested savepoints; the enclosing rollback wins."""
    c = "savepoints"
    a = _ids(1)[0]
    ran: list[str] = []
    async with store.transaction() as tx:
        await tx.write(a, "before", "1")
        tx.after_commit(lambda: ran.append("before"))

        async def failing_section() -> None:
            async with tx.savepoint():
                await tx.write(a, "inside", "1")
                await tx.append(a, ["inside"])
                tx.after_commit(lambda: ran.append("inside"))
                raise _Boom

        await _raises_boom(c, failing_section)
        _eq(c, "a write of a rolled-back savepoint", await tx.get(a, "inside"), None)
        _eq(c, "history of a rolled-back savepoint", await tx.load(a), [])
        _eq(c, "a write before the savepoint", await tx.get(a, "before"), "1")
        async with tx.savepoint():
            await tx.write(a, "kept", "1")
            tx.after_commit(lambda: ran.append("kept"))

            async def nested_failure() -> None:
                async with tx.savepoint():
                    await tx.write(a, "nested", "1")
                    tx.after_commit(lambda: ran.append("nested"))
                    raise _Boom

            await _raises_boom(c, nested_failure)
            await tx.write(a, "kept2", "1")
        tx.after_commit(lambda: ran.append("after"))
    _eq(c, "callbacks after savepoints", ran, ["before", "kept", "after"])
    async with store.transaction() as tx:
        got = [k for k, _ in await tx.read_prefix(a, "")]
        _eq(c, "committed keys after savepoints", got, ["before", "kept", "kept2"])
        _eq(c, "committed history after savepoints", await tx.load(a), [])

    ran.clear()

    async def outer_fails() -> None:
        async with store.transaction() as tx:
            async with tx.savepoint():
                await tx.write(a, "released", "1")
                tx.after_commit(lambda: ran.append("released"))
            raise _Boom

    await _raises_boom(c, outer_fails)
    _eq(c, "callbacks of a released savepoint whose transaction rolled back", ran, [])
    async with store.transaction() as tx:
        _eq(c, "a released savepoint whose transaction rolled back", await tx.get(a, "released"), None)


async def check_isolation(store: Store) -> None:
    """The current transaction belongs to its task; another task never reads uncommitted writes, and
    concurrent transactions finish (no deadlock)."""
    c = "isolation"
    a = _ids(1)[0]
    wrote = asyncio.Event()
    finish = asyncio.Event()
    seen: list[tuple[str | None, bool, bool]] = []

    async def first() -> None:
        async with store.transaction() as tx:
            await tx.write(a, "k", "first")
            wrote.set()
            await finish.wait()

    async def second() -> None:
        _eq(c, "current() of a task without a transaction", store.current(), None)
        async with store.transaction() as tx:
            value = await tx.get(a, "k")
            seen.append((value, finish.is_set(), store.current() is tx))

    t1 = asyncio.create_task(first())
    await asyncio.wait_for(wrote.wait(), 10)
    _eq(c, "current() of a task while another task's transaction is open", store.current(), None)
    t2 = asyncio.create_task(second())
    for _ in range(20):
        await asyncio.sleep(0)
    finish.set()
    try:
        await asyncio.wait_for(asyncio.gather(t1, t2), 30)
    except TimeoutError:
        raise _fail(c, "two tasks' transactions did not both finish within 30 s (deadlock?)") from None
    _eq(c, "reads of the second task", len(seen), 1)
    value, after_finish, own = seen[0]
    _true(c, "current() inside the second task's transaction must be it", own)
    _true(
        c,
        f"another task read {value!r}: an uncommitted write",
        value is None or (value == "first" and after_finish),
    )


CHECKS: tuple[Callable[[Store], Awaitable[None]], ...] = (
    check_attributes,
    check_kv,
    check_batches,
    check_history,
    check_archive,
    check_agents,
    check_relational,
    check_atomicity,
    check_after_commit,
    check_savepoints,
    check_isolation,
)
"""Every check that runs on one open store, in order."""


async def check_close_and_reopen(factory: StoreFactory) -> None:
    """Commits outlive the store: a reopened store reads them; `close()` is idempotent; a closed store
    refuses new transactions with `stead.errors.Closed`."""
    c = "close"
    a = _ids(1)[0]
    store = await factory()
    try:
        async with store.transaction() as tx:
            await tx.write(a, "k", "durable")
            await tx.append(a, ["r1"])
            _true(c, "insert_agent", await tx.insert_agent(AgentRow(a, "n", "{}", 3.0)))
    finally:
        await store.close()
    await store.close()  # idempotent
    try:
        async with store.transaction() as tx:
            await tx.get(a, "k")
    except Closed:
        pass
    except Exception as e:
        raise _fail(c, f"a transaction of a closed store must raise stead.errors.Closed, not {e!r}") from e
    else:
        raise _fail(c, "a closed store still ran a transaction")
    again = await factory()
    try:
        async with again.transaction() as tx:
            _eq(c, "a committed value after reopening", await tx.get(a, "k"), "durable")
            _eq(c, "committed history after reopening", await tx.load(a), ["r1"])
            _eq(c, "a committed agent after reopening", await tx.get_agent(a), AgentRow(a, "n", "{}", 3.0))
    finally:
        await again.close()


async def check_store(
    factory: StoreFactory, *, checks: tuple[Callable[[Store], Awaitable[None]], ...] = CHECKS
) -> None:
    """Run the store contract (`stead.store.base`) against the store `factory()` opens: KV, history and
    its archive, the agents table, the relational escape hatch, atomic transactions that nested calls
    join, after-commit callbacks, savepoints, task isolation, close and reopen. Raises `AssertionError`
    naming the first broken promise."""
    store = await factory()
    try:
        for check in checks:
            try:
                await check(store)
            except AssertionError:
                raise
            except Exception as e:
                e.add_note(f"(raised by the store in stead.testing.check_store: {check.__name__})")
                raise
    finally:
        await store.close()
    await check_close_and_reopen(factory)
