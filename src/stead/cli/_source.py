"""What `stead run` and `stead chat` share: the definition source, the message, and the agent.

One path builds every agent. A definitions directory is a registry; a single definition file becomes a
one-definition registry (or, when it lists sub-agents, its directory's registry). Either way the agent is
created with `system.create(definition=NAME)`, so file mode and directory mode give the same agent: the
instructions rendered by Jinja2 (undefined names are errors), `limits:` applied as guardrails, and model
candidates tried in order (the first one that can be served now is used). `--model` replaces the model
of every agent the command creates, sub-agents included.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import stead
from stead.agent import check_message
from stead.cli._common import fail, owner_url
from stead.cli._models import check_model
from stead.cli._options import retry_policy
from stead.definitions import AgentDefinition, Registry, load_definition, load_registry
from stead.errors import ConfigurationError, InvalidInput, SteadError
from stead.orchestration import orchestrator_of
from stead.providers.router import ModelRouter

__all__ = [
    "PAYLOAD_HINT",
    "Source",
    "check_exists",
    "create_or_get",
    "load_source",
    "open_owner",
    "read_message",
]

PAYLOAD_HINT = "raise it with --max-payload-bytes"


@dataclass
class Source:
    """Definitions to run: `registry` and the `name` of the one to create (None: `--agent` only).
    `team` (a directory, or a file with sub-agents): every agent owing work is resumed on open, the
    sub-agents of an interrupted delegation included; otherwise only the agent named by `--agent`."""

    path: Path
    registry: Registry
    name: str | None
    team: bool


def check_exists(definition: Path) -> None:
    """A mistyped DIR_OR_FILE is named as such (exit 2), before its other arguments are read."""
    if not definition.exists():
        fail(f"{definition}: no such file or directory (DIR_OR_FILE: a definitions directory or file)", 2)


def _names(directory: Path) -> str:
    try:
        return ", ".join(sorted(load_registry(directory)))
    except SteadError:
        return "see the directory's definition files"


def split_args(definition: Path, args: list[str], agent_id: str | None) -> tuple[str | None, str | None]:
    """`[AGENT_NAME] [MESSAGE]` after DIR_OR_FILE → (agent name, message); usage errors exit 2."""
    check_exists(definition)
    rest = list(args)
    agent_name: str | None = None
    if definition.is_dir():
        usage = f"stead run {definition} AGENT_NAME MESSAGE"
        if agent_id is None:
            if not rest:
                fail(
                    f"AGENT_NAME is required with a definitions directory: {usage} (definitions: "
                    f"{_names(definition)})",
                    2,
                )
            if len(rest) == 1 and not _defines(definition, rest[0]):
                fail(
                    f"AGENT_NAME is required before the message with a definitions directory: {usage}; "
                    f"{rest[0]!r} names none of its definitions ({_names(definition)})",
                    2,
                )
            agent_name = rest.pop(0)
        elif len(rest) == 2:
            agent_name = rest.pop(0)
    if len(rest) > 1:
        fail(f"too many arguments: {' '.join(repr(a) for a in rest)} (quote the message)", 2)
    return agent_name, (rest[0] if rest else None)


def _defines(directory: Path, name: str) -> bool:
    """Whether `name` is a definition of the directory (unknown when it does not load: the load says why)."""
    try:
        return name in load_registry(directory)
    except SteadError:
        return True


def load_source(path: Path, agent_name: str | None, agent_id: str | None) -> Source:
    """Load the definitions; a `DefinitionError` (file:line: ...) exits 1."""
    check_exists(path)
    try:
        if path.is_dir():
            registry = load_registry(path)
            team = True
        else:
            definition = load_definition(path)
            if definition.sub_agents:
                registry, team = load_registry(path.parent), True
            else:
                registry, team = Registry(path.parent, {definition.name: definition}), False
            agent_name = definition.name
    except SteadError as e:
        fail(str(e))
    if agent_id is None and agent_name is not None and agent_name not in registry:
        known = ", ".join(sorted(registry))
        fail(f"no definition named {agent_name!r} in {path} (definitions: {known})")
    return Source(path, registry, agent_name, team)


def read_message(message: str | None) -> str | None:
    """`-` reads the message from standard input, `@FILE` from a file (`@@text` sends `@text`)."""
    if message is None:
        return None
    if message == "-":
        if sys.stdin is None or sys.stdin.closed:
            fail("MESSAGE is '-' but standard input is closed", 2)
        return sys.stdin.read()
    if message.startswith("@@"):
        return message[1:]
    if message.startswith("@"):
        file = Path(message[1:])
        try:
            return file.read_text(encoding="utf-8")
        except FileNotFoundError:
            fail(
                f"message file {str(file)!r} not found (@FILE reads the message from FILE; write @@ for a "
                "message that starts with @)",
                2,
            )
        except (OSError, UnicodeDecodeError) as e:
            fail(f"cannot read message file {str(file)!r}: {e}", 2)
    return message


def check_input(message: str | None, max_payload_bytes: int) -> None:
    """Refuse an empty or oversize message before anything is opened or created (exit 2)."""
    if message is None:
        return
    try:
        check_message(message, max_payload_bytes=max_payload_bytes, limit_hint=PAYLOAD_HINT)
    except InvalidInput as e:
        fail(f"MESSAGE: {e}", 2)


async def open_owner(
    source: Source,
    db: str,
    agent_id: str | None,
    *,
    model: str | None,
    hooks: list[stead.Hooks],
    max_payload_bytes: int,
    retry_for: float | None = None,
) -> stead.AgentSystem:
    """Open the store as its owner with the source's definitions (their tools and scripted models);
    `retry_for` is `--retry-for` (model requests retried for that many seconds)."""
    if model is not None:
        check_model(model)  # one line naming what to set, before anything is written
    elif agent_id is None and source.name is not None:
        check_definition_model(source.registry[source.name])
    store = owner_url(db, "this command", create=True)
    if agent_id is not None:  # before the owner's open, which resumes the agent
        async with stead.open(store, readonly=True) as inspector:
            check_definition(await inspector.get(agent_id), source)
    restore: bool | list[str] = True if source.team else ([agent_id] if agent_id is not None else False)
    system = await stead.open(
        store,
        definitions=source.registry,
        hooks=hooks,
        restore=restore,
        max_payload_bytes=max_payload_bytes,
        retry=retry_policy(retry_for),
    )
    if model is not None:
        orchestrator_of(system).model_override = model
    return system


def check_definition_model(definition: AgentDefinition) -> None:
    """The definition's model, checked as `create` will choose it (its first usable candidate), before
    anything is opened or started (MCP servers included): a missing key is one line at once."""
    try:
        ModelRouter({}).resolve(definition.candidates, base_dir=definition.base_dir)
    except ConfigurationError as e:
        fail(f"definition {definition.name!r}: {e}")


async def create_or_get(system: stead.AgentSystem, source: Source, agent_id: str | None) -> stead.Agent:
    """Continue agent `agent_id` (resumed if it owes work), or create one from the source's definition."""
    if agent_id is not None:
        return await system.get(agent_id, resume=True)
    assert source.name is not None
    return await system.create(definition=source.name)


def check_definition(agent: stead.Agent, source: Source) -> None:
    """Refuse (exit 1, one line) to continue `agent` with definitions that do not include the one it was
    created from (`extra["stead.definition"]`), before it runs: its tools would be unknown here. An agent
    created without a definition is not checked."""
    extra = agent.config.extra
    created = extra.get("stead.definition")
    if not isinstance(created, str):
        return
    if created in source.registry and (source.team or source.name in (None, created)):
        return
    origin = extra.get("definition")
    own = origin if isinstance(origin, str) and origin != created else "ITS_DEFINITION"
    given = f"{source.name!r} ({source.path})" if source.name is not None else str(source.path)
    fail(
        f"agent {agent.id} was created from definition {created!r}, not {given}: continue it with its own "
        f"definition (stead run {own} --agent {agent.id})"
    )


def message_switch(agent: stead.Agent, model: str | None) -> str | None:
    """The `model=` to send with: `--model` switches a continued agent to it with this message."""
    if model is None or agent.settings.get("model") == model:
        return None
    return model
