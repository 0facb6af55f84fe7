"""Home Assistant's Assist pipeline over the Wyoming protocol: the only modules that import the
`wyoming` package (and `zeroconf`, through it) are this one and its protocol.py.

`describe` -> `info` with one `asr` program that streams transcripts; then per request:
`transcribe` (language, optional), `audio-start`, `audio-chunk`... (any rate, width, channels),
`audio-stop` -> `transcript-start`, `transcript-chunk` while audio still arrives, `transcript`
(always: older clients read only that), `transcript-stop`. Every session goes through the one
inference worker (its own lane: sessions take turns with the microphone).

The socket is open to the LAN without authentication (as Home Assistant's Wyoming services
are), so everything a client can make the server hold is bounded: the clients served
(`wyoming.allow`), the connections (`wyoming.max_connections`), the bytes of an event
(protocol.py: checked before they are read), the audio of a session (`wyoming.max_audio_s`,
checked before a chunk is read), the time a connection may idle (only real progress counts)
and a session may last. A client that sends too much, sends events out of order or malformed,
or stops reading gets an `error` event (while the socket is open) and one log line (at most a
burst of them every 10 s: guard.LogLimit), and is disconnected; the server and the
microphone pipeline go on.

The server runs its asyncio loop in a thread of its own; results come back from the worker
thread through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info

from edgeasr.config import WyomingConfig
from edgeasr.errors import ConfigError, EdgeAsrError, OutputError
from edgeasr.stages import HomeName, SpeechDetector, Vocabulary
from edgeasr.worker import Overflow, Worker
from edgeasr.wyoming.guard import AllowList, LogLimit, client_address, room_from
from edgeasr.wyoming.protocol import (
    HEADER_LIMIT,
    MAX_DATA_BYTES,
    Disconnected,
    Head,
    ProtocolError,
    TooLarge,
    event,
    read_head,
    read_payload,
)
from edgeasr.wyoming.session import Result, Session, SessionError, SessionOptions, SessionTooLong, audio_format

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 5.0  # a client that stops reading for this long is disconnected
FINAL_TIMEOUT_S = 120.0  # longest wait for a final transcript (a worker far behind)
IDLE_TIMEOUT_S = 30.0  # a connection that makes no progress (audio, a request) for this long is closed
SESSION_SLACK_S = 30.0  # a session's audio must end within 2 x max_audio_s + this, however it trickles
MAX_PARTIALS = 64  # transcript-chunks waiting to be written: more means the client does not read
MAX_LANGUAGE_CHARS = 16
MAX_REQUEST_NAMES = 1000  # transcript_names (and terms) a request may carry
MAX_NAME_CHARS = 200
LATENCY_WINDOW = 200  # stop-to-transcript latencies kept for the metrics
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


@dataclass
class ServerStats:
    sessions: int = 0
    active: int = 0
    errors: int = 0
    refused: int = 0  # sessions over wyoming.max_sessions
    connections: int = 0  # open now
    denied: int = 0  # connections from addresses outside wyoming.allow
    replaced: int = 0  # connections closed to make room for a new one (wyoming.max_connections)
    turned_away: int = 0  # connections refused at the cap: every connection was in a session
    latencies_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


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


def error_bytes(text: str, code: str) -> bytes:
    """An error event on the wire, for a connection refused before it has a handler."""
    import json

    data = json.dumps({"text": text, "code": code}).encode()
    return json.dumps({"type": "error", "data_length": len(data)}).encode() + b"\n" + data


class WyomingServer:
    """The Wyoming server on `wyoming.uri`, in its own thread (`start`, `stop`)."""

    def __init__(self, options: WyomingConfig, worker: Worker, service: Service, session: SessionOptions,
                 detector: Callable[[], SpeechDetector], *, progress: Callable[[], None] = lambda: None,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, vocabulary: Callable[[], Vocabulary] = Vocabulary) -> None:
        """session: how each request is decoded; detector: a new VAD per request; vocabulary:
        the home's names and terms as they are now (a request's own `transcript_names` and
        `transcript_terms` come first)."""
        if not options.uri:
            raise ValueError("wyoming.uri is not set")
        self.options, self.worker, self.service = options, worker, service
        self.session_options, self.detector, self.vocabulary = session, detector, vocabulary
        self.progress = progress
        self.idle_timeout_s = idle_timeout_s
        self.session_limit_s = 2 * options.max_audio_s + SESSION_SLACK_S
        self.stats = ServerStats()
        self.allow = AllowList(options.allow)
        self.note = LogLimit(log)  # every line a client can cause goes through it
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._socket: tuple[Path, int] | None = None  # a unix socket's path and inode: ours to remove
        self._connections: dict[_Handler, None] = {}  # in the order they came
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
        s = self.stats
        return {"sessions": s.sessions, "active": s.active, "errors": s.errors, "refused": s.refused,
                "connections": s.connections, "denied": s.denied, "replaced": s.replaced,
                "turned_away": s.turned_away,
                "stop_to_transcript_ms_p50": round(lat[len(lat) // 2], 1) if lat else None}

    # -- the server's thread ----------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # what asyncio itself would log with a traceback (an accept that fails, a callback
        # that raised) is one rate-limited line: a flood must not become a flood of logs
        self.loop.set_exception_handler(self._loop_error)
        try:
            self.loop.run_until_complete(self._listen())
        except EdgeAsrError as exc:
            self._error = exc
            self._ready.set()
            return
        except (OSError, ValueError, OverflowError) as exc:
            self._error = _listen_error(self.options.uri or "", exc)
            self._ready.set()
            return
        self._ready.set()
        self.loop.create_task(self._heartbeat())
        self.loop.run_forever()

    async def _listen(self) -> None:
        assert self.options.uri is not None  # checked in __init__
        uri = urlparse(self.options.uri)
        if uri.scheme == "tcp":
            self._server = await asyncio.start_server(self._accept, uri.hostname, uri.port, limit=HEADER_LIMIT)
            if self.options.zeroconf:
                await self._announce(self.options.zeroconf, uri.port or 0)
        elif uri.scheme == "unix":
            path = Path(uri.netloc + uri.path)
            claim_socket_path(path)
            self._server = await asyncio.start_unix_server(self._accept, path=str(path), limit=HEADER_LIMIT)
            self._socket = (path, path.stat().st_ino)
        else:
            raise ValueError("only tcp:// and unix:// are served")

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
            self.note.flush()
            await asyncio.sleep(0.5)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.note(logging.ERROR, "Wyoming: %s%s", context.get("message", "asyncio error"),
                  f": {type(exc).__name__}: {exc}" if exc is not None else "")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A new connection: checked against wyoming.allow and wyoming.max_connections, then
        served until it ends; whatever happens, it leaves nothing behind."""
        peer = writer.get_extra_info("peername")
        address = client_address(peer)
        name = f"{peer[0]}:{peer[1]}" if address is not None else "unix socket client"
        if not self.allow.allows(address):
            self.stats.denied += 1
            self.note(logging.WARNING, "Wyoming: refused %s: not in wyoming.allow", address)
            writer.transport.abort()  # nothing sent: an address not allowed learns nothing
            return
        if len(self._connections) >= self.options.max_connections and not self._make_room():
            self.stats.turned_away += 1
            self.note(logging.WARNING, "Wyoming: turned away %s: %d connections, every one in a session "
                      "(wyoming.max_connections)", name, len(self._connections))
            writer.write(error_bytes("busy: every connection is transcribing (wyoming.max_connections)", "busy"))
            writer.close()  # the error is in the socket's buffer: it goes out, then the close
            return
        handler = _Handler(reader, writer, self, name, address)
        self._connections[handler] = None
        self.stats.connections = len(self._connections)
        try:
            await handler.run()
        except asyncio.CancelledError:
            # the server is stopping (_shutdown): the connection's end, not its failure (asyncio's
            # stream callback would log a task that ends cancelled as an exception)
            pass
        finally:
            self._connections.pop(handler, None)
            self.stats.connections = len(self._connections)

    def _make_room(self) -> bool:
        victim = room_from(self._connections)
        if victim is None:
            return False
        assert isinstance(victim, _Handler)
        self._connections.pop(victim, None)
        self.stats.replaced += 1
        self.note(logging.WARNING, "Wyoming: %d connections (wyoming.max_connections): closed %s, idle "
                  "%.0f s, for a new one", self.options.max_connections, victim.name,
                  time.monotonic() - victim.last_progress)
        victim.writer.transport.abort()  # its read ends at once; its handler cleans up
        return True

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for handler in list(self._connections):
            handler.writer.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:  # let them end before the loop stops (else: "Task was destroyed but it is pending")
            await asyncio.wait(tasks, timeout=1.0)
        if self._socket is not None:
            path, inode = self._socket
            try:
                if path.stat().st_ino == inode:  # still ours: another server may have taken the path
                    path.unlink()
            except OSError:
                pass
        if self._zeroconf is not None:
            await self._zeroconf._aiozc.async_close()


def _listen_error(uri: str, exc: BaseException) -> EdgeAsrError:
    """Why the URI cannot be served, with the exit code of its kind: a host that is not this
    machine's is the configuration's fault (78, as `check` says), a socket file that cannot be
    made is an output's (73); a port in use may free itself (1: systemd restarts)."""
    text = f"wyoming.uri: cannot serve {uri}: {exc}"
    if isinstance(exc, socket.gaierror) or getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
        return ConfigError(text)
    if uri.startswith("unix://"):
        return OutputError(text)
    return EdgeAsrError(text)


def claim_socket_path(path: Path) -> None:
    """Make `path` free for a unix socket: nothing there, or a socket no server listens on
    (left by a server that died; removed). A file of any other kind is never removed."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"wyoming.uri: {path} exists and is not a socket (the server would have to "
                          "delete it): name a path that does not exist or holds a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # nobody listens: a leftover
            return
        except OSError as exc:
            raise EdgeAsrError(f"wyoming.uri: cannot use the socket {path}: {exc.strerror or exc}") from exc
    raise EdgeAsrError(f"wyoming.uri: another server listens on {path}")


class _Gone(Exception):
    """The client cannot be written to (it went away, or stopped reading)."""


class _Idle(Exception):
    """The client made no progress in time."""


class _Handler:
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


@dataclass
class Exchange:
    """One request as a Wyoming client saw it (times from the monotonic clock)."""

    text: str | None = None
    error: str | None = None
    chunks: int = 0  # transcript-chunk events before audio-stop
    first_chunk_s: float | None = None  # after the first audio was sent
    stop_to_transcript_s: float | None = None


async def request(uri: str, pcm: bytes, *, rate: int, width: int, channels: int, chunk_s: float,
                  realtime: bool, timeout_s: float = FINAL_TIMEOUT_S, names: list[str] | None = None) -> Exchange:
    """Send one utterance as Home Assistant does (transcribe with `names` as its
    transcript_names, audio-start, chunks of chunk_s, at real time or at once, audio-stop) and
    time what comes back."""
    from wyoming.client import AsyncClient

    out = Exchange()
    step = max(1, int(chunk_s * rate)) * width * channels
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Transcribe(transcript_names=names or None).event())
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
