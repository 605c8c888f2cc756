"""Options and arguments shared by `stead run` and `stead chat`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["AgentOption", "DefinitionArgument", "MaxPayloadOption", "ModelOption"]

MaxPayloadOption = Annotated[
    int,
    typer.Option(
        "--max-payload-bytes",
        metavar="N",
        min=1,
        help="The largest message accepted, in bytes of JSON (stead.open(max_payload_bytes=...)).",
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="MODEL",
        help="Use this model for every agent the command creates, sub-agents included, instead of the "
        "definitions' models (e.g. openai:gpt-4.1-mini, anthropic:claude-sonnet-4-6, "
        "openai-compatible:llama3.2@http://localhost:11434/v1; see `stead models`). A continued agent "
        "(--agent) switches to it with this message.",
    ),
]
AgentOption = Annotated[
    str | None,
    typer.Option("--agent", metavar="ID", help="Continue this agent instead of creating a new one."),
]
DefinitionArgument = Annotated[
    Path,
    typer.Argument(
        metavar="DIR_OR_FILE",
        help="A definitions directory (then AGENT_NAME names one of them) or one definition file (YAML).",
        show_default=False,
    ),
]
