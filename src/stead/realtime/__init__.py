"""Realtime co-agents (docs/realtime.md): a voice or text session that hands work to durable agents and
never loses it — a plugin (`RealtimePlugin`).

    import stead
    from stead.realtime import RealtimePlugin

    async with await stead.open("sqlite:///team.db", definitions="examples/team",
                                plugins=[RealtimePlugin("examples/voice")]) as system:
        session = await system.realtime(definition="voice")
        await session.send_text("Please write a short brief about durable agents")
        async for event in session.events():
            ...

Drivers: `OpenAIRealtimeDriver` (OpenAI Realtime GA over WebSocket, `pip install 'stead[realtime]'`) and
`TextDuplexDriver` (a scripted in-process text model: `model: text-duplex:SCRIPT.yaml`).
"""

from stead.realtime._clock import Clock, SystemClock
from stead.realtime._duplex import DuplexScript, TextDuplexDriver, load_duplex_script
from stead.realtime._models import ModelFactory, RealtimeChoice, resolve_realtime
from stead.realtime._narration import Narrator
from stead.realtime._openai import OpenAIRealtimeDriver
from stead.realtime._plugin import RealtimePlugin, realtime_plugin_of
from stead.realtime._protocol import (
    AudioDelta,
    ModelError,
    ModelEvent,
    RealtimeModel,
    RealtimeUsage,
    ResponseDone,
    ResponseHint,
    ResponseStarted,
    SessionConfig,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequest,
    Transcript,
)
from stead.realtime._sequencer import ResponseSequencer, Speech
from stead.realtime._session import RealtimeEvent, RealtimeSession

__all__ = [
    "AudioDelta",
    "Clock",
    "DuplexScript",
    "ModelError",
    "ModelEvent",
    "ModelFactory",
    "Narrator",
    "OpenAIRealtimeDriver",
    "RealtimeChoice",
    "RealtimeEvent",
    "RealtimeModel",
    "RealtimePlugin",
    "RealtimeSession",
    "RealtimeUsage",
    "ResponseDone",
    "ResponseHint",
    "ResponseSequencer",
    "ResponseStarted",
    "SessionConfig",
    "Speech",
    "SpeechStarted",
    "SpeechStopped",
    "SystemClock",
    "TextDuplexDriver",
    "ToolCallRequest",
    "Transcript",
    "load_duplex_script",
    "realtime_plugin_of",
    "resolve_realtime",
]
