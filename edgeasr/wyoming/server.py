"""Home Assistant's Assist pipeline over the Wyoming protocol: the server (listening, admitting
connections, making room, stopping); each connection is served by connection.py. The `wyoming`
package is imported only in this package (connection.py's events, protocol.py's wire format,
zeroconf here); client.py is the client side, for benches and tests.

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

from edgeasr.config import WyomingConfig
from edgeasr.errors import ConfigError, EdgeAsrError, OutputError
from edgeasr.stages import SpeechDetector, Vocabulary
from edgeasr.worker import Worker
from edgeasr.wyoming.connection import Connection, Service
from edgeasr.wyoming.guard import AllowList, LogLimit, client_address, room_from
from edgeasr.wyoming.protocol import (
    HEADER_LIMIT,
)
from edgeasr.wyoming.session import SessionOptions

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 30.0  # a connection that makes no progress (audio, a request) for this long is closed
SESSION_SLACK_S = 30.0  # a session's audio must end within 2 x max_audio_s + this, however it trickles
LATENCY_WINDOW = 200  # stop-to-transcript latencies kept for the metrics
# connections accepted at once when the socket is ready (asyncio's `backlog`, also the kernel's
# queue), before any of them is served or closed: the daemon holds about max_connections and twice
# this many sockets. At asyncio's 100, a flood of 512 connections took the daemon with 256 open
# files past them ("socket.accept() out of system resource", then a second of accepting nothing)
# in 1 CI run of 6; at 16, the flood filled the kernel's queue and its clients waited seconds.
# Sampled peak during the flood: 152-167 files at 100, 131-142 at 64
ACCEPT_BURST = 64


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
        self._connections: dict[Connection, None] = {}  # in the order they came
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
            self._server = await asyncio.start_server(self._accept, uri.hostname, uri.port, limit=HEADER_LIMIT,
                                                      backlog=ACCEPT_BURST)
            if self.options.zeroconf:
                await self._announce(self.options.zeroconf, uri.port or 0)
        elif uri.scheme == "unix":
            path = Path(uri.netloc + uri.path)
            claim_socket_path(path)
            self._server = await asyncio.start_unix_server(self._accept, path=str(path), limit=HEADER_LIMIT,
                                                           backlog=ACCEPT_BURST)
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
        handler = Connection(reader, writer, self, name, address)
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
        assert isinstance(victim, Connection)
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


