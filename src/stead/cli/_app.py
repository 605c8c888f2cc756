"""`stead` commands. Every failure is one clear line on stderr and a non-zero exit, never a traceback
(set `STEAD_DEBUG=1` to see one)."""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text as RichText

import stead
from stead.cli._common import DEFAULT_DB, DbOption, err, execute, fail, out, url
from stead.cli._models import check_model, run_providers
from stead.cli._models import models as _models_command
from stead.cli._render import call_summary, message_json, one_line
from stead.cli._runs import runs_app
from stead.cli._talk import talk as _talk_command
from stead.definitions import AgentDefinition, Registry, load_definition, load_registry
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


class _TeamProgress(stead.Hooks):
    """Shows the tool and sub-agent calls of sub-agents (the root's own are shown by `_Printer`), indented
    by their depth in the delegation tree, on stderr as they start and finish."""

    def __init__(self, printer: _Printer) -> None:
        self.printer = printer
        self.root: str | None = None
        self.system: stead.AgentSystem | None = None
        self.names: dict[str, str] = {}

    def _who(self, agent_id: str) -> tuple[str, int]:
        agent = self.system.loaded(agent_id) if self.system is not None else None
        if agent is None:
            return agent_id, 1
        config = agent.config
        chain = config.extra.get("stead.chain")
        depth = len(chain) - 1 if isinstance(chain, list) and chain else 1
        return config.name or agent_id, max(depth, 1)

    def on_event(self, agent_id: str, event: stead.Event) -> None:
        if agent_id == self.root or self.root is None:
            return
        if not isinstance(event, stead.ToolStarted | stead.ToolFinished | stead.Settled):
            return
        name, depth = self._who(agent_id)
        pad = "  " * depth
        if isinstance(event, stead.ToolStarted):
            call: ToolCall = event.call
            if call.id is not None:
                self.names[call.id] = call.name
            self.printer._note(f"{pad}{name} → {call_summary(call)}")
        elif isinstance(event, stead.ToolFinished):
            result: ToolResult = event.result
            tool_name = self.names.pop(result.call_id, "tool")
            if result.is_error:
                self.printer._note(f"{pad}{name} ✗ {tool_name}: {one_line(result.output)}", "red")
            else:
                self.printer._note(f"{pad}{name} ← {tool_name}: {one_line(result.output)}")
        elif event.error is not None:
            self.printer._note(f"{pad}{name} failed: {one_line(event.error)}", "red")


def _load_source(
    source: Path, agent_name: str | None, agent_id: str | None
) -> tuple[Registry | None, AgentDefinition | None, str | None]:
    """A definitions directory (a registry) or one definition file; a file that lists sub-agents brings
    its directory along (its references are checked)."""
    registry: Registry | None = None
    definition: AgentDefinition | None = None
    if source.is_dir():
        registry = load_registry(source)
    else:
        definition = load_definition(source)
        if definition.sub_agents:
            registry = load_registry(source.parent)
            agent_name = definition.name
    if registry is not None and agent_id is None and agent_name is not None and agent_name not in registry:
        known = ", ".join(sorted(registry))
        raise stead.ConfigurationError(
            f"no definition named {agent_name!r} in {source} (definitions: {known})"
        )
    return registry, definition, agent_name


async def _run(
    registry: Registry | None,
    definition: AgentDefinition | None,
    agent_name: str | None,
    message: str | None,
    agent_id: str | None,
    db: Path,
    model: str | None = None,
) -> str:
    """Run one message through an agent of a definitions directory or of one definition file.
    `model` (`--model`) overrides the definition's model: new agents are created with it, existing ones
    switch to it with this message."""
    if model is not None:
        check_model(model)  # one line naming what to set, before anything is written
    printer = _Printer(err())
    progress = _TeamProgress(printer)
    if registry is not None:
        # every agent that owes work is resumed: sub-agents of an interrupted delegation included
        system = await stead.open(url(db), definitions=registry, hooks=[progress])
    else:
        assert definition is not None
        # Resume only the agent this command targets: other agents in the file belong to other definitions.
        system = await stead.open(
            url(db),
            providers=run_providers(definition, model),
            tools=definition.resolved_tools,
            restore=[agent_id] if agent_id is not None else False,
        )
    progress.system = system
    consumer: asyncio.Task[None] | None = None
    try:
        if agent_id is not None:
            agent = await system.get(agent_id)
        elif registry is not None:
            assert agent_name is not None
            agent = await system.create(definition=agent_name)
        else:
            assert definition is not None
            agent = await system.create(
                provider=definition.provider_name if model is None else None,
                model=definition.model_name if model is None else model,
                instructions=definition.instructions,
                tools=[t.name for t in definition.resolved_tools],
                name=definition.name,
                extra={"definition": str(definition.source)},
            )
        progress.root = agent.id
        stream = agent.events()

        async def consume() -> None:
            async for ev in stream:
                printer.handle(ev)

        consumer = asyncio.get_running_loop().create_task(consume())
        if message is not None:
            switch = model is not None and agent.settings.get("model") != model
            await agent.send(message, model=model if switch else None)
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
        fail(f"the turn failed: {printer.failures[-1]}")
    if still_owed:
        _note_agent(printer.err, agent.id)
        fail(
            f"agent {agent.id} still owes work that this definition cannot serve "
            f"(its provider is {settings.get('provider')!r}, model {settings.get('model')!r})"
        )
    return agent.id


def _note_agent(err: Console, agent_id: str) -> None:
    err.print(RichText(f"agent: {agent_id}", style="dim"))


@app.command()
def run(
    definition: Annotated[
        Path,
        typer.Argument(
            metavar="DIR_OR_FILE",
            help="A definitions directory (then AGENT_NAME names one of them) or one definition file (YAML).",
            show_default=False,
        ),
    ],
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[AGENT_NAME] MESSAGE",
            help="With a directory: the definition to run, then the message. With a file: the message. "
            "Omit the message with --agent to only finish work a stopped process left.",
            show_default=False,
        ),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Continue this agent instead of creating a new one.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Use this model instead of the definition's (openai:gpt-4.1-mini, "
            "anthropic:claude-sonnet-4-6, openai-compatible:llama3.2@http://localhost:11434/v1; "
            "see `stead models`).",
        ),
    ] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Send MESSAGE to an agent built from a definition and stream its answer.

    `stead run examples/team orchestrator "..."` runs the `orchestrator` of a definitions directory (its
    sub-agents' calls are shown as they happen); `stead run agent.yaml "..."` runs a single definition file.
    The answer goes to stdout; tool calls, results and the agent id go to stderr. Work a killed process left
    unfinished is resumed first."""
    rest = list(args or [])
    agent_name: str | None = None
    if definition.is_dir():
        if agent is None:
            if not rest:
                fail("AGENT_NAME is required with a definitions directory", 2)
            agent_name = rest.pop(0)
        elif len(rest) == 2:
            agent_name = rest.pop(0)
    if len(rest) > 1:
        fail(f"too many arguments: {' '.join(repr(a) for a in rest)} (quote the message)", 2)
    message = rest[0] if rest else None
    if message is None and agent is None:
        fail("MESSAGE is required (it may be omitted only with --agent ID, to resume unfinished work)", 2)
    try:
        registry, loaded, agent_name = _load_source(definition, agent_name, agent)
    except SteadError as e:
        fail(str(e))
    if registry is not None and model is not None:
        fail("--model works with a single definition file; a team takes its models from its definitions", 2)
    agent_id = execute(lambda: _run(registry, loaded, agent_name, message, agent, db, model))
    _note_agent(err(), agent_id)


# ---------------------------------------------------------------------------------------------------- agents
async def _agents(db: Path) -> list[stead.AgentInfo]:
    async with await stead.open(url(db), restore=False) as system:
        return await system.agents()


@app.command()
def agents(
    db: DbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the agents in the database."""
    infos = execute(lambda: _agents(db))
    if as_json:
        rows = [{"id": a.id, "name": a.name, "active": a.active, "created_at": a.created_at} for a in infos]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not infos:
        err().print(RichText(f"no agents in {db}", style="dim"))
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("id", no_wrap=True)
    table.add_column("name")
    table.add_column("active")
    table.add_column("created", no_wrap=True)
    for a in infos:
        created = datetime.datetime.fromtimestamp(a.created_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(a.id, a.name or "", "yes" if a.active else "no", created)
    out().print(table)


async def _history(agent_id: str, db: Path) -> list[stead.Message]:
    async with await stead.open(url(db), restore=False) as system:
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
    messages = execute(lambda: _history(agent_id, db))
    if as_json:
        typer.echo(json.dumps([message_json(m) for m in messages], indent=2, ensure_ascii=False))
        return
    console = out()
    names: dict[str, str] = {}
    for m in messages:
        console.print(RichText(m.role, style=_ROLE_STYLE.get(m.role, "bold")))
        for b in m.content:
            if isinstance(b, Text):
                console.print(RichText(_indent(b.text)))
            elif isinstance(b, Reasoning):
                console.print(RichText(_indent("(thinking) " + b.text), style="dim italic"))
            elif isinstance(b, ToolCall):
                if b.id is not None:
                    names[b.id] = b.name
                console.print(RichText(_indent(f"→ {call_summary(b, 2000)}"), style="cyan"))
            elif isinstance(b, ToolResult):
                name = names.get(b.call_id, "tool")
                style = "red" if b.is_error else ""
                mark = "✗" if b.is_error else "←"
                console.print(RichText(_indent(f"{mark} {name}: {b.output}"), style=style))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines() or [""])


app.command(name="models")(_models_command)
app.command(name="talk")(_talk_command)
app.add_typer(runs_app, name="runs")


def main() -> None:
    """Entry point of the `stead` console script."""
    app()
