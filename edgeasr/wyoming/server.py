"""Home Assistant's Assist pipeline over the Wyoming protocol: the only module that imports the
`wyoming` package (and `zeroconf`, through it).

`describe` -> `info` with one `asr` program that streams transcripts; then per request:
`transcribe` (language, optional), `audio-start`, `audio-chunk`... (any rate, width, channels),
`audio-stop` -> `transcript-start`, `transcript-chunk` while audio still arrives, `transcript`
(always: older clients read only that), `transcript-stop`. Every session goes through the one
inference worker (its own lane: sessions take turns with the microphone). A session that
sends too much audio, sends events out of order or malformed, or stops reading gets an `error`
event and is disconnected; the server and the microphone pipeline go on.

The server runs its asyncio loop in a thread of its own; results come back from the worker
thread through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info
from wyoming.server import AsyncEventHandler, AsyncServer

from edgeasr.config import WyomingConfig
from edgeasr.errors import EdgeAsrError
from edgeasr.stages import SpeechDetector
from edgeasr.worker import Overflow, Worker
from edgeasr.wyoming.session import Result, Session, SessionError, SessionOptions

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 5.0  # a client that stops reading for this long is disconnected
FINAL_TIMEOUT_S = 120.0  # longest wait for a final transcript (a worker far behind)
IDLE_TIMEOUT_S = 30.0  # a session that sends nothing for this long is closed
LATENCY_WINDOW = 200  # stop-to-transcript latencies kept for the metrics
ATTRIBUTION = Attribution(name="edgeasr", url="https://github.com/edgeasr/edgeasr")
WHISPER = Attribution(name="OpenAI", url="https://github.com/openai/whisper")


@dataclass(frozen=True)
class Service:
    """What `describe` reports."""

    model: str  # the bundle's name, e.g. whisper-tiny.en
    languages: list[str]
    version: str


@dataclass
class ServerStats:
    sessions: int = 0
    active: int = 0
    errors: int = 0
    refused: int = 0  # sessions over wyoming.max_sessions
    latencies_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


def info_event(service: Service) -> Event:
    model = AsrModel(name=service.model, attribution=WHISPER, installed=True,
                     description=f"Whisper {service.model} (edgeasr bundle)", version=service.version,
                     languages=service.languages)
    program = AsrProgram(name="edgeasr", attribution=ATTRIBUTION, installed=True,
                         description="On-device Whisper: encoder on a Hailo NPU or the CPU",
                         version=service.version, models=[model], supports_transcript_streaming=True)
    return Info(asr=[program]).event()


class WyomingServer:
    """The Wyoming server on `wyoming.uri`, in its own thread (`start`, `stop`)."""

    def __init__(self, options: WyomingConfig, worker: Worker, service: Service, session: SessionOptions,
                 detector: Callable[[], SpeechDetector], *, progress: Callable[[], None] = lambda: None) -> None:
        """session: how each request is decoded; detector: a new VAD per request."""
        if not options.uri:
            raise ValueError("wyoming.uri is not set")
        self.options, self.worker, self.service = options, worker, service
        self.session_options, self.detector = session, detector
        self.progress = progress
        self.stats = ServerStats()
        self.loop = asyncio.new_event_loop()
        self._server: AsyncServer | None = None
        self._zeroconf: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="edgeasr-wyoming", daemon=True)

    def start(self, timeout_s: float = 10.0) -> WyomingServer:
        """Listen (and announce, with wyoming.zeroconf); raises when the URI cannot be served."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise EdgeAsrError(f"wyoming.uri: {self.options.uri} did not start within {timeout_s:g} s")
        if self._error is not None:
            raise self._error
        log.info("Wyoming: serving %s on %s", self.service.model, self.options.uri)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout_s)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)

    def metrics(self) -> dict:
        lat = sorted(self.stats.latencies_ms)
        return {"sessions": self.stats.sessions, "active": self.stats.active, "errors": self.stats.errors,
                "refused": self.stats.refused,
                "stop_to_transcript_ms_p50": round(lat[len(lat) // 2], 1) if lat else None}

    # -- the server's thread ----------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._listen())
        except (OSError, ValueError) as exc:
            self._error = EdgeAsrError(f"wyoming.uri: cannot serve {self.options.uri}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        self.loop.create_task(self._heartbeat())
        self.loop.run_forever()

    async def _listen(self) -> None:
        assert self.options.uri is not None  # checked in __init__
        self._server = AsyncServer.from_uri(self.options.uri)
        await self._server.start(lambda reader, writer: _Handler(reader, writer, self))
        if self.options.zeroconf:
            await self._announce(self.options.zeroconf, urlparse(self.options.uri).port or 0)

    async def _announce(self, name: str, port: int) -> None:
        """Zeroconf discovery for Home Assistant; without it the server still works (the user
        adds host and port by hand), so a failure is a warning."""
        try:
            from wyoming.zeroconf import HomeAssistantZeroconf

            self._zeroconf = HomeAssistantZeroconf(port=port, name=name)
            await self._zeroconf.register_server()
        except (ImportError, OSError, ValueError) as exc:
            log.warning("Wyoming: cannot announce %s by zeroconf (%s); add it in Home Assistant by "
                        "host and port", name, exc)
            self._zeroconf = None
            return
        log.info("Wyoming: announced as %s._wyoming._tcp.local. on port %d", name, port)

    async def _heartbeat(self) -> None:
        """Marks progress while the loop turns, so a stuck loop stops the watchdog pings."""
        while True:
            self.progress()
            await asyncio.sleep(0.5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            await self._server.stop()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        if self._zeroconf is not None:
            await self._zeroconf._aiozc.async_close()


class _Handler(AsyncEventHandler):
    """One client connection: at most one transcription at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 server: WyomingServer) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.language: str | None = None
        self.session: Session | None = None
        self.partials: asyncio.Queue[str] = asyncio.Queue()
        self.final: asyncio.Future[Result] | None = None
        self.forwarder: asyncio.Task | None = None

    async def run(self) -> None:
        """As the library's, but a line that is not an event gets an error before the close
        (the library's reader answers it like an end of stream)."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(async_read_event(self.reader), IDLE_TIMEOUT_S)
                except TimeoutError:
                    if self.session is not None:
                        await self._error("no audio for a while: session closed", "timeout")
                    break
                if event is None:
                    if not self.reader.at_eof():
                        await self._error("malformed event (not a Wyoming event header)", "malformed")
                    break
                if not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            self.writer.close()

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._handle(event)
        except (SessionError, KeyError, TypeError, ValueError) as exc:
            await self._error(f"{event.type}: {exc}", getattr(exc, "code", "malformed"))
            return False
        except TimeoutError:
            await self._error(f"{event.type}: no transcript within {FINAL_TIMEOUT_S:g} s", "timeout")
            return False

    async def _handle(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self._write(info_event(self.server.service))
        elif Transcribe.is_type(event.type):
            self.language = Transcribe.from_event(event).language
        elif AudioStart.is_type(event.type):
            await self._start(AudioStart.from_event(event))
        elif AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            if self.session is None:
                raise SessionError("audio-chunk before audio-start")
            self.session.add(chunk.audio or b"", chunk.rate, chunk.width, chunk.channels)
        elif AudioStop.is_type(event.type):
            return await self._finish()
        return True

    async def _start(self, start: AudioStart) -> None:
        server = self.server
        if self.session is not None:
            raise SessionError("audio-start while a transcription is in progress")
        if server.stats.active >= server.options.max_sessions:
            server.stats.refused += 1
            raise SessionError(f"busy: {server.options.max_sessions} sessions already (wyoming.max_sessions)")
        loop = asyncio.get_running_loop()
        final: asyncio.Future[Result] = loop.create_future()

        def from_worker(apply: Callable[..., None]) -> Callable[[Any], None]:
            def call(item: Any) -> None:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(apply, item)
            return call

        def settle(item: Any) -> None:
            if final.done():
                return
            if isinstance(item, Exception):
                final.set_exception(SessionError(f"transcription failed: {item}"))
            else:
                final.set_result(item)

        lane = server.worker.lane(f"wyoming {self.writer.get_extra_info('peername') or 'client'}",
                                  3 * server.options.max_audio_s, Overflow.REJECT)
        session = Session(lane, server.session_options, server.detector(), language=self.language,
                          on_partial=from_worker(self.partials.put_nowait), on_final=from_worker(settle),
                          on_error=from_worker(settle))
        session.start(start.rate, start.width, start.channels)
        self.session, self.final = session, final
        server.stats.sessions += 1
        server.stats.active += 1
        await self._write(TranscriptStart(language=self.language).event())
        self.forwarder = loop.create_task(self._forward_partials())

    async def _forward_partials(self) -> None:
        """Partial deltas as transcript-chunk while audio arrives (until audio-stop)."""
        try:
            while True:
                delta = await self.partials.get()
                await self._write(TranscriptChunk(text=delta).event())
        except SessionError:
            self.writer.close()  # the client does not read: the read loop ends with the close

    async def _finish(self) -> bool:
        session, final = self.session, self.final
        if session is None or final is None:
            raise SessionError("audio-stop before audio-start")
        stopped = time.monotonic()
        if self.forwarder is not None:
            self.forwarder.cancel()  # no chunk after this point but the final's rest
        session.stop()
        result = await asyncio.wait_for(final, FINAL_TIMEOUT_S)
        rest = session.prefix.rest(result.text)
        if rest:
            await self._write(TranscriptChunk(text=rest).event())
        await self._write(Transcript(text=result.text, language=result.language).event())
        self.server.stats.latencies_ms.append((time.monotonic() - stopped) * 1e3)
        await self._write(TranscriptStop().event())
        return False  # one request per connection, as Home Assistant makes them

    async def _write(self, event: Event) -> None:
        try:
            await asyncio.wait_for(self.write_event(event), WRITE_TIMEOUT_S)
        except TimeoutError as exc:
            raise SessionError("the client does not read: disconnected") from exc

    async def _error(self, text: str, code: str) -> None:
        self.server.stats.errors += 1
        log.warning("Wyoming: %s", text)
        try:
            await asyncio.wait_for(self.write_event(Error(text=text, code=code).event()), WRITE_TIMEOUT_S)
        except (TimeoutError, ConnectionError, OSError):
            pass  # the client is gone or not reading: the close follows

    async def disconnect(self) -> None:
        if self.forwarder is not None:
            self.forwarder.cancel()
        if self.session is not None:
            self.session.close()
            self.session = None
            self.server.stats.active -= 1


# -- a client, for `edgeasr bench-wyoming` ------------------------------------------------------


@dataclass
class Exchange:
    """One request as a Wyoming client saw it (times from the monotonic clock)."""

    text: str | None = None
    error: str | None = None
    chunks: int = 0  # transcript-chunk events before audio-stop
    first_chunk_s: float | None = None  # after the first audio was sent
    stop_to_transcript_s: float | None = None


async def request(uri: str, pcm: bytes, *, rate: int, width: int, channels: int, chunk_s: float,
                  realtime: bool, timeout_s: float = FINAL_TIMEOUT_S) -> Exchange:
    """Send one utterance as Home Assistant does (transcribe, audio-start, chunks of chunk_s,
    at real time or at once, audio-stop) and time what comes back."""
    from wyoming.client import AsyncClient

    out = Exchange()
    step = max(1, int(chunk_s * rate)) * width * channels
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Transcribe().event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        t0 = time.monotonic()
        reader = asyncio.ensure_future(client.read_event())
        for i in range(0, len(pcm), step):
            await client.write_event(AudioChunk(rate=rate, width=width, channels=channels,
                                                audio=pcm[i : i + step]).event())
            while realtime and reader.done():
                event = reader.result()
                if event is not None and TranscriptChunk.is_type(event.type):
                    out.chunks += 1
                    out.first_chunk_s = out.first_chunk_s or time.monotonic() - t0
                reader = asyncio.ensure_future(client.read_event())
            if realtime:
                await asyncio.sleep(t0 + (i + step) / (rate * width * channels) - time.monotonic())
        await client.write_event(AudioStop().event())
        stopped = time.monotonic()
        while True:
            event = await asyncio.wait_for(reader, timeout_s)
            if event is None or TranscriptStop.is_type(event.type):
                break
            if Transcript.is_type(event.type):
                out.text = Transcript.from_event(event).text
                out.stop_to_transcript_s = time.monotonic() - stopped
                break
            elif Error.is_type(event.type):
                out.error = Error.from_event(event).text
                break
            reader = asyncio.ensure_future(client.read_event())
    return out
