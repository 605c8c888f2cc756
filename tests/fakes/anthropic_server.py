"""A fake Anthropic Messages server (`POST /v1/messages`, streaming only).

Streams named SSE events as api.anthropic.com does: `message_start` (input usage, cache reads), `ping`,
per content block `content_block_start` / `content_block_delta` / `content_block_stop` (text_delta,
thinking_delta + signature_delta, redacted_thinking data, tool_use with input_json_delta fragments),
`message_delta` (stop_reason, output usage) and `message_stop`. Errors use Anthropic's
`{"type": "error", "error": {"type", "message"}}` body; an in-stream error is an `event: error`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stead.messages import Reasoning, Text, ToolCall
from tests.fakes import DEFAULT_USAGE, FakeServer, Reply, split, sse

__all__ = ["AnthropicFakeServer", "fake_signature"]

_STOP = {"stop": "end_turn", "tool_call": "tool_use", "length": "max_tokens"}
_DEFAULT_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "model: nope"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


def fake_signature(text: str) -> str:
    """The signature the fake gives a thinking block that the script did not sign."""
    return "sig_" + hashlib.sha256(text.encode()).hexdigest()[:16]


class AnthropicFakeServer(FakeServer):
    path = "/v1/messages"
    vendor = "anthropic"

    def error_body(self, reply: Reply) -> dict[str, Any]:
        status = reply.status or 500
        err_type, message = _DEFAULT_ERRORS.get(status, ("api_error", f"HTTP {status}"))
        return {
            "type": "error",
            "error": {"type": reply.error_type or err_type, "message": reply.error_message or message},
            "request_id": "req_fake",
        }

    def error_headers(self, reply: Reply) -> dict[str, str]:
        return {"request-id": "req_fake"}

    def stream_error_frame(self, reply: Reply) -> bytes:
        error = {
            "type": reply.error_type or "overloaded_error",
            "message": reply.error_message or "Overloaded",
        }
        return sse({"type": "error", "error": error}, event="error")

    def render(self, reply: Reply, request: Any, n: int) -> list[bytes]:
        model = request.get("model", "claude-fake") if isinstance(request, dict) else "claude-fake"
        usage = reply.usage or DEFAULT_USAGE
        frames = [
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_fake{n}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {
                            "input_tokens": usage.input_tokens - usage.cached_tokens,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": usage.cached_tokens,
                            "output_tokens": 1,
                            "service_tier": "standard",
                        },
                    },
                },
                event="message_start",
            ),
            sse({"type": "ping"}, event="ping"),
        ]
        has_calls = False
        for index, block in enumerate(reply.blocks):

            def start(content: dict[str, Any], i: int = index) -> bytes:
                return sse(
                    {"type": "content_block_start", "index": i, "content_block": content},
                    event="content_block_start",
                )

            def delta(payload: dict[str, Any], i: int = index) -> bytes:
                return sse(
                    {"type": "content_block_delta", "index": i, "delta": payload}, event="content_block_delta"
                )

            if isinstance(block, Reasoning) and block.redacted:
                frames.append(start({"type": "redacted_thinking", "data": block.text}))
            elif isinstance(block, Reasoning):
                frames.append(start({"type": "thinking", "thinking": "", "signature": ""}))
                frames += [
                    delta({"type": "thinking_delta", "thinking": p}) for p in split(block.text, reply.chunk)
                ]
                signature = block.signature or fake_signature(block.text)
                frames.append(delta({"type": "signature_delta", "signature": signature}))
            elif isinstance(block, Text):
                frames.append(start({"type": "text", "text": ""}))
                frames += [delta({"type": "text_delta", "text": p}) for p in split(block.text, reply.chunk)]
            elif isinstance(block, ToolCall):
                has_calls = True
                frames.append(
                    start(
                        {"type": "tool_use", "id": f"toolu_fake{n}_{index}", "name": block.name, "input": {}}
                    )
                )
                args = block.arguments if isinstance(block.arguments, str) else json.dumps(block.arguments)
                frames.append(delta({"type": "input_json_delta", "partial_json": ""}))
                frames += [
                    delta({"type": "input_json_delta", "partial_json": p}) for p in split(args, reply.chunk)
                ]
            else:
                continue
            frames.append(sse({"type": "content_block_stop", "index": index}, event="content_block_stop"))
        stop = reply.stop or ("tool_call" if has_calls else "stop")
        frames.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _STOP.get(stop, stop), "stop_sequence": None},
                    "usage": {"output_tokens": usage.output_tokens},
                },
                event="message_delta",
            )
        )
        frames.append(sse({"type": "message_stop"}, event="message_stop"))
        return frames
