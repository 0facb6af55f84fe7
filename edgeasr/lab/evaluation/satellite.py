"""A voice satellite on the `wyoming` library's own events, as Home Assistant's wyoming
integration serves one (components/wyoming/assist_satellite.py; satellite.py before 2024.9).
The harness's only module that imports `wyoming` (lazily).

The satellite is a Wyoming server that Home Assistant connects to: `describe` is answered with
`info` holding `satellite` (its name and area: the integration makes a device of it, in that
area, and registers it as a timer handler); `run-satellite` says Home Assistant is ready; pings
are answered. A command is `run-pipeline` (speech to text through intent handling), then the
clip's 16-bit mono PCM as `audio-chunk`s at real time, then silence, as a microphone goes on,
until Home Assistant's VAD has ended the speech (`voice-stopped`), a transcript or an error
came, or the silence ran out (`audio-stop`). What Home Assistant did with the text is not
sent to a satellite without text-to-speech: the harness reads it from the pipeline's debug
record (assist_runs). Timer events (`timer-started`, ...) are kept as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeasr.errors import ToolMissingError

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
SAMPLES_PER_CHUNK = 1024  # what Home Assistant's satellites send: 64 ms
MAX_SILENCE_S = 4.0  # silence after the speech before the satellite gives up on Home Assistant's VAD
CONNECT_TIMEOUT_S = 60.0  # Home Assistant connects within seconds of the config entry; it retries every 10 s
TIMER_SLACK_S = 5  # a timer's seconds compared to within this (events come a moment apart)
ATTEMPTS = 2  # a command said again once when the connection drops under it
TIMER_EVENTS = ("timer-started", "timer-updated", "timer-cancelled", "timer-finished")


@dataclass
class SatelliteCommand:
    """What one command brought back to the satellite."""

    transcript: str | None = None
    error: str | None = None
    voice_stopped: bool = False
    sent_s: float = 0.0  # audio sent, speech and silence
    ended_at: float = 0.0  # monotonic: when the satellite stopped streaming


@dataclass
class _Connection:
    writer: asyncio.StreamWriter
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Satellite:
    """The satellite server on 127.0.0.1:`port`; `async with` runs it."""

    def __init__(self, name: str, area: str, port: int) -> None:
        try:
            import wyoming.event  # noqa: F401
        except ImportError as exc:
            raise ToolMissingError(f"the satellite needs the wyoming package ({exc})") from exc
        self.name, self.area, self.port = name, area, port
        self.ready = asyncio.Event()  # Home Assistant sent run-satellite
        self.timers: list[dict[str, Any]] = []  # every timer event, in order
        self._server: asyncio.Server | None = None
        self._home: _Connection | None = None
        self._command: SatelliteCommand | None = None
        self._done = asyncio.Event()

    async def __aenter__(self) -> Satellite:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            if self._home is not None:
                self._home.writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def info(self) -> Any:
        from wyoming.info import Attribution, Info
        from wyoming.info import Satellite as SatelliteInfo

        return Info(satellite=SatelliteInfo(
            name=self.name, area=self.area, description="edgeasr's test satellite", installed=True,
            attribution=Attribution(name="edgeasr", url=""), version="1",
            has_vad=False)).event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from wyoming.event import async_read_event

        connection = _Connection(writer)
        try:
            while (event := await async_read_event(reader)) is not None:
                await self._handle(connection, event)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._home is connection:
                self._home = None
                self.ready.clear()
            writer.close()

    async def _handle(self, connection: _Connection, event: Any) -> None:
        from wyoming.event import Event

        kind, data = event.type, event.data or {}
        if kind == "describe":
            await self._write(connection, self.info())
        elif kind == "run-satellite":
            self._home = connection
            self.ready.set()
        elif kind == "pause-satellite":
            self.ready.clear()
        elif kind == "ping":
            await self._write(connection, Event("pong", {"text": data.get("text")}))
        elif kind in TIMER_EVENTS:
            self.timers.append({"type": kind, "at": time.monotonic(), **data})
        elif self._command is not None:
            self._command_event(kind, data)

    def _command_event(self, kind: str, data: dict[str, Any]) -> None:
        command = self._command
        assert command is not None
        if kind == "voice-stopped":
            command.voice_stopped = True
            self._done.set()
        elif kind == "transcript":
            command.transcript = str(data.get("text") or "")
            self._done.set()
        elif kind == "error":
            command.error = f"{data.get('code')}: {data.get('text')}"
            self._done.set()

    async def _write(self, connection: _Connection, event: Any) -> None:
        from wyoming.event import async_write_event

        async with connection.lock:
            await async_write_event(event, connection.writer)

    def timer_events(self, start: int) -> tuple[tuple[Any, ...], ...]:
        """The timer events from the `start`th on, comparable across runs: a start with its
        seconds; an update with whether the timer runs and the seconds it gained or lost beyond
        the time that passed since its last event (rounded to TIMER_SLACK_S); a cancel, a finish."""
        last: dict[str, tuple[float, float, bool]] = {}  # id -> seconds left, when, running
        found = []
        for n, t in enumerate(self.timers):
            left, at, running = last.get(t.get("id", ""), (0.0, t["at"], False))
            if t["type"] == "timer-started":
                event: tuple[Any, ...] = (t["type"], t["total_seconds"])
                last[t["id"]] = (t["total_seconds"], t["at"], True)
            elif t["type"] == "timer-updated":
                expected = left - (t["at"] - at if running else 0.0)
                change = TIMER_SLACK_S * round((t["total_seconds"] - expected) / TIMER_SLACK_S)
                event = (t["type"], t["is_active"], change)
                last[t["id"]] = (t["total_seconds"], t["at"], t["is_active"])
            else:
                event = (t["type"],)
            if n >= start:
                found.append(event)
        return tuple(found)

    async def wait_ready(self) -> None:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await self.ready.wait()

    async def command(self, pcm: np.ndarray) -> SatelliteCommand:
        """Say one command (16 kHz mono int16 samples) at real time, then silence until Home
        Assistant has heard its end. Said again, once, if Home Assistant dropped the connection
        meanwhile (it reconnects a satellite that missed its pings)."""
        for attempt in range(ATTEMPTS):
            await self.wait_ready()
            home = self._home
            assert home is not None
            try:
                return await self._say(home, pcm)
            except ConnectionError:
                if attempt + 1 == ATTEMPTS:
                    raise
                log.warning("Home Assistant dropped the satellite during a command: saying it again")
                if self._home is home:  # until Home Assistant connects again
                    self._home = None
                    self.ready.clear()
        raise AssertionError("unreachable")

    async def _say(self, home: _Connection, pcm: np.ndarray) -> SatelliteCommand:
        from wyoming.audio import AudioChunk, AudioStop
        from wyoming.pipeline import PipelineStage, RunPipeline

        command = self._command = SatelliteCommand()
        self._done.clear()
        await self._write(home, RunPipeline(start_stage=PipelineStage.ASR, end_stage=PipelineStage.HANDLE).event())
        silence = np.zeros(int(MAX_SILENCE_S * SAMPLE_RATE), np.int16)
        audio = np.concatenate([pcm.astype(np.int16), silence])
        start = time.monotonic()
        try:
            for i in range(0, len(audio), SAMPLES_PER_CHUNK):
                if self._done.is_set():
                    break
                chunk = audio[i:i + SAMPLES_PER_CHUNK]
                await self._write(home, AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=chunk.tobytes(),
                                                   timestamp=int(1000 * i / SAMPLE_RATE)).event())
                command.sent_s = (i + len(chunk)) / SAMPLE_RATE
                # real time: the next chunk when a microphone would have it, or at once when Home
                # Assistant has heard enough
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), start + command.sent_s - time.monotonic())
            command.ended_at = time.monotonic()
            if not self._done.is_set():
                await self._write(home, AudioStop().event())
        finally:
            self._command = None
        return command
