"""How close stead's offline token estimate (`stead._tokens.estimate_text`) comes to o200k_base.

The reference counts come from `bpe-openai` (a Rust BPE with the o200k_base ranks bundled in its wheel, so it
works offline; `pip install bpe-openai`, not part of `.[dev]`: ~40 MB). Five kinds of text a context holds:
prose (the README), Python code (stead's own source), JSON records, log lines and hex. Prints a markdown table
(docs/context.md) with the estimate's ratio to the exact count and the chars/4 rule's.

    .venv/bin/python bench/token_estimate.py [--size 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from stead._tokens import estimate_text  # noqa: E402


def _prose(size: int) -> str:
    return (ROOT / "README.md").read_text()[:size]


def _code(size: int) -> str:
    text = ""
    for path in sorted((ROOT / "src" / "stead" / "core").glob("*.py")):
        text += path.read_text()
        if len(text) >= size:
            break
    return text[:size]


def _json(size: int, rng: random.Random) -> str:
    parts: list[str] = []
    n = 0
    while n < size:
        rec = {
            "k": "r",
            "call_id": f"call_{rng.getrandbits(64):016x}",
            "name": rng.choice(["read_file", "search", "add", "fetch"]),
            "output": {
                "lines": rng.randint(1, 500),
                "ok": rng.random() < 0.9,
                "path": f"src/m{rng.randint(0, 99)}.py",
            },
            "ts": 1_764_000_000 + rng.randint(0, 10**6),
        }
        s = json.dumps(rec)
        parts.append(s)
        n += len(s) + 1
    return "\n".join(parts)[:size]


def _logs(size: int, rng: random.Random) -> str:
    parts: list[str] = []
    n = 0
    while n < size:
        s = (
            f"2026-11-{rng.randint(1, 30):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z {rng.choice(['INFO', 'WARN', 'ERROR'])} "
            f"worker-{rng.randint(1, 9)} agent={rng.getrandbits(40):010x} stage=tools "
            f"latency_ms={rng.randint(1, 9999)}"
        )
        parts.append(s)
        n += len(s) + 1
    return "\n".join(parts)[:size]


def _hex(size: int, rng: random.Random) -> str:
    return "".join(f"{rng.getrandbits(4):x}" for _ in range(min(size, 5000)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=20_000, help="characters per text (hex: at most 5,000)")
    args = ap.parse_args()
    try:
        import bpe_openai
    except ImportError:
        sys.exit("needs the reference tokenizer: pip install bpe-openai")
    enc = bpe_openai.get_encoding("o200k_base")
    rng = random.Random(7)
    texts: list[tuple[str, Callable[[], str]]] = [
        ("prose (README)", lambda: _prose(args.size)),
        ("Python code", lambda: _code(args.size)),
        ("JSON records", lambda: _json(args.size, rng)),
        ("log lines", lambda: _logs(args.size, rng)),
        ("hex", lambda: _hex(args.size, rng)),
    ]
    print("| text | chars | o200k tokens | estimate | ratio | chars/4 ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, make in texts:
        text = make()
        exact = len(enc.encode_ordinary(text))
        est = estimate_text(text)
        quarter = len(text) / 4 / exact
        print(f"| {label} | {len(text):,} | {exact:,} | {est:,} | {est / exact:.2f} | {quarter:.2f} |")


if __name__ == "__main__":
    main()
