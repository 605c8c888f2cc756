"""`stead` commands. Every failure is one clear line on stderr and a non-zero exit, never a traceback
(set `STEAD_DEBUG=1` to see one)."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text as RichText

import stead
from stead.cli._approvals import approvals_app, print_waiting
from stead.cli._chat import chat
from stead.cli._common import (
    DEFAULT_DB,
    DbOption,
    Interrupted,
    ReadDbOption,
    Records,
    SteadCommand,
    SteadGroup,
    err,
    execute,
    fail,
    inspect_db,
    out,
    owner_url,
    quiet_broken_pipe,
)
from stead.cli._memory import memory_app
from stead.cli._models import models as _models_command
from stead.cli._options import (
    AgentOption,
    DefinitionArgument,
    MaxPayloadOption,
    ModelOption,
    RetryForOption,
)
from stead.cli._printer import Printer, TeamProgress
from stead.cli._render import print_history
from stead.cli._runs import runs_app
from stead.cli._serve import serve as _serve_command
from stead.cli._signals import Stopper
from stead.cli._source import (
    Source,
    check_input,
    create_or_get,
    load_source,
    message_switch,
    open_owner,
    read_message,
    split_args,
)
from stead.cli._talk import talk as _talk_command
from stead.cli._worker import worker as _worker_command
from stead.extend import message_json

__all__ = ["WAITING_EXIT", "app", "main"]

WAITING_EXIT = 3
"""`stead run`'s exit code when the agent stopped to wait for approvals (decide, then run it again)."""

app = typer.Typer(
    name="stead",
    help="Durable, observable LLM agents. Agents, messages and tool calls live in a database (--db).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=SteadGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"stead {stead.__version__}")
        raise typer.Exit()


@app.callback(cls=SteadGroup)
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """stead: durable, observable LLM agents."""


# ---------------------------------------------------------------------------------------------------- run
async def _run(
    source: Source,
    message: str | None,
    agent_id: str | None,
    db: str,
    model: str | None,
    max_payload_bytes: int,
    retry_for: float | None = None,
) -> str:
    """Run one message through an agent built from `source` and wait until it has nothing left to do.

    Ctrl-C or SIGTERM drains (the agent stops at its next safe point; nothing accepted is lost) and exits
    130 or 143 naming the agent to continue; a second Ctrl-C exits at once."""
    printer = Printer(err())
    progress = TeamProgress(printer)
    stopper = Stopper(printer)
    loop = asyncio.get_running_loop()
    stopper.install(loop)
    consumer: asyncio.Task[None] | None = None
    agent: stead.Agent | None = None
    try:
        system = await open_owner(
            source,
            db,
            agent_id,
            model=model,
            hooks=[progress],
            max_payload_bytes=max_payload_bytes,
            retry_for=retry_for,
        )
        progress.system = system
        try:
            if stopper.stopping:  # interrupted while opening: create nothing
                raise Interrupted(stopper.code, agent_id)
            agent = await create_or_get(system, source, agent_id)
            stopper.agent_id = progress.root = agent.id
            stream = agent.events()

            async def consume() -> None:
                async for ev in stream:
                    printer.handle(ev)

            consumer = loop.create_task(consume())
            if message is not None and not stopper.stopping:
                await agent.send(message, model=message_switch(agent, model))
            elif not agent.active:
                printer.note(f"agent {agent.id} has no unfinished work")
            await stopper.until(agent.wait_idle())
            still_owed = agent.active
            settings = agent.settings
            waiting = await agent.approvals() if agent.state == "waiting" else []
        finally:
            await system.close()  # drains; ends the event stream after every event already emitted
            if consumer is not None:
                await consumer
    finally:
        stopper.remove(loop)
    printer.newline()
    if stopper.code:
        raise Interrupted(stopper.code, agent.id if agent is not None else None)
    assert agent is not None
    if printer.failures:
        _note_agent(printer.err, agent.id)
        fail(f"the turn failed: {printer.failures[-1]}")
    if waiting:  # the run is durable and waits for decisions: say how to give them, then how to continue
        print_waiting(waiting, db)
        _note_agent(printer.err, agent.id)
        raise typer.Exit(WAITING_EXIT)
    if still_owed:
        _note_agent(printer.err, agent.id)
        fail(
            f"agent {agent.id} still owes work that this definition cannot serve "
            f"(its provider is {settings.get('provider')!r}, model {settings.get('model')!r})"
        )
    return agent.id


def _note_agent(err: Console, agent_id: str) -> None:
    err.print(RichText(f"agent: {agent_id}", style="dim"))


@app.command(cls=SteadCommand, short_help="Send a message to an agent and stream its answer.")
def run(
    definition: DefinitionArgument,
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[AGENT_NAME] [MESSAGE]",
            help="With a directory: the definition to run, then the message. With a file: the message. "
            "'-' reads the message from standard input, @FILE from a file. Omit the message with --agent "
            "to only finish work a stopped process left.",
            show_default=False,
        ),
    ] = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    db: DbOption = DEFAULT_DB,
    max_payload_bytes: MaxPayloadOption = 1_000_000,
    retry_for: RetryForOption = None,
) -> None:
    """Send MESSAGE to an agent built from a definition and stream its answer.

    `stead run examples/team orchestrator "..."` runs the `orchestrator` of a definitions directory (its
    sub-agents' calls are shown as they happen); `stead run agent.yaml "..."` runs a single definition
    file. Both build the agent the same way: instructions rendered, limits applied, the first usable model
    candidate chosen.

    The answer goes to stdout; tool calls, results and the agent id go to stderr. Work a killed process
    left unfinished is resumed first. Ctrl-C (or SIGTERM) stops the agent at its next safe point and
    exits; a second Ctrl-C exits at once. Either way, accepted work is durable: continue it with --agent."""
    agent_name, raw = split_args(definition, list(args or []), agent)
    message = read_message(raw)
    if message is None and agent is None:
        fail("MESSAGE is required (it may be omitted only with --agent ID, to resume unfinished work)", 2)
    check_input(message, max_payload_bytes)
    owner_url(db, "stead run", create=True)
    source = load_source(definition, agent_name, agent)
    agent_id = execute(lambda: _run(source, message, agent, db, model, max_payload_bytes, retry_for))
    _note_agent(err(), agent_id)


# ---------------------------------------------------------------------------------------------------- agents
async def _agents(db: str) -> tuple[list[stead.AgentInfo], dict[str, tuple[str | None, int]] | None]:
    """The agents, and on a PostgreSQL store each one's (owner worker id or None, epoch)."""
    async with inspect_db(db) as system:
        infos = await system.agents()
        fleet = system.store.capabilities.fleet
        owners = None if fleet is None else await fleet.owners()
        return infos, owners


@app.command(cls=SteadCommand, short_help="List the agents in the database.")
def agents(
    db: ReadDbOption = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the agents in the database: id, name, whether each one owes work, when it was created.

    Reads the database without owning it, also while another process runs agents in it."""
    infos, owners = execute(lambda: _agents(db))
    if as_json:
        rows: list[dict[str, object]] = [
            {"id": a.id, "name": a.name, "active": a.active, "created_at": a.created_at} for a in infos
        ]
        if owners is not None:
            for row in rows:
                row["owner"], row["epoch"] = owners.get(str(row["id"]), (None, 0))
        typer.echo(json.dumps(rows, indent=2))
        return
    if not infos:
        err().print(RichText(f"no agents in {db}", style="dim"))
        return
    columns = ["id", "name", "active", "created", *(["owner (epoch)"] if owners is not None else [])]
    table = Records(columns, ids=("id", "owner (epoch)"), keep=("active", "created"))
    for a in infos:
        created = datetime.datetime.fromtimestamp(a.created_at).strftime("%Y-%m-%d %H:%M:%S")
        cells = [a.id, a.name or "", "yes" if a.active else "no", created]
        if owners is not None:
            owner, epoch = owners.get(a.id, (None, 0))
            cells.append(f"{owner or '-'} ({epoch})")
        table.add_row(*cells)
    out().print(table)


async def _history(agent_id: str, db: str, archived: bool = False) -> list[stead.Message]:
    async with inspect_db(db) as system:
        agent = await system.get(agent_id)
        return await agent.history(include_archived=archived)


@app.command(cls=SteadCommand, short_help="Print an agent's conversation.")
def history(
    agent_id: Annotated[str, typer.Argument(metavar="AGENT_ID", help="The agent's id.", show_default=False)],
    db: ReadDbOption = DEFAULT_DB,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of messages with typed content blocks.")
    ] = False,
    archived: Annotated[
        bool,
        typer.Option(
            "--all", help="Include what compactions archived: every message, originals, summaries in place."
        ),
    ] = False,
) -> None:
    """Print an agent's conversation: messages, tool calls with arguments, and results.

    Reads the database without owning it, also while another process runs the agent."""
    messages = execute(lambda: _history(agent_id, db, archived))
    if as_json:
        typer.echo(json.dumps([message_json(m, sparse=True) for m in messages], indent=2, ensure_ascii=False))
        return
    print_history(out(), messages)


app.command(name="chat", cls=SteadCommand, short_help="Talk with an agent; typing while it works steers it.")(
    chat
)
app.command(name="models", cls=SteadCommand, short_help="List the model catalog and what is usable now.")(
    _models_command
)
app.add_typer(runs_app, name="runs", short_help="List recorded runs, or show one as a tree.")
app.add_typer(memory_app, name="memory", short_help="Long-term memory: list, search, add, promote, delete.")
app.command(name="serve", cls=SteadCommand, short_help="Serve agents over HTTP (REST, streams, viewer).")(
    _serve_command
)
app.command(name="talk", cls=SteadCommand, short_help="Talk with a realtime co-agent (text in, text out).")(
    _talk_command
)
app.command(name="worker", cls=SteadCommand, short_help="Run agents as one worker of a PostgreSQL fleet.")(
    _worker_command
)
app.add_typer(approvals_app, name="approvals", short_help="List, approve or reject held tool calls.")


def main() -> None:
    """Entry point of the `stead` console script. A stdout closed by its reader (`| head`) ends quietly."""
    try:
        app()
    except BrokenPipeError:  # pragma: no cover - click usually handles EPIPE itself
        quiet_broken_pipe()
        raise SystemExit(0) from None
