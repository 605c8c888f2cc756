"""`stead serve`: the HTTP service (REST, resumable SSE, the run viewer) over one database.

The process owns the store (SQLite: the file lock) and runs the agents itself. Without `--tokens` there is
no authentication, so the service listens on loopback only and says so."""

from __future__ import annotations

import ipaddress
import socket
import stat
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text as RichText

from stead.cli._common import DEFAULT_DB, err, execute, fail
from stead.cli._options import RetryForOption, retry_policy

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


def _readable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:
        return False


async def _serve(
    db: str,
    definitions: Path | None,
    host: str,
    port: int,
    tokens: Path | None,
    allow_models: list[str],
    docs: bool,
    retry_for: float | None = None,
) -> None:
    try:
        import stead.server as server
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        fail(f"stead serve needs the server extra: pip install 'stead[server]' ({e})")
    auth = server.load_tokens(tokens) if tokens is not None else None
    if tokens is not None and _readable_by_others(tokens):
        err().print(
            RichText(
                f"stead: warning: the token file {tokens} can be read by other users; "
                f"chmod 600 {tokens} (or list its tokens as sha256: hashes)"
            )
        )
    system = await server.open(_url(db), definitions=definitions, retry=retry_policy(retry_for))
    try:
        app = server.create_app(system, auth=auth, allow_models=allow_models, allowed_hosts=[host], docs=docs)
        note = (
            f"{len(auth.tokens)} token(s) from {tokens}"
            if auth is not None
            else "no --tokens: no authentication, loopback only, one implicit tenant"
        )
        api = "/docs" if docs else "/openapi.json"
        err().print(RichText(f"stead: serving http://{host}:{port} (viewer: /ui, API: {api}) — {note}"))
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
    allow_model: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-model",
            help="Let callers use model strings with a base URL or a scripted file matching this pattern "
            "(repeatable): VENDOR:MODEL@URL (the model may use *; vendor and URL exact) or "
            "scripted:/ABS/PATTERN (docs/security.md).",
        ),
    ] = None,
    docs: Annotated[
        bool,
        typer.Option("--docs", help="Serve /docs (Swagger UI; its script and style load from a CDN)."),
    ] = False,
    retry_for: RetryForOption = None,
) -> None:
    """Serve the agents of a database over HTTP: REST, resumable event streams and the run viewer (/ui)."""
    if tokens is None and not _loopback(host):
        fail(
            f"refusing to listen on {host} without --tokens: an unauthenticated service listens on "
            "loopback only (127.0.0.1, ::1, localhost)",
            2,
        )
    _check_port(host, port)
    execute(lambda: _serve(db, definitions, host, port, tokens, list(allow_model or ()), docs, retry_for))
