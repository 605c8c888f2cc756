"""Child process for tests/flows/test_durability.py: runs a flow until the test kills it with SIGKILL.

    python tests/flows/flow_kill_worker.py DBPATH TEAMDIR MODE

The flow: `find` (lookup, at most once) → `fetch` (durable) → `pay` (refund, at most once), with a recovery
path from `pay` to `apologize` when it fails. MODE is where the process stops (and waits to be killed):
`durable` inside `fetch`, `plain` inside `pay`. Every execution of a tool is appended to `DBPATH.log` (and
fsynced) so the parent can count executions across processes; marker lines on stdout say where it is.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `stead` and `tests` importable the same way
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import stead

BLOCK = False
MODE = ""
LOG: Path | None = None
AGENT_ID = "flowkill0001"
MESSAGE_ID = "flowkillmsg0001"


def marker(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def executed(what: str) -> None:
    assert LOG is not None
    with LOG.open("a") as f:
        f.write(what + "\n")
        f.flush()
        os.fsync(f.fileno())


async def _stop_here(line: str) -> None:
    marker(line)
    await asyncio.Event().wait()  # never fires: the parent kills the process here


@stead.tool
async def find(order: int) -> dict[str, int]:
    """Find an order (at most once)."""
    executed(f"find:{order}")
    return {"order": order, "amount": 30}


@stead.tool(durable=True)
async def fetch(order: int) -> dict[str, str]:
    """Fetch the order's history (durable)."""
    executed(f"fetch:{order}")
    if BLOCK and MODE == "durable":
        await _stop_here("IN_FETCH")
    return {"history": f"order {order} shipped"}


@stead.tool
async def pay(order: int, amount: int) -> str:
    """Pay a refund (at most once)."""
    executed(f"pay:{order}")
    if BLOCK and MODE == "plain":
        await _stop_here("IN_PAY")
    return f"paid {amount} for {order}"


@stead.tool
async def apologize(reason: str) -> str:
    """Apologize."""
    executed("apologize")
    return f"sorry: {reason}"


def write_team(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    me = "tests.flows.flow_kill_worker"
    (directory / "refunds.yaml").write_text(
        f"""name: refunds
type: flow
tools: [{me}:find, {me}:fetch, {me}:pay, {me}:apologize]
steps:
  - {{name: find, tool: find, input: {{order: payload.order}}, output: {{amount: step.output.amount}}}}
  - {{name: fetch, tool: fetch, input: {{order: payload.order}}, output: {{history: step.output.history}}}}
  - {{name: pay, tool: pay, input: {{order: "payload.order", amount: "payload.amount"}}}}
  - {{name: apologize, tool: apologize, input: {{reason: "step.error"}}}}
paths:
  - {{from: find, to: fetch}}
  - {{from: fetch, to: pay}}
  - {{from: pay, to: apologize, when: "step.status == 'failed'"}}
"""
    )


async def main(db: str, team: str) -> None:
    system = await stead.open(f"sqlite:///{db}", definitions=team)
    agent = await system.create(definition="refunds", agent_id=AGENT_ID)
    marker(f"AGENT {agent.id}")
    await agent.send("refund it", id=MESSAGE_ID, payload={"order": 9})
    await agent.wait_idle()
    marker("FINISHED")  # the kill point was never reached
    await system.close()


if __name__ == "__main__":
    from tests.flows import flow_kill_worker as W  # the module the definitions import the tools from

    W.BLOCK = True
    W.MODE = sys.argv[3]
    W.LOG = Path(sys.argv[1] + ".log")
    asyncio.run(W.main(sys.argv[1], sys.argv[2]))
