"""One audio test end to end: speech synthesized with espeak-ng (Debian package `espeak-ng`, installed by
.ci/run), resampled to PCM16 mono 24 kHz and sent in 100 ms `input_audio_buffer.append` chunks through a
session to the fake OpenAI Realtime server, whose voice activity detection finds the utterance and answers
with its transcript and a tool call: the session records the user's turn and starts a durable delegation."""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
import wave
from pathlib import Path

import pytest

from tests.realtime.fake_openai_realtime import FakeRealtimeServer, Reply, rms
from tests.realtime.support import Events, gate, open_team, rows, write_team

ENV = {"OPENAI_API_KEY": "sk-test"}
SAID = "please write a brief about durable agents"
RATE = 24000
CHUNK = RATE * 2 // 10  # 100 ms of PCM16

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="needs espeak-ng (apt-get install espeak-ng)"
)


def synthesize(text: str, path: Path) -> bytes:
    """espeak-ng's speech (mono PCM16 at its own rate), linearly resampled to 24 kHz."""
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    with wave.open(str(path)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    src = struct.unpack(f"<{len(frames) // 2}h", frames)
    n = int(len(src) * RATE / rate)
    out = []
    for i in range(n):
        x = i * rate / RATE
        j = int(x)
        a, b = src[min(j, len(src) - 1)], src[min(j + 1, len(src) - 1)]
        out.append(int(a + (b - a) * (x - j)))
    return struct.pack(f"<{n}h", *out)


def loud_span_ms(pcm: bytes, threshold: float) -> tuple[float, float]:
    """First and last 100 ms chunk above the threshold, in ms (what a VAD with 100 ms chunks can see)."""
    chunks = [pcm[i : i + CHUNK] for i in range(0, len(pcm), CHUNK)]
    loud = [i for i, c in enumerate(chunks) if rms(c) >= threshold]
    return loud[0] * 100.0, (loud[-1] + 1) * 100.0


async def test_audio_end_to_end_espeak_pcm16_24khz(tmp_path: Path, db_url: str) -> None:
    speech = synthesize(SAID, tmp_path / "said.wav")
    silence = bytes(RATE * 2)  # one second: the end of the turn
    audio = speech + silence

    def reply(items: list[dict[str, object]]) -> Reply:
        last = items[-1]
        if last.get("type") == "function_call_output":
            return Reply("The team has started.")
        return Reply("On it.", calls=[("invoke_target_agent", {"request": SAID})])

    server = FakeRealtimeServer(reply, transcripts=[SAID])
    await server.start()
    team = write_team(
        tmp_path / "team",
        voice={
            "model": f"openai:gpt-realtime@{server.url}",
            "realtime": {
                "output": "audio",
                "turn_detection": {"type": "server_vad", "create_response": True},
            },
        },
    )
    gate(SAID)
    try:
        async with open_team(db_url, team, env=ENV) as system:
            session = await system.realtime(definition="voice")
            ev = Events(session)
            for i in range(0, len(audio), CHUNK):
                await session.send_audio(audio[i : i + CHUNK])
            heard = await ev.until(lambda e: e.type == "transcript" and e.role == "user" and e.final is True)
            started = await ev.type("delegation_started")
            await ev.until(
                lambda e: e.type == "transcript" and e.final is True and e.text == "The team has started."
            )
            await ev.type("response_done")
            await session.close()
            turns = await rows(system, "SELECT role, text, status FROM realtime_transcripts ORDER BY seq")
            (delegation,) = await rows(system, "SELECT request, status FROM realtime_delegations")
    finally:
        await server.close()
    assert server.problems == []
    session_update = server.received[0]["session"]
    assert session_update["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    appended = [
        base64.b64decode(e["audio"]) for e in server.received if e["type"] == "input_audio_buffer.append"
    ]
    assert b"".join(appended) == audio and all(len(a) == CHUNK for a in appended[:-1])
    # the fake's VAD found one utterance where espeak-ng's speech is
    ((start, end),) = server.speech
    first, last = loud_span_ms(speech, server.threshold)
    assert start == first and end == last and end - start > 1000
    assert heard.text == SAID and started.text == SAID
    assert ("user", SAID, "complete") in turns and ("assistant", "The team has started.", "complete") in turns
    assert delegation == (SAID, "running")
