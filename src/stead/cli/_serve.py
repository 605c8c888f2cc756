"""`stead serve`: the HTTP service (REST, resumable SSE, the run viewer) over one database.

The process owns the store (SQLite: the file lock) and runs the agents itself. Without `--tokens` there is
no authentication, so the service listens on loopback only and says so."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text as RichText

from stead.cli._common import DEFAULT_DB, err, execute, fail

__all__ = ["serve"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port(host: str, port: int) -> None:
    """Bind the address once before anything is opened or printed: a busy port is one line, exit 1."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")


def _url(db: str) -> str:
    return db if "://" in db else f"sqlite:///{db}"


async def _serve(db: str, definitions: Path | None, host: str, port: int, tokens: Path | None) -> None:
    try:
        import stead.server as server
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        fail(f"stead serve needs the server extra: pip install 'stead[server]' ({e})")
    auth = server.load_tokens(tokens) if tokens is not None else None
    system = await server.open(_url(db), definitions=definitions)
    try:
        app = server.create_app(system, auth=auth)
        note = (
            f"{len(auth.tokens)} token(s) from {tokens}"
            if auth is not None
            else "no --tokens: no authentication, loopback only, one implicit tenant"
        )
        err().print(RichText(f"stead: serving http://{host}:{port} (viewer: /ui, API: /docs) — {note}"))
        await server.serve(app, host=host, port=port, log_level="info")
    finally:
        await system.close()


def serve(
    db: Annotated[
        str,
        typer.Option(
            "--db",
            help="The database: a SQLite file, created if missing (its directory must exist), or a store "
            "URL (sqlite:///file.db, postgresql://user@host/dbname).",
            envvar="STEAD_DB",
            show_default=True,
        ),
    ] = str(DEFAULT_DB),
    definitions: Annotated[
        Path | None, typer.Option("--definitions", help="A directory of agent definitions to serve.")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
    tokens: Annotated[
        Path | None,
        typer.Option("--tokens", help="A token file (YAML): tokens, tenants, scopes (docs/server.md)."),
    ] = None,
) -> None:
    """Serve the agents of a database over HTTP: REST, resumable event streams and the run viewer (/ui)."""
    if tokens is None and not _loopback(host):
        fail(
            f"refusing to listen on {host} without --tokens: an unauthenticated service listens on "
            "loopback only (127.0.0.1, ::1, localhost)",
            2,
        )
    _check_port(host, port)
    execute(lambda: _serve(db, definitions, host, port, tokens))
