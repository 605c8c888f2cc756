"""Kill -9 inside the 3rd of 5 tool calls, restart, resume; count tool-body runs and model re-asks.

For each scenario (peer + variant) the parent:

1. starts the child with ``--phase run`` on a fresh directory; the child runs one conversation of the
   tool-loop workload (K=5); each tool body appends its call id to ``effects.log`` with fsync before
   doing anything, and the 3rd call's body then hangs;
2. sends SIGKILL as soon as ``effects.log`` shows that the 3rd call started;
3. starts the child with ``--phase resume``, which continues the same thread/session the way the
   framework recommends (each child's docstring says how) and prints a JSON line;
4. reads the logs and prints one JSON line per scenario, then a markdown table.

A correct durable runtime would run calls 1, 2, 4, 5 once each, run call 3 at most twice (it was in
flight: running it again is unavoidable for a non-idempotent tool unless the tool is marked
non-durable and the runtime records an error instead) and never ask the model again for a response it
had already committed.

Children: ``bench/crash_compare/*_child.py`` with ``bench/.peers/venv/bin/python``; a
``stead_child.py`` (added by the stead side, same protocol, see ``_crash_common.py``) is run with the
project interpreter if it exists.

Run: ``python bench/crash_compare/run.py [--only langgraph-sync]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
PEERS_PY = BENCH / ".peers" / "venv" / "bin" / "python"
K = 5
KILL_ROUND = 2
CONV = "conv-crash"


def project_python() -> str:
    env = os.environ.get("STEAD_PYTHON")
    if env:
        return env
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


@dataclass(frozen=True)
class Scenario:
    name: str
    framework: str
    variant: str
    python: str
    child: Path


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    stead = HERE / "stead_child.py"
    if stead.exists():
        out.append(Scenario("stead", "stead", "default", project_python(), stead))
    if not PEERS_PY.exists():
        print(f"note: {PEERS_PY} missing (run bash bench/peers/install.sh); skipping peers", file=sys.stderr)
        return out
    py = str(PEERS_PY)
    lg = HERE / "langgraph_child.py"
    out += [
        Scenario("langgraph-sync", "langgraph", "sync", py, lg),
        Scenario("langgraph-async", "langgraph", "async", py, lg),
        Scenario("langgraph-exit", "langgraph", "exit", py, lg),
        Scenario("openai-agents", "openai-agents", "default", py, HERE / "openai_agents_child.py"),
        Scenario("pydantic-ai", "pydantic-ai", "default", py, HERE / "pydantic_ai_child.py"),
    ]
    return out


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def run_scenario(s: Scenario, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"crash-{s.name}-") as tmp:
        d = Path(tmp)
        base = [s.python, str(s.child), "--dir", str(d), "--variant", s.variant]
        marker = f"call_{CONV}_{KILL_ROUND}"
        child = subprocess.Popen(
            [*base, "--phase", "run"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + timeout
        killed = False
        while time.monotonic() < deadline:
            if any(parts[1:] == ["tool", marker] for parts in _lines(d / "effects.log")):
                os.kill(child.pid, signal.SIGKILL)
                killed = True
                break
            if child.poll() is not None:
                break
            time.sleep(0.005)
        if not killed:
            child.kill()
        _, err = child.communicate()
        if not killed:
            rc = child.returncode
            raise RuntimeError(f"{s.name}: 3rd tool call never started (rc={rc}):\n{err[-3000:]}")

        resume_cmd = [*base, "--phase", "resume"]
        resumed = subprocess.run(
            resume_cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        report: dict[str, Any] = {}
        for line in resumed.stdout.splitlines():
            if line.startswith("{"):
                report = json.loads(line)
        if resumed.returncode != 0 or not report:
            report["resume_error"] = (resumed.stderr or resumed.stdout)[-1500:]

        effects = _lines(d / "effects.log")
        model = _lines(d / "model.log")

    runs = Counter(parts[2] for parts in effects)
    asked_before = {int(p[2]) for p in model if p[0] == "run"}
    after = [int(p[2]) for p in model if p[0] == "resume"]
    expected_ids = [f"call_{CONV}_{i}" for i in range(K)]
    return {
        "framework": s.framework,
        "variant": s.variant,
        "resume": report.get("resume"),
        "tool_runs": {cid: runs.get(cid, 0) for cid in expected_ids},
        "third_call_runs": runs.get(marker, 0),
        "extra_tool_runs": sum(runs.values()) - K,
        "model_calls_before_kill": len([p for p in model if p[0] == "run"]),
        "model_calls_after_restart": len(after),
        "model_reasked": sum(1 for r in after if r in asked_before),
        "completed": report.get("final_output") == f"The answer is {K}.",
        "user_messages_in_history": report.get("user_messages_in_history"),
        "tool_results_in_history": report.get("tool_results_in_history"),
        "duplicate_tool_results_in_history": report.get("duplicate_tool_results_in_history"),
        **({"resume_error": report["resume_error"]} if "resume_error" in report else {}),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framework | variant | runs of calls 1–5 | extra tool runs | model re-asked | completed "
        "| tool results in history | how it resumed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = ", ".join(str(v) for v in r["tool_runs"].values())
        lines.append(
            f"| {r['framework']} | {r['variant']} | {runs} | {r['extra_tool_runs']} | {r['model_reasked']} "
            f"| {'yes' if r['completed'] else 'NO'} | {r['tool_results_in_history']} | {r['resume']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", default=[], help="run only this scenario (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-phase timeout, seconds")
    args = parser.parse_args(argv)
    todo = [s for s in scenarios() if not args.only or s.name in args.only]
    rows = []
    for s in todo:
        row = run_scenario(s, args.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
