"""The payload limit error names the option that raises it (issue 9): `stead.open(max_payload_bytes=...)`
for the library (the CLI's `--max-payload-bytes` is pinned in tests/cli/test_cli_newcomer.py)."""

from __future__ import annotations

import pytest

import stead
from stead.agent import check_message
from stead.providers.scripted import ScriptedProvider


async def test_payload_limit_error_names_stead_open_max_payload_bytes(db_url: str) -> None:
    provider = ScriptedProvider(lambda r: [stead.Text("ok")])
    async with stead.open(db_url, providers={"scripted": provider}, max_payload_bytes=100) as system:
        agent = await system.create(provider="scripted")
        with pytest.raises(stead.InvalidInput) as info:
            await agent.send("x" * 500)
        assert str(info.value).endswith(
            "the limit is 100 bytes (raise it with stead.open(max_payload_bytes=...))"
        )


def test_check_message_refuses_what_send_would_refuse_without_an_agent() -> None:
    for content in ("", "  \n", []):
        with pytest.raises(stead.InvalidInput, match="message content is empty"):
            check_message(content, max_payload_bytes=100)
    with pytest.raises(stead.InvalidInput, match=r"the limit is 10 bytes \(raise it with --x\)"):
        check_message("x" * 50, max_payload_bytes=10, limit_hint="raise it with --x")
    check_message("fine", max_payload_bytes=100)
