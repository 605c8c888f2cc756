"""The kernel seams memory needs: who sends a message (`user`, `tenant`), the run context hook, a
transactional tool's `prepare` step, `system.memory`."""

from __future__ import annotations

from typing import Any

import pytest

import stead
import stead.memory
from stead.extend import IncomingMessage, MessageConsumedInfo, Plugin
from stead.testing import ScriptedProvider


class Seen(stead.Hooks):
    def __init__(self) -> None:
        self.activated: list[tuple[str | None, str | None, str | None]] = []
        self.consumed: list[tuple[str | None, str | None]] = []
        self.contexts: list[tuple[str | None, str | None]] = []
        self.asked = 0
        self.answer: stead.extend.RunContext | None = None

    async def activated_tx(self, ctx: stead.HookContext) -> None:
        msg = ctx.message
        self.activated.append((ctx.user, ctx.tenant, msg.user if msg else None))

    async def message_consumed_tx(self, ctx: stead.HookContext, info: MessageConsumedInfo) -> None:
        self.consumed.append((info.message.user, ctx.user))

    async def run_context(self, ctx: stead.HookContext) -> Any:
        self.asked += 1
        self.contexts.append((ctx.user, ctx.message.text if ctx.message else None))
        return self.answer


class Validator(Plugin):
    name = "who"

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str | None]] = []

    def validate_message(self, message: IncomingMessage) -> None:
        self.seen.append((message.user, message.tenant))
        if message.user == "banned":
            raise stead.InvalidInput("banned user")


@stead.tool
async def whoami(ctx: stead.ToolContext) -> str:
    "Who is asking."
    return f"{ctx.user}@{ctx.tenant}"


def calls_whoami(request: stead.ProviderRequest) -> list[stead.Block]:
    if not any(m.role == "tool" for m in request.messages[-2:]):
        return [stead.ToolCall("whoami", {})]
    return [stead.Text("done")]


async def test_a_message_carries_its_user_and_tenant_to_history_hooks_validators_and_tools(
    db_url: str,
) -> None:
    seen, who = Seen(), Validator()
    async with stead.open(
        db_url, providers={"s": ScriptedProvider(calls_whoami)}, tools=[whoami], hooks=seen, plugins=[who]
    ) as system:
        agent = await system.create(provider="s", model="m", tools=["whoami"])
        result = await agent.run("hi", user="u-42", tenant="acme")
        with pytest.raises(stead.InvalidInput):
            await agent.send("hello", user="banned")
        with pytest.raises(stead.InvalidId):
            await agent.send("hello", user="not valid!")
        history = await agent.history()
    assert [(m.user, m.tenant) for m in history if m.role == "user"] == [("u-42", "acme")]
    assert who.seen == [("u-42", "acme"), ("banned", None)]
    assert seen.activated == [("u-42", "acme", "u-42")]
    assert seen.consumed == [("u-42", "u-42")]
    tool_results = [b.output for m in result.messages for b in m.content if isinstance(b, stead.ToolResult)]
    assert tool_results == ["u-42@acme"]


async def test_the_runs_user_is_its_first_messages_and_survives_a_restart(db_url: str) -> None:
    import asyncio

    gate, entered = asyncio.Event(), asyncio.Event()

    @stead.tool(durable=True)
    async def slow(ctx: stead.ToolContext) -> str:
        "Waits."
        if not gate.is_set():
            entered.set()
            await asyncio.Event().wait()  # the process "dies" here
        return f"{ctx.user}"

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if not any(m.role == "tool" for m in request.messages):
            return [stead.ToolCall("slow", {})]
        return [stead.Text("ok")]

    system = await stead.open(db_url, providers={"s": ScriptedProvider(respond)}, tools=[slow])
    agent = await system.create(provider="s", model="m", tools=["slow"], agent_id="who1")
    await agent.send("first", user="alice")
    await agent.send("second", user="bob")  # same run: the run's user stays alice
    await entered.wait()
    system.abandon()
    await system.store.close()
    gate.set()
    async with stead.open(db_url, providers={"s": ScriptedProvider(respond)}, tools=[slow]) as system:
        agent = await system.get("who1")
        await agent.wait_idle(timeout=10)
        outputs = [
            b.output for m in await agent.history() for b in m.content if isinstance(b, stead.ToolResult)
        ]
    assert outputs == ["alice"]  # bob's message, queued meanwhile, joins alice's run


async def test_run_context_none_adds_nothing_and_an_answer_is_asked_once_per_run(db_url: str) -> None:
    seen = Seen()
    requests: list[stead.ProviderRequest] = []

    @stead.tool
    async def step() -> str:
        "A step."
        return "x"

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        requests.append(request)
        if not any(m.role == "tool" for m in request.messages[-2:]):
            return [stead.ToolCall("step", {})]
        return [stead.Text("ok")]

    async with stead.open(
        db_url, providers={"s": ScriptedProvider(respond)}, tools=[step], hooks=seen
    ) as system:
        agent = await system.create(provider="s", model="m", instructions="I", tools=["step"])
        await agent.run("one", user="u")
        assert seen.asked == 2 and requests[0].messages[0].role == "user"  # None: asked again, nothing added
        seen.answer = stead.extend.RunContext("CONTEXT", {"k": 1})
        seen.asked = 0
        await agent.run("two", user="u")
        assert seen.asked == 1
        assert [r.messages[0].text for r in requests[-2:]] == ["CONTEXT", "CONTEXT"]
        assert all(r.messages[0].role == "system" for r in requests[-2:])
        async with system.store.transaction() as tx:
            assert await tx.get(agent.id, "kv.r.context") is None  # erased at settlement
    assert seen.contexts[-1] == ("u", "two")


async def test_prepare_runs_outside_the_transaction_and_feeds_the_body(db_url: str) -> None:
    log: list[Any] = []
    store_ref: list[Any] = []

    @stead.tool(transactional=True)
    async def save(text: str, ctx: stead.ToolContext) -> str:
        "Save."
        log.append(("body", ctx.prepared, ctx.tx is not None))
        return "saved"

    @save.prepare
    async def _prepare(ctx: stead.ToolContext, args: dict[str, Any]) -> str:
        log.append(("prepare", args["text"], store_ref[0].current() is not None))
        return args["text"].upper()

    @stead.tool(transactional=True)
    async def broken(ctx: stead.ToolContext) -> str:
        "Never runs."
        log.append(("broken body",))
        return "no"

    @broken.prepare
    async def _fail(ctx: stead.ToolContext, args: dict[str, Any]) -> None:
        raise RuntimeError("model offline")

    def respond(request: stead.ProviderRequest) -> list[stead.Block]:
        if not any(m.role == "tool" for m in request.messages):
            return [stead.ToolCall("save", {"text": "hi"}), stead.ToolCall("broken", {})]
        return [stead.Text("ok")]

    async with stead.open(db_url, providers={"s": ScriptedProvider(respond)}, tools=[save, broken]) as system:
        store_ref.append(system.store)
        agent = await system.create(provider="s", model="m", tools=["save", "broken"])
        result = await agent.run("go")
    outputs = [b for m in result.messages for b in m.content if isinstance(b, stead.ToolResult)]
    assert log == [("prepare", "hi", False), ("body", "HI", True)]
    assert outputs[1].is_error and "model offline" in outputs[1].output

    with pytest.raises(stead.ConfigurationError):

        @stead.tool
        async def plain() -> str:
            "Not transactional."
            return ""

        plain.prepare(_prepare)


async def test_system_memory_needs_the_memory_plugin(db_url: str) -> None:
    async with stead.open(db_url) as system:
        with pytest.raises(stead.ConfigurationError, match="memory=True"):
            _ = system.memory
    async with stead.open(db_url, memory=True) as system:
        assert isinstance(system.memory, stead.memory.Memory)
