"""Caller-chosen ids (issue 9, item 5): any 1-128 characters from `[A-Za-z0-9._:@-]` for messages and
agents; generated ids stay cuid2; a repeated id is still `created=False`; everything else is refused before
anything is written."""

from __future__ import annotations

import uuid

import pytest

import stead
from stead._ids import is_valid_id, is_valid_user_id, new_id
from stead.providers.scripted import ScriptedProvider

TIMEOUT = 5.0

ACCEPTED = [
    "order-123",
    str(uuid.uuid4()),
    "support-bot",
    "evt_1Nv0FGQ9",  # `_` is allowed (stores never use LIKE, so it is an ordinary character)
    "user@example.com",
    "tenant:42:msg.7",
    "A",
    "x" * 128,
    new_id(),
]
REFUSED = [
    "",
    "x" * 129,
    "a/b",
    "a\\b",
    "a b",
    "a\tb",
    "line\n",
    "it's",
    'say"hi"',
    "100%",
    "a*b",
    "a?b",
    "a#b",
    "a,b",
    "a;b",
    "a=b",
    "café",
    "ид",
    "a\x00b",
]


def test_user_id_rule() -> None:
    assert all(is_valid_user_id(i) for i in ACCEPTED)
    assert not any(is_valid_user_id(i) for i in [*REFUSED, 5, None, b"bytes"])
    assert is_valid_id(new_id()) and not is_valid_id("order-123")  # generated ids are cuid2


async def test_client_chosen_message_and_agent_ids(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted", agent_id="support-bot")
        assert agent.id == "support-bot"
        assert (await system.get("support-bot")).id == "support-bot"
        for mid in ACCEPTED:
            acc = await agent.send("hi", id=mid)
            assert acc.id == mid and acc.created
            await agent.wait_idle(TIMEOUT)
        again = await agent.send("hi", id="order-123")  # a repeated id is still an idempotency key
        assert again.created is False
        generated = await agent.send("hi")
        assert is_valid_id(generated.id)
        await agent.wait_idle(TIMEOUT)
        users = [m.id for m in await agent.history() if m.role == "user"]
        assert users == [*ACCEPTED, generated.id]
        other = await system.create(provider="scripted")
        assert is_valid_id(other.id)


async def test_ids_that_extend_another_id_do_not_collide(db_url: str) -> None:
    """`a` and `a.b` (one key a prefix of the other), `a_c` and `abc`: distinct ids, distinct keys."""
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with stead.open(db_url, providers={"scripted": provider}) as system:
        a = await system.create(provider="scripted", agent_id="a")
        ab = await system.create(provider="scripted", agent_id="a.b")
        for mid in ("m", "m.x", "m_c", "mxc", "m:1", "m@1"):
            assert (await a.send("hi", id=mid)).created
            assert (await ab.send("hi", id=mid)).created  # message ids are per agent
            await a.wait_idle(TIMEOUT)
            await ab.wait_idle(TIMEOUT)
        assert (await a.send("hi", id="m.x")).created is False
        assert sorted(i.id for i in await system.agents()) == ["a", "a.b"]
        assert len([m for m in await a.history() if m.role == "user"]) == 6
        assert len([m for m in await ab.history() if m.role == "user"]) == 6


@pytest.mark.parametrize("bad", REFUSED, ids=repr)
async def test_malformed_ids_are_refused_before_any_write(db_url: str, bad: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with stead.open(db_url, providers={"scripted": provider}) as system:
        agent = await system.create(provider="scripted")
        ops = system.store.ops
        with pytest.raises(stead.InvalidId, match="is not a valid id: use 1-128 characters"):
            await agent.send("hi", id=bad)
        with pytest.raises(stead.InvalidId, match="is not a valid id: use 1-128 characters"):
            await system.create(provider="scripted", agent_id=bad)
        assert system.store.ops == ops
        assert [a.id for a in await system.agents()] == [agent.id]
