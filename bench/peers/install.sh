#!/usr/bin/env bash
# Create bench/.peers/venv (gitignored) and install the pinned peer frameworks into it.
# Usage: bash bench/peers/install.sh [python]   (default python: python3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/../.peers/venv"
py="${1:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version

for name in ("langgraph", "langgraph-checkpoint-sqlite", "openai-agents", "pydantic-ai-slim"):
    print(f"{name}=={version(name)}")
PY
