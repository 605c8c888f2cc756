"""A fake OpenAI Chat Completions server (`POST /v1/chat/completions`, streaming only).

Streams `data: {chat.completion.chunk}` events and `data: [DONE]` as api.openai.com does: a first chunk with
the assistant role, content / reasoning / tool-call fragments (the first fragment of each call carries its id,
type and name with empty arguments), a chunk with `finish_reason`, then (with
`stream_options.include_usage`) a usage chunk with empty `choices`. Errors use OpenAI's
`{"error": {"message", "type", "param", "code"}}` body.
"""

from __future__ import annotations

import json
from typing import Any

from stead.messages import Reasoning, Text, ToolCall
from tests.fakes import DEFAULT_USAGE, FakeServer, Reply, split, sse

__all__ = ["OpenAIFakeServer"]

_FINISH = {"stop": "stop", "tool_call": "tool_calls", "length": "length"}
_DEFAULT_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-test. "),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Country not supported."),
    404: ("invalid_request_error", "model_not_found", "The model `nope` does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests per min (RPM): Limit 3."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


class OpenAIFakeServer(FakeServer):
    path = "/v1/chat/completions"
    vendor = "openai"

    def __init__(self, *, reasoning_field: str = "reasoning_content") -> None:
        super().__init__()
        self.reasoning_field = reasoning_field

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def error_body(self, reply: Reply) -> dict[str, Any]:
        status = reply.status or 500
        err_type, code, message = _DEFAULT_ERRORS.get(status, ("server_error", None, f"HTTP {status}"))
        return {
            "error": {
                "message": reply.error_message or message,
                "type": reply.error_type or err_type,
                "param": None,
                "code": reply.error_code if reply.error_code is not None else code,
            }
        }

    def error_headers(self, reply: Reply) -> dict[str, str]:
        return {"x-request-id": "req_fake"}

    def stream_error_frame(self, reply: Reply) -> bytes:
        return sse(
            {
                "error": {
                    "message": reply.error_message
                    or "The server had an error while processing your request.",
                    "type": reply.error_type or "server_error",
                    "param": None,
                    "code": reply.error_code,
                }
            }
        )

    def render(self, reply: Reply, request: Any, n: int) -> list[bytes]:
        model = request.get("model", "gpt-fake") if isinstance(request, dict) else "gpt-fake"
        include_usage = bool(((request or {}).get("stream_options") or {}).get("include_usage"))
        base: dict[str, Any] = {
            "id": f"chatcmpl-fake{n}",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000 + n,
            "model": model,
            "system_fingerprint": "fp_fake",
            "service_tier": "default",
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            body = {**base, "choices": [choice]}
            if include_usage:
                body["usage"] = None
            return sse(body)

        frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
        calls: list[ToolCall] = []
        for block in reply.blocks:
            if isinstance(block, Reasoning):
                frames += [chunk({self.reasoning_field: p}) for p in split(block.text, reply.chunk)]
            elif isinstance(block, Text):
                frames += [chunk({"content": p}) for p in split(block.text, reply.chunk)]
            elif isinstance(block, ToolCall):
                calls.append(block)
        per_call: list[list[bytes]] = []
        for index, call in enumerate(calls):
            args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            first = {
                "index": index,
                "id": f"call_fake{n}_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            pieces = [chunk({"tool_calls": [first]})]
            pieces += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
                for p in split(args, reply.chunk)
            ]
            per_call.append(pieces)
        if reply.interleave:
            longest = max((len(p) for p in per_call), default=0)
            frames += [p[i] for i in range(longest) for p in per_call if i < len(p)]
        else:
            frames += [f for pieces in per_call for f in pieces]

        stop = reply.stop or ("tool_call" if calls else "stop")
        frames.append(chunk({}, _FINISH.get(stop, stop)))
        if include_usage:
            usage = reply.usage or DEFAULT_USAGE
            frames.append(
                sse(
                    {
                        **base,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": usage.input_tokens,
                            "completion_tokens": usage.output_tokens,
                            "total_tokens": usage.input_tokens + usage.output_tokens,
                            "prompt_tokens_details": {
                                "cached_tokens": usage.cached_tokens,
                                "audio_tokens": 0,
                            },
                            "completion_tokens_details": {
                                "reasoning_tokens": 0,
                                "audio_tokens": 0,
                                "accepted_prediction_tokens": 0,
                                "rejected_prediction_tokens": 0,
                            },
                        },
                    }
                )
            )
        frames.append(sse("[DONE]"))
        return frames
