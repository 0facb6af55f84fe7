"""One Wyoming client connection (`Connection`): its events read with protocol.py's bounds, at
most one transcription at a time (session.py), partial transcripts while the audio comes, the
final at the endpoint or at `audio-stop`, and every fault answered with an `error` event and
one rate-limited log line (the server's `note`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info

from edgeasr.stages import HomeName, Vocabulary
from edgeasr.worker import Overflow
from edgeasr.wyoming.protocol import (
    MAX_DATA_BYTES,
    Disconnected,
    Head,
    ProtocolError,
    TooLarge,
    event,
    read_head,
    read_payload,
)
from edgeasr.wyoming.session import Result, Session, SessionError, SessionTooLong, audio_format

if TYPE_CHECKING:
    from edgeasr.wyoming.server import WyomingServer

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 5.0  # a client that stops reading for this long is disconnected
FINAL_TIMEOUT_S = 120.0  # longest wait for a final transcript (a worker far behind)
MAX_PARTIALS = 64  # transcript-chunks waiting to be written: more means the client does not read
MAX_LANGUAGE_CHARS = 16
MAX_REQUEST_NAMES = 1000  # transcript_names (and terms) a request may carry
MAX_NAME_CHARS = 200
# After an error the client may still be sending: closing on unread data makes the kernel send a
# reset, which can destroy the error event before the client reads it. So the server shuts its
# sending side and discards what still comes, for at most this long and this much.
LINGER_S = 2.0
LINGER_BYTES = 4 << 20  # over two minutes of 16 kHz audio
ATTRIBUTION = Attribution(name="edgeasr", url="https://github.com/edgeasr/edgeasr")
WHISPER = Attribution(name="OpenAI", url="https://github.com/openai/whisper")


@dataclass(frozen=True)
class Service:
    """What `describe` reports."""

    model: str  # the bundle's name, e.g. whisper-tiny.en
    languages: list[str]
    version: str


def info_event(service: Service) -> Event:
    model = AsrModel(name=service.model, attribution=WHISPER, installed=True,
                     description=f"Whisper {service.model} (edgeasr bundle)", version=service.version,
                     languages=service.languages)
    program = AsrProgram(name="edgeasr", attribution=ATTRIBUTION, installed=True,
                         description="On-device Whisper: encoder on a Hailo NPU or the CPU",
                         version=service.version, models=[model], supports_transcript_streaming=True)
    return Info(asr=[program]).event()


def request_vocabulary(data: dict[str, Any]) -> Vocabulary:
    """A `transcribe` event's `transcript_names` and `transcript_terms` (wyoming >= 1.10): plain
    strings, with no role; a name stands for an entity or an area wherever a sentence takes one."""
    lists = {}
    for key in ("transcript_names", "transcript_terms"):
        value = data.get(key) or []
        if not (isinstance(value, list) and len(value) <= MAX_REQUEST_NAMES
                and all(isinstance(v, str) and 0 < len(v.strip()) <= MAX_NAME_CHARS for v in value)):
            raise SessionError(f"transcribe: {key} must be a list of at most {MAX_REQUEST_NAMES} names of "
                               f"1..{MAX_NAME_CHARS} characters")
        lists[key] = [" ".join(v.split()) for v in value]
    return Vocabulary(tuple(HomeName(n, "name") for n in dict.fromkeys(lists["transcript_names"])),
                      tuple(dict.fromkeys(lists["transcript_terms"])))


class _Gone(Exception):
    """The client cannot be written to (it went away, or stopped reading)."""


class _Idle(Exception):
    """The client made no progress in time."""


class Connection:
    """One client connection: at most one transcription at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: WyomingServer,
                 name: str, address: Any) -> None:
        self.reader, self.writer, self.server = reader, writer, server
        self.name, self.address = name, address
        self.language: str | None = None
        self.names = Vocabulary()  # the request's transcript_names and transcript_terms
        self.session: Session | None = None
        self.answered = False  # the transcript went out at the endpoint: the rest of the audio is not heard
        self.partials: asyncio.Queue[str] = asyncio.Queue(MAX_PARTIALS)
        self.final: asyncio.Future[Result] | None = None
        self.forwarder: asyncio.Task | None = None
        self.last_progress = time.monotonic()
        self.session_deadline = float("inf")
        self._timer: asyncio.TimerHandle | None = None
        self._linger = False  # an error went out while the client may still be sending

    @property
    def in_session(self) -> bool:
        return self.session is not None

    async def run(self) -> None:
        self._arm()
        try:
            await self._serve()
        except (ProtocolError, SessionError) as exc:
            await self._fail(str(exc), exc.code)
            self._linger = True
        except _Idle as exc:
            await self._fail(str(exc), "timeout", level=logging.INFO if self.session is None else logging.WARNING)
        except Disconnected as exc:  # told, in case only its sending side closed
            await self._fail(str(exc), "malformed")
        except _Gone as exc:
            self.server.note(logging.INFO, "Wyoming: %s: %s", self.name, exc)
        except (ConnectionError, OSError):
            pass  # the client went away between events, or was closed for a new one
        except Exception as exc:  # a bug: one line, this connection ends, the server goes on
            self.server.note(logging.ERROR, "Wyoming: %s: unexpected %s: %s", self.name, type(exc).__name__, exc)
        finally:
            await self._cleanup()

    async def _serve(self) -> None:
        while True:
            head = await read_head(self.reader)
            if head is None:
                return  # the client closed between events
            self._check_payload(head)
            payload = await read_payload(self.reader, head)
            if not await self._handle(event(head, payload)):
                return

    # The idle timer: one timer per connection, moved only when it fires (progress just
    # notes the time), so a read costs no timeout of its own; at the deadline the reader
    # raises _Idle in whatever read is waiting.
    def _deadline(self) -> float:
        return min(self.last_progress + self.server.idle_timeout_s, self.session_deadline)

    def _arm(self) -> None:
        delay = max(0.0, self._deadline() - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        if time.monotonic() < self._deadline():
            self._arm()  # progress since it was set
            return
        if self.session is None:
            text = f"no request for {self.server.idle_timeout_s:g} s: connection closed"
        elif time.monotonic() >= self.session_deadline:
            text = (f"the audio did not end within {self.server.session_limit_s:g} s "
                    "(2 x wyoming.max_audio_s + 30 s): session closed")
        else:
            text = f"no audio for {self.server.idle_timeout_s:g} s: session closed"
        self.reader.set_exception(_Idle(text))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _progress(self) -> None:
        self.last_progress = time.monotonic()

    def _check_payload(self, head: Head) -> None:
        """Refuse a payload before it is read: audio beyond the session's wyoming.max_audio_s,
        audio without a session, more than a little of anything else."""
        if AudioChunk.is_type(head.type):
            if self.session is None:
                raise SessionError("audio-chunk before audio-start")
            if head.payload_length > self.session.budget_bytes():
                raise SessionTooLong(f"more than {self.server.options.max_audio_s:g} s of audio "
                                     "(wyoming.max_audio_s)")
        elif head.payload_length > MAX_DATA_BYTES:
            raise TooLarge(f"{head.type}: `payload_length` {head.payload_length} is over the limit of "
                           f"{MAX_DATA_BYTES} bytes for this event")

    async def _handle(self, ev: Event) -> bool:
        data = ev.data
        if Describe.is_type(ev.type):
            await self._write(info_event(self.server.service))
            self._progress()
        elif Transcribe.is_type(ev.type):
            language = data.get("language")
            if language is not None and not (isinstance(language, str) and 0 < len(language) <= MAX_LANGUAGE_CHARS):
                raise SessionError(f"transcribe: language {str(language)[:40]!r} is not a language code")
            self.language = language
            self.names = request_vocabulary(data)
        elif AudioStart.is_type(ev.type):
            await self._start(data)
            self._progress()
        elif AudioChunk.is_type(ev.type) and self.answered:
            if ev.payload:  # the client goes on until its own VAD stops it: what follows is not heard
                self._progress()
        elif AudioChunk.is_type(ev.type):
            assert self.session is not None  # _check_payload
            self.session.add(ev.payload or b"", data.get("rate"), data.get("width"), data.get("channels"))
            if ev.payload:
                self._progress()
        elif AudioStop.is_type(ev.type):
            return False if self.answered else await self._finish()
        # any other event is ignored, as the protocol wants, and is no progress
        return True

    async def _start(self, data: dict[str, Any]) -> None:
        server = self.server
        if self.session is not None:
            raise SessionError("audio-start while a transcription is in progress")
        rate, width, channels = audio_format(data.get("rate"), data.get("width"), data.get("channels"))
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

        # the lane only once the request is known to be served; closed on any failure below
        lane = server.worker.lane(f"wyoming {self.name}", 3 * server.options.max_audio_s, Overflow.REJECT)
        try:
            session = Session(lane, server.session_options, server.detector(), language=self.language,
                              vocabulary=self.names.merged(server.vocabulary()),
                              on_partial=from_worker(self._partial), on_final=from_worker(settle),
                              on_error=from_worker(settle), on_endpoint=self._endpoint)
            session.start(rate, width, channels)
        except BaseException:
            lane.close()
            raise
        self.session, self.final = session, final
        self.session_deadline = time.monotonic() + server.session_limit_s
        server.stats.sessions += 1
        server.stats.active += 1
        await self._write(TranscriptStart(language=self.language).event())
        self.forwarder = loop.create_task(self._forward_partials())

    def _partial(self, delta: str) -> None:
        try:
            self.partials.put_nowait(delta)
        except asyncio.QueueFull:  # the client does not read what it asked for
            self.writer.transport.abort()

    async def _forward_partials(self) -> None:
        """Partial deltas as transcript-chunk while audio arrives (until audio-stop)."""
        try:
            while True:
                delta = await self.partials.get()
                await self._write(TranscriptChunk(text=delta).event())
        except _Gone:
            self.writer.transport.abort()  # the read loop ends with the close

    def _endpoint(self) -> None:
        """The session's VAD heard wyoming.endpoint_ms of silence after speech: the transcript
        goes out now, as wyoming-faster-whisper's --vad-endpointing does (on the loop thread)."""
        if not self.answered and self.session is not None:
            self.answered = True
            asyncio.get_running_loop().create_task(self._answer())

    async def _answer(self) -> None:
        try:
            await self._finish()
            self._progress()
            self._arm()  # until the client's audio-stop, which closes the connection, or the idle limit
        except SessionError as exc:
            await self._fail(str(exc), exc.code)
            self.writer.transport.abort()
        except _Idle as exc:  # the idle timer fired before the transcript went out
            await self._fail(str(exc), "timeout")
            self.writer.transport.abort()
        except _Gone:
            self.writer.transport.abort()

    async def _finish(self) -> bool:
        session, final = self.session, self.final
        if session is None or final is None:
            raise SessionError("audio-stop before audio-start")
        stopped = time.monotonic()
        self._disarm()  # the client waits for us now
        if self.forwarder is not None:
            self.forwarder.cancel()  # no chunk after this point but the final's rest
        session.stop()
        try:
            result = await asyncio.wait_for(final, FINAL_TIMEOUT_S)
        except TimeoutError:
            raise SessionError(f"audio-stop: no transcript within {FINAL_TIMEOUT_S:g} s") from None
        rest = session.prefix.rest(result.text)
        if rest:
            await self._write(TranscriptChunk(text=rest).event())
        await self._write(Transcript(text=result.text, language=result.language).event())
        self.server.stats.latencies_ms.append((time.monotonic() - stopped) * 1e3)
        await self._write(TranscriptStop().event())
        return False  # one request per connection, as Home Assistant makes them

    async def _write(self, ev: Event) -> None:
        try:
            await asyncio.wait_for(async_write_event(ev, self.writer), WRITE_TIMEOUT_S)
        except TimeoutError:
            raise _Gone(f"does not read for {WRITE_TIMEOUT_S:g} s: disconnected") from None
        except (ConnectionError, OSError) as exc:
            raise _Gone(f"went away ({type(exc).__name__})") from None

    async def _fail(self, text: str, code: str, level: int = logging.WARNING) -> None:
        """The client's error: one log line, an `error` event if the socket still takes one."""
        self.server.stats.errors += 1
        self.server.note(level, "Wyoming: %s: %s", self.name, text)
        if self.writer.is_closing():
            return
        try:
            await self._write(Error(text=text, code=code).event())
        except (_Gone, _Idle):
            # the client is gone or not reading: the close follows. (A writer's drain raises what
            # its reader holds: after the idle timer that is _Idle, the event already written.)
            pass

    async def _cleanup(self) -> None:
        """Nothing of the connection stays: the timer, the forwarder, the session and its lane, the socket."""
        self._disarm()
        if self.forwarder is not None:
            self.forwarder.cancel()
            await asyncio.gather(self.forwarder, return_exceptions=True)
            self.forwarder = None
        if self.session is not None:
            self.session.close()
            self.session = None
            self.server.stats.active -= 1
        self.final = None
        if self._linger and not self.writer.is_closing():
            await self._discard_input()
        self.writer.close()

    async def _discard_input(self) -> None:
        """A graceful close after an error: our side shut, what the client still sends read and
        dropped until it closes too (or LINGER_S / LINGER_BYTES pass), so no reset overtakes the error."""
        left, deadline = LINGER_BYTES, time.monotonic() + LINGER_S
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            while left > 0:
                data = await asyncio.wait_for(self.reader.read(min(left, 1 << 16)),
                                              max(0.0, deadline - time.monotonic()))
                if not data:
                    return
                left -= len(data)
        except (TimeoutError, ConnectionError, OSError, _Idle):
            pass  # the close follows; a client that goes on sending past the limits gets the reset


# -- a client, for `edgeasr bench-wyoming` ------------------------------------------------------


