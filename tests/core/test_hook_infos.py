"""Issue 22 item 4: every hook takes `(ctx)` or `(ctx, info)` — one frozen info object per hook — and is
declared once (`stead.core.hooks.HOOKS`: dispatch, the overridden-only index and the docs' table derive from
it). An override written with the positional signature of before keeps working, with one
`DeprecationWarning` per class and hook."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import warnings
from pathlib import Path
from typing import Any, cast

import pytest

import stead
import stead.extend
from stead.core import batch as batch_module
from stead.core import consume as consume_module
from stead.core import inference as inference_module
from stead.core import response as response_module
from stead.core import settle as settle_module
from stead.core import state as state_module
from stead.core.hooks import HOOK_METHODS, HOOKS, SPECS, HookContext, HookSet, hook_table, is_legacy
from stead.core.results import read_run_state
from stead.extend import BlockInfo, OfferedToolsInfo, SettledInfo, ToolResultInfo
from stead.testing import ScriptedProvider
from tests.conftest import tool_loop

TIMEOUT = 5.0
LEGACY = [s for s in HOOKS if s.legacy]


@stead.tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _ctx() -> HookContext:
    return HookContext("agent", None, cast(Any, None))


def _old_style(seen: list[tuple[str, tuple[Any, ...]]]) -> type[stead.Hooks]:
    """A `Hooks` subclass overriding every hook that had positional arguments, with that signature (as
    plugins written before the info objects do): it records what it gets and answers "no change"."""
    body = []
    for spec in LEGACY:
        args = ", ".join(spec.legacy)
        body.append(
            f"    {'def' if spec.sync else 'async def'} {spec.name}(self, ctx, {args}):\n"
            f"        seen.append(({spec.name!r}, ({args},)))\n"
            f"        return {spec.chains or 'None'}\n"
        )
    namespace: dict[str, Any] = {"Hooks": stead.Hooks, "seen": seen}
    exec("class Old(Hooks):\n" + "".join(body), namespace)
    return cast(type[stead.Hooks], namespace["Old"])


def _new_style(seen: list[tuple[str, Any]]) -> type[stead.Hooks]:
    """Overrides every hook with an info object, the new way: it records the info it gets."""

    def method(spec: Any) -> Any:
        def answer(info: Any) -> Any:
            seen.append((spec.name, info))
            return getattr(info, spec.chains) if spec.chains else None

        if spec.sync:
            return lambda self, ctx, info: answer(info)

        async def call(self: Any, ctx: HookContext, info: Any) -> Any:
            return answer(info)

        return call

    return type("New", (stead.Hooks,), {s.name: method(s) for s in HOOKS if s.info is not None})


def _sample(spec: Any) -> Any:
    """An info object of `spec`'s type whose fields are distinct sentinels."""
    fields = [f for f in dataclasses.fields(spec.info) if not f.name.startswith("_")]
    return spec.info(*[object() for _ in fields])


# ------------------------------------------------------------------------------------- the one table
def test_every_hook_is_declared_once_and_the_defaults_match_the_table() -> None:
    methods = {n for n, v in vars(stead.Hooks).items() if callable(v) and not n.startswith("_")}
    assert set(HOOK_METHODS) == methods
    assert len(HOOK_METHODS) == len(HOOKS) == len(SPECS)
    for spec in HOOKS:
        default = getattr(stead.Hooks, spec.name)
        assert inspect.iscoroutinefunction(default) is not spec.sync, spec.name
        signature = inspect.signature(default)
        params = list(signature.parameters)
        if spec.combine == "events":
            assert params == ["self", "agent_id", "event"]
        elif spec.info is None:
            assert params == ["self", "ctx"], spec.name
        else:
            assert params == ["self", "ctx", "info"], spec.name
            assert signature.parameters["info"].annotation == spec.info.__name__
            assert getattr(stead.extend, spec.info.__name__) is spec.info  # plugins import it from there
            fields = {f.name for f in dataclasses.fields(spec.info)}
            assert set(spec.legacy) <= fields and (not spec.chains or spec.chains in fields)
            assert dataclasses.is_dataclass(spec.info) and spec.info.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert signature.return_annotation == spec.returns, spec.name


def test_the_docs_hook_table_is_generated_from_the_table() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
    assert hook_table() in page.read_text(encoding="utf-8"), (
        'docs/architecture.md "The hooks": paste `python -c "from stead.core.hooks import hook_table; '
        'print(hook_table())"`'
    )


def test_which_overrides_count_as_positional() -> None:
    class Hooked(stead.Hooks):
        async def settled_tx(self, ctx: HookContext, error: str | None) -> None:  # type: ignore[override]
            pass

        async def tool_result_tx(self, ctx, call, result):  # type: ignore[no-untyped-def,override]
            pass

        async def block_tx(self, ctx: HookContext, b: BlockInfo) -> None:  # annotated: new-style
            pass

        async def message_consumed_tx(self, ctx, info):  # type: ignore[no-untyped-def]  # named info
            pass

        def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
            return info.tools

        async def tool_dispatched_tx(self, ctx: HookContext, *args: Any) -> None:  # can't tell: new
            pass

    h = Hooked()
    assert is_legacy(SPECS["settled_tx"], h.settled_tx)
    assert is_legacy(SPECS["tool_result_tx"], h.tool_result_tx)
    for name in ("block_tx", "message_consumed_tx", "offered_tools", "tool_dispatched_tx"):
        assert not is_legacy(SPECS[name], getattr(h, name)), name
    assert not is_legacy(SPECS["response_tx"], h.response_tx)  # its signature never changed


# --------------------------------------------------------------------------- the positional signatures
async def test_a_positional_override_gets_the_info_fields_and_warns_once_per_class_and_hook() -> None:
    old_seen: list[tuple[str, tuple[Any, ...]]] = []
    new_seen: list[tuple[str, Any]] = []
    old, new = _old_style(old_seen), _new_style(new_seen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks = HookSet([old(), new(), old()])
        HookSet([old()])  # the same class again: no second warning
    assert all(w.category is DeprecationWarning for w in caught)
    assert sorted(str(w.message).split("(")[0] for w in caught) == sorted(f"Old.{s.name}" for s in LEGACY)
    settled = next(str(w.message) for w in caught if str(w.message).startswith("Old.settled_tx("))
    assert settled == (
        "Old.settled_tx(self, ctx, error) uses the positional hook signature, which is deprecated: "
        "write `async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None` "
        "(`error` is `info.error`). stead adapts the call for now."
    )
    for spec in LEGACY:
        old_seen.clear()
        new_seen.clear()
        info = _sample(spec)
        answer = getattr(hooks, spec.name)(_ctx(), info)
        if inspect.isawaitable(answer):
            answer = await answer
        values = tuple(getattr(info, n) for n in spec.legacy)
        assert old_seen == [(spec.name, values)] * 2, spec.name  # both positional objects, same values
        assert new_seen == [(spec.name, info)], spec.name
        if spec.chains:
            assert answer is getattr(info, spec.chains)


async def test_a_positional_override_sees_in_a_run_what_it_saw_before(db_url: str) -> None:
    class Audit(stead.Hooks):
        """Written the way `tests/outside/audit_plugin.py` is (before the info objects)."""

        def __init__(self) -> None:
            self.rows: list[tuple[Any, ...]] = []

        async def message_consumed_tx(self, ctx: HookContext, message: stead.Message) -> None:  # type: ignore[override]
            self.rows.append(("consumed", message.id, message.text))

        async def tool_result_tx(self, ctx, call, result):  # type: ignore[no-untyped-def,override]
            self.rows.append(("result", call.id, result.output))

        async def settled_tx(self, ctx: HookContext, error: str | None) -> None:  # type: ignore[override]
            self.rows.append(("settled", ctx.run_id, error, ctx.outcome))

    class Typed(stead.Hooks):
        def __init__(self) -> None:
            self.rows: list[tuple[Any, ...]] = []

        async def message_consumed_tx(self, ctx: HookContext, info: stead.extend.MessageConsumedInfo) -> None:
            self.rows.append(("consumed", info.message.id, info.message.text))

        async def tool_result_tx(self, ctx: HookContext, info: ToolResultInfo) -> None:
            self.rows.append(("result", info.call.id, info.result.output))

        async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
            self.rows.append(("settled", ctx.run_id, info.error, info.outcome))

    audit, typed = Audit(), Typed()
    provider = ScriptedProvider(tool_loop("add", 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        system = await stead.open(
            db_url, providers={"p": provider}, tools=[add], hooks=[audit, typed], records=False
        )
    async with system:
        agent = await system.create(provider="p", tools=["add"])
        result = await agent.run("go")
    assert sorted(str(w.message).split("(")[0] for w in caught) == [
        "test_a_positional_override_sees_in_a_run_what_it_saw_before.<locals>.Audit.message_consumed_tx",
        "test_a_positional_override_sees_in_a_run_what_it_saw_before.<locals>.Audit.settled_tx",
        "test_a_positional_override_sees_in_a_run_what_it_saw_before.<locals>.Audit.tool_result_tx",
    ]
    assert {w.filename for w in caught} == {__file__}  # the warning points at the override
    assert audit.rows == typed.rows
    assert [r[0] for r in audit.rows] == ["consumed", "result", "result", "settled"]
    assert audit.rows[-1] == ("settled", result.run_id, None, stead.Outcome.COMPLETED)


# ------------------------------------------------------------------------------------------ SettledInfo
async def test_settled_info_gives_each_runs_final_text_and_its_result(db_url: str) -> None:
    seen: list[tuple[str, SettledInfo]] = []
    observed = asyncio.Event()

    class Notify(stead.Hooks):
        async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
            seen.append(("tx", info))

        async def settled(self, ctx: HookContext, info: SettledInfo) -> None:
            seen.append(("after", info))
            observed.set()

    provider = ScriptedProvider(tool_loop("add", 2))
    async with await stead.open(
        db_url, providers={"p": provider}, tools=[add], hooks=[Notify()], records=False
    ) as system:
        agent = await system.create(provider="p", tools=["add"])
        results = []
        for text in ("go", "again"):
            results.append(await agent.run(text))
            await asyncio.wait_for(observed.wait(), TIMEOUT)
            observed.clear()
    assert [kind for kind, _ in seen] == ["tx", "after", "tx", "after"]
    for (_, in_tx), (_, after), result in zip(seen[::2], seen[1::2], results, strict=True):
        assert after is in_tx  # the observing hook gets the same object
        assert in_tx.outcome is stead.Outcome.COMPLETED and in_tx.error is None
        assert in_tx.run_id == result.run_id
        assert in_tx.text == result.text == "done after 2 calls"
        assert in_tx.result == result  # what agent.run returns, from the same records
        assert in_tx.messages == result.messages and in_tx.usage == result.usage
        assert [m.role for m in in_tx.messages] == ["user", *["assistant", "tool"] * 2, "assistant"]


async def test_settled_info_of_an_abort_whose_history_is_not_in_memory(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = asyncio.Event()
    tails: list[str] = []
    read_tail = settle_module._tail

    async def counted(tx: Any, agent_id: str) -> list[dict[str, Any]]:
        tails.append(agent_id)
        return await read_tail(tx, agent_id)

    monkeypatch.setattr(settle_module, "_tail", counted)

    @stead.tool
    async def wait_here() -> str:
        """Wait until cancelled."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    seen: list[SettledInfo] = []

    class Notify(stead.Hooks):
        async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
            seen.append(info)

    provider = ScriptedProvider(lambda r: [stead.Text("working on it"), stead.ToolCall("wait_here", {})])
    async with await stead.open(
        db_url, providers={"p": provider}, tools=[wait_here], hooks=[Notify()], records=False
    ) as system:
        agent = await system.create(provider="p", tools=["wait_here"])
        accepted = await agent.send("go")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        agent._rt.drop_history()  # settlement must read the run's records from the store
        await agent.abort()
        async with system.store.transaction() as tx:
            state = await read_run_state(tx, agent.id, accepted.id)
    assert state is not None and state.result is not None
    assert tails == [agent.id]  # read from the store, not the mirror
    (info,) = seen
    assert info.outcome is stead.Outcome.CANCELLED and info.error == state.result.error
    assert info.text == "working on it"
    assert info.result == state.result


# ------------------------------------------------------------------------------------------- the cost
async def test_no_info_object_is_built_for_a_hook_nobody_overrides(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    sites = {
        response_module: ["BlockInfo"],
        batch_module: [
            "BlockInfo",
            "ToolDispatchedInfo",
            "ToolResultInfo",
            "GateCallInfo",
            "BeforeToolCallInfo",
            "ToolOutputInfo",
            "AwaitingInputInfo",
            "CallDecidedInfo",
        ],
        consume_module: ["MessageConsumedInfo", "PermissionModeChangedInfo"],
        state_module: ["OfferedToolsInfo"],
        inference_module: ["InstructionsInfo", "ModelChangedInfo"],
        settle_module: ["SettledInfo"],
    }
    for module, names in sites.items():
        for name in names:
            original = getattr(module, name)

            def counting(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                built.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, counting)

    class OnlySettled(stead.Hooks):
        async def settled_tx(self, ctx: HookContext, info: SettledInfo) -> None:
            pass

    provider = ScriptedProvider(tool_loop("add", 3))
    async with await stead.open(
        db_url, providers={"p": provider}, tools=[add], hooks=[OnlySettled()], records=False
    ) as system:
        agent = await system.create(provider="p", tools=["add"])
        await agent.run("go", permission_mode="read_only")
    assert built == ["SettledInfo"]


async def test_chained_hooks_each_get_the_previous_answer() -> None:
    class Add(stead.Hooks):
        def __init__(self, name: str) -> None:
            self.name = name

        def offered_tools(self, ctx: HookContext, info: OfferedToolsInfo) -> list[str]:
            return [*info.tools, self.name]

    class Old(stead.Hooks):
        def offered_tools(self, ctx: HookContext, tools: list[str]) -> list[str]:  # type: ignore[override]
            return [*tools, "old"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        hooks = HookSet([Add("a"), Old(), Add("b")])
    assert hooks.offered_tools(_ctx(), OfferedToolsInfo(["t"])) == ["t", "a", "old", "b"]
    assert HookSet([]).offered_tools(_ctx(), OfferedToolsInfo(["t"])) == ["t"]
