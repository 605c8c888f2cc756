"""`stead serve` as a real process: the README's round trip (create, post, stream, resume) and a clean
shutdown on SIGTERM with a stream open; refusing a non-loopback address without tokens."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.server.support import TEAM

STEAD = [str(Path(sys.executable).parent / "stead")]


def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    r = subprocess.run(
        [*STEAD, "serve", "--db", str(tmp_path / "s.db"), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "without --tokens" in r.stderr and "loopback" in r.stderr
    assert not (tmp_path / "s.db").exists()


def _events(lines: list[str]) -> list[tuple[str | None, str]]:
    out = []
    event_id = None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            out.append((event_id, line[7:]))
            event_id = None
    return out


def test_serve_round_trip_and_a_clean_shutdown(tmp_path: Path) -> None:
    db = tmp_path / "team.db"
    proc = subprocess.Popen(
        [*STEAD, "serve", "--db", str(db), "--definitions", str(TEAM), "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        banner = ""
        port = None
        for line in proc.stderr:
            banner += line
            m = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port is not None, banner
        assert "loopback only" in banner
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as http:
            agent = http.post("/v1/agents", json={"definition": "orchestrator", "id": "brief-writer"}).json()
            assert agent["id"] == "brief-writer"
            posted = http.post(
                "/v1/agents/brief-writer/messages",
                json={"content": "Write a short brief about durable agents"},
                headers={"Idempotency-Key": "brief-1"},
            ).json()
            assert posted["created"] is True
            lines: list[str] = []
            with http.stream("GET", f"/v1/agents/brief-writer/events?after={posted['events_after']}") as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if line.startswith("data: ") and lines[-2] == "event: settled":
                        break
            events = _events(lines)
            assert events[0][1] == "activated" and events[-1][1] == "settled"
            # resume from the middle: the rest again, nothing before it
            middle = events[len(events) // 2][0]
            assert middle is not None
            resumed: list[str] = []
            with http.stream("GET", "/v1/agents/brief-writer/events", headers={"Last-Event-ID": middle}) as r:
                for line in r.iter_lines():
                    resumed.append(line)
                    if line == "event: settled":
                        break
            assert _events(resumed) == events[len(events) // 2 + 1 :]
            final = [json.loads(x[6:]) for x in lines if x.startswith("data: ")][-1]
            assert final["status"] == "completed"
            # a live stream is open when the process is asked to stop: it ends, the process exits cleanly
            with http.stream("GET", "/v1/agents/brief-writer/events") as r:
                proc.send_signal(signal.SIGTERM)
                rest = list(r.iter_lines())
            assert not any(line.startswith("event:") for line in rest)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
