"""Options and arguments shared by `stead run` and `stead chat`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stead import RetryPolicy

__all__ = [
    "AgentOption",
    "DefinitionArgument",
    "MaxPayloadOption",
    "ModelOption",
    "RetryForOption",
    "retry_policy",
]

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
RetryForOption = Annotated[
    float | None,
    typer.Option(
        "--retry-for",
        metavar="SECONDS",
        min=0,
        envvar="STEAD_RETRY_FOR",
        help="Retry a failing model request (server down, rate limited, cut stream) with backoff for up to "
        "this many seconds before the turn fails (default: 5 attempts, about 6 s). "
        "stead.open(retry=RetryPolicy(max_elapsed=...)).",
    ),
]


def retry_policy(seconds: float | None) -> RetryPolicy | None:
    """The retry policy of `--retry-for SECONDS` (None: the default policy)."""
    return None if seconds is None else RetryPolicy(max_elapsed=seconds)
