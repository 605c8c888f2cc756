"""`OpenAIEmbedder` against a local OpenAI-compatible `/v1/embeddings` server (as Ollama, vLLM and
llama.cpp's server speak it)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

import stead
from stead.memory import MemoryConfig, OpenAIEmbedder, cosine


class _Embeddings(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"path": self.path, **body})
        data = []
        for i, text in enumerate(body["input"]):
            v = [float(len(text) % 7 + 1), float("tea" in text.lower()), float("coffee" in text.lower())]
            data.append({"object": "embedding", "index": i, "embedding": v})
        out = json.dumps(
            {
                "object": "list",
                "data": list(reversed(data)),
                "model": body["model"],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_openai_compatible_embeddings_endpoint(server: str, db_url: str) -> None:
    emb = OpenAIEmbedder("nomic-embed-text", dims=3, base_url=server, api_key="local")
    a, b = await emb.embed(["Prefers tea.", "Prefers coffee."])
    assert (
        _Embeddings.seen[-1]["path"] == "/v1/embeddings"
        and _Embeddings.seen[-1]["model"] == "nomic-embed-text"
    )
    assert abs(sum(x * x for x in a) - 1) < 1e-9 and cosine(a, b) < 0.9  # normalized, in input order
    assert emb.model == f"nomic-embed-text@{server}"
    async with stead.open(db_url, memory=MemoryConfig(embedder=emb)) as system:
        await system.memory.add("Prefers tea.", user="u")
        await system.memory.add("Prefers coffee.", user="u")
        found = await system.memory.search("a cup of tea?", user="u", lists=["vector"])
        assert found[0].text == "Prefers tea."
    with pytest.raises(stead.ConfigurationError, match="dims=3"):
        await OpenAIEmbedder("m", dims=5, base_url=server, api_key="x").embed(["x"])
