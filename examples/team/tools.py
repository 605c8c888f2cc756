"""Tools of the team example. `search` looks in a tiny built-in corpus (offline, deterministic)."""

from __future__ import annotations

import stead

CORPUS = {
    "durable": [
        "A durable agent keeps its conversation, queues and tool ledger in a database (docs/architecture).",
        "Accepted messages are never lost: acceptance is one transaction (stead A1).",
    ],
    "crash": [
        "After kill -9, a restarted process resumes exactly the agents that owe work (stead R1).",
        "A durable tool call may run again with the same call id; others surface an in-doubt result (T5).",
    ],
    "delegat": [
        "A delegation is a durable tool call whose child agent id is allocated once (docs/orchestration.md).",
    ],
}


@stead.tool
def search(query: str) -> str:
    """Search the team's notes.

    Args:
        query: What to look for.
    """
    q = query.lower()
    hits = [fact for key, facts in CORPUS.items() if key in q for fact in facts]
    if not hits:
        return f"No notes match {query!r}."
    return "\n".join(f"- {h}" for h in hits)


@stead.tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text.
    """
    return len(text.split())
