"""`stead` commands. Every failure is one clear line on stderr and a non-zero exit, never a traceback
(set `STEAD_DEBUG=1` to see one)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text as RichText

import stead
from stead.cli._render import call_summary, message_json, one_line
from stead.definitions import load_definition, make_provider
from stead.errors import SteadError
from stead.messages import Reasoning, Text, ToolCall, ToolResult

__all__ = ["app", "main"]

T = TypeVar("T")

app = typer.Typer(
    name="stead",
    help="Durable, observable LLM agents. Agents, messages and tool calls live in a database (--db).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        help="SQLite database file holding the agents (created if missing).",
        envvar="STEAD_DB",
        show_default=True,
    ),
]
DEFAULT_DB = Path("stead.db")


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    _err().print(RichText("error: ", style="bold red") + RichText(message))
    raise typer.Exit(code)


def _url(db: Path) -> str:
    return f"sqlite:///{db}"


def _execute(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine; turn stead errors and interrupts into one-line messages and exit codes."""
    try:
        return asyncio.run(make())
    except typer.Exit:
        raise
    except SteadError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted (accepted work is durable: continue it with --agent ID)", 130)
    except Exception as e:
        if os.environ.get("STEAD_DEBUG"):
            traceback.print_exc()
        _fail(f"unexpected {type(e).__name__}: {e} (set STEAD_DEBUG=1 for a traceback)")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"stead {stead.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """stead: durable, observable LLM agents."""


# ---------------------------------------------------------------------------------------------------- run
@dataclass
class _Printer:
    """Streams an agent's events: text to stdout, tool activity dimmed on stderr."""

    err: Console
    at_line_start: bool = True
    streamed: bool = False
    failures: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)

    def _out(self, text: str) -> None:
        if not text:
            return
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self.at_line_start:
            self._out("\n")

    def _note(self, text: str, style: str = "dim") -> None:
        self._newline()
        self.err.print(RichText(text, style=style))

    def handle(self, ev: stead.Event) -> None:
        if isinstance(ev, stead.TextDelta):
            self._out(ev.text)
            self.streamed = True
        elif isinstance(ev, stead.BlockEnd):
            block = ev.block
            if isinstance(block, Text):
                if not self.streamed:
                    self._out(block.text)
                self._newline()
            elif isinstance(block, ToolCall) and block.id is not None:
                self.names[block.id] = block.name
            elif isinstance(block, Reasoning) and block.text and not block.redacted:
                self._note(f"(thinking) {one_line(block.text)}", "dim italic")
            self.streamed = False
        elif isinstance(ev, stead.BlockReset):
            self.streamed = False
            self._note("[the partial response above was dropped; the model is asked again]", "yellow")
        elif isinstance(ev, stead.ToolStarted):
            call: ToolCall = ev.call
            if call.id is not None:
                self.names[call.id] = call.name
            self._note(f"→ {call_summary(call)}")
        elif isinstance(ev, stead.ToolFinished):
            result: ToolResult = ev.result
            name = self.names.get(result.call_id, "tool")
            if result.is_error:
                self._note(f"✗ {name}: {one_line(result.output)}", "red")
            else:
                self._note(f"← {name}: {one_line(result.output)}")
        elif isinstance(ev, stead.Activated):
            if ev.restored:
                self._note("resuming work left unfinished by a previous process")
        elif isinstance(ev, stead.Done):
            if ev.reason == "error":
                self.failures.append(ev.error or "the model's response ended with an error")
            elif ev.reason == "length":
                self._note("[the response was cut off at the model's length limit]", "yellow")
        elif isinstance(ev, stead.Settled) and ev.error is not None:
            self.failures.append(ev.error)


async def _run(definition_path: Path, message: str | None, agent_id: str | None, db: Path) -> str:
    definition = load_definition(definition_path)
    provider = make_provider(definition)
    tools = definition.resolved_tools
    printer = _Printer(_err())
    # Resume only the agent this command targets: other agents in the file belong to other definitions.
    system = await stead.open(
        _url(db),
        providers={definition.provider_name: provider},
        tools=tools,
        restore=[agent_id] if agent_id is not None else False,
    )
    consumer: asyncio.Task[None] | None = None
    try:
        if agent_id is not None:
            agent = await system.get(agent_id)
        else:
            agent = await system.create(
                provider=definition.provider_name,
                model=definition.model_name,
                instructions=definition.instructions,
                tools=[t.name for t in tools],
                name=definition.name,
                extra={"definition": str(definition.source)},
            )
        stream = agent.events()

        async def consume() -> None:
            async for ev in stream:
                printer.handle(ev)

        consumer = asyncio.get_running_loop().create_task(consume())
        if message is not None:
            await agent.send(message)
        elif not agent.active:
            printer._note(f"agent {agent.id} has no unfinished work")
        await agent.wait_idle()
        still_owed = agent.active
        settings = agent.settings
    finally:
        await system.close()  # ends the event stream after every event already emitted
        if consumer is not None:
            await consumer
    printer._newline()
    if printer.failures:
        _note_agent(printer.err, agent.id)
        _fail(f"the turn failed: {printer.failures[-1]}")
    if still_owed:
        _note_agent(printer.err, agent.id)
        _fail(
            f"agent {agent.id} still owes work that this definition cannot serve "
            f"(its provider is {settings.get('provider')!r}, model {settings.get('model')!r})"
        )
    return agent.id


def _note_agent(err: Console, agent_id: str) -> None:
    err.print(RichText(f"agent: {agent_id}", style="dim"))


@app.command()
def run(
    definition: Annotated[Path, typer.Argument(help="Agent definition file (YAML).", show_default=False)],
    message: Annotated[
        str | None,
        typer.Argument(
            help="The message to send. Omit it with --agent to only finish work a stopped process left.",
            show_default=False,
        ),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Continue this agent instead of creating a new one.")
    ] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Send MESSAGE to an agent built from DEFINITION and stream its answer.

    The answer goes to stdout; tool calls, results and the agent id go to stderr. Work a killed process
    left unfinished is resumed first (every agent in the database that owes work and whose provider this
    definition provides is resumed)."""
    if message is None and agent is None:
        _fail("MESSAGE is required (it may be omitted only with --agent ID, to resume unfinished work)", 2)
    agent_id = _execute(lambda: _run(definition, message, agent, db))
    _note_agent(_err(), agent_id)


# ---------------------------------------------------------------------------------------------------- agents
async def _agents(db: Path) -> list[stead.AgentInfo]:
    async with await stead.open(_url(db), restore=False) as system:
        return await system.agents()


@app.command()
def agents(
    db: DbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the agents in the database."""
    infos = _execute(lambda: _agents(db))
    if as_json:
        rows = [{"id": a.id, "name": a.name, "active": a.active, "created_at": a.created_at} for a in infos]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not infos:
        _err().print(RichText(f"no agents in {db}", style="dim"))
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("id", no_wrap=True)
    table.add_column("name")
    table.add_column("active")
    table.add_column("created", no_wrap=True)
    for a in infos:
        created = datetime.datetime.fromtimestamp(a.created_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(a.id, a.name or "", "yes" if a.active else "no", created)
    _out().print(table)


# ---------------------------------------------------------------------------------------------------- history
async def _history(agent_id: str, db: Path) -> list[stead.Message]:
    async with await stead.open(_url(db), restore=False) as system:
        agent = await system.get(agent_id)
        return await agent.history()


_ROLE_STYLE = {
    "user": "bold green",
    "assistant": "bold cyan",
    "tool": "bold magenta",
    "system": "bold yellow",
}


@app.command()
def history(
    agent_id: Annotated[str, typer.Argument(metavar="AGENT_ID", help="The agent's id.", show_default=False)],
    db: DbOption = DEFAULT_DB,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of messages with typed content blocks.")
    ] = False,
) -> None:
    """Print an agent's conversation: messages, tool calls with arguments, and results."""
    messages = _execute(lambda: _history(agent_id, db))
    if as_json:
        typer.echo(json.dumps([message_json(m) for m in messages], indent=2, ensure_ascii=False))
        return
    out = _out()
    names: dict[str, str] = {}
    for m in messages:
        out.print(RichText(m.role, style=_ROLE_STYLE.get(m.role, "bold")))
        for b in m.content:
            if isinstance(b, Text):
                out.print(RichText(_indent(b.text)))
            elif isinstance(b, Reasoning):
                out.print(RichText(_indent("(thinking) " + b.text), style="dim italic"))
            elif isinstance(b, ToolCall):
                if b.id is not None:
                    names[b.id] = b.name
                out.print(RichText(_indent(f"→ {call_summary(b, 2000)}"), style="cyan"))
            elif isinstance(b, ToolResult):
                name = names.get(b.call_id, "tool")
                style = "red" if b.is_error else ""
                mark = "✗" if b.is_error else "←"
                out.print(RichText(_indent(f"{mark} {name}: {b.output}"), style=style))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines() or [""])


def main() -> None:
    """Entry point of the `stead` console script."""
    app()
