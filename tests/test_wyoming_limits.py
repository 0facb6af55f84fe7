"""The Wyoming socket under careless and hostile clients (issue 27): nothing a client on the LAN
sends can starve, bloat or crash the server.

Two servers, both real: in process, a WyomingServer on loopback with a worker that runs no
job (what the server holds and logs, seen from inside); and the daemon in a subprocess with
tiny.en, the one the Wyoming tests share (what an attack costs it, from /proc: RSS, peak RSS,
open files, threads; and that a normal request is served right after). Each limit is hit a few
times over, not thousands of times. Clients are plain sockets writing Wyoming's wire format byte by byte, or
the `wyoming` package's own client as Home Assistant uses it."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import soxr
from helpers.audio import LONG, SHORT, dev_clip
from helpers.ports import HOST, free_port
from helpers.text import wer
from helpers.waiting import wait_until
from helpers.wyoming import SHARED_FILE_LIMIT, Server, proc_status, transcribe
from wyoming.event import Event, read_event

from edgeasr.audio.vad import make_detector
from edgeasr.config import WyomingConfig, load_config
from edgeasr.errors import ConfigError, EdgeAsrError
from edgeasr.worker import Worker
from edgeasr.wyoming.connection import Connection, Service
from edgeasr.wyoming.server import WyomingServer
from edgeasr.wyoming.session import Session, SessionOptions

SERVER_LOGGER = "edgeasr.wyoming.server"


def frame(kind: str, data: dict | None = None, payload: bytes = b"") -> bytes:
    """One event in Wyoming's wire format: a header line, its data, its payload."""
    header: dict = {"type": kind}
    body = json.dumps(data).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


def start16(rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    return frame("audio-start", {"rate": rate, "width": width, "channels": channels})


def chunk16(pcm: bytes, rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    return frame("audio-chunk", {"rate": rate, "width": width, "channels": channels}, pcm)


DECODE_GUARD_S = 120.0  # a guard against a hang where a reply waits for a decode, not a measurement


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=timeout_s)
    return sock


def events_until_close(sock: socket.socket) -> list[Event]:
    """Every event the server sends until it closes the connection."""
    out = []
    with sock.makefile("rb") as stream:
        try:
            while (ev := read_event(stream)) is not None:
                out.append(ev)
        except (ConnectionError, TimeoutError):
            pass
    return out


def exchange(port: int, data: bytes, *, half_close: bool = True) -> list[Event]:
    """Send `data`, close our sending side (as a client that is done does), read to the end."""
    with connect(port) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (a refused client): what it sent is still read
        return events_until_close(sock)


def codes(events: list[Event]) -> list[str | None]:
    return [e.data.get("code") for e in events if e.type == "error"]


# -- in process: the server with a worker that runs no job -----------------------------------


@dataclass
class Light:
    server: WyomingServer
    worker: Worker
    port: int


@pytest.fixture
def light() -> Iterator:
    """make(**wyoming keys, idle_timeout_s=...) -> a started in-process server; stopped after."""
    made: list[Light] = []

    def make(idle_timeout_s: float = 30.0, max_audio_s: float = 30.0, uri: str | None = None, **keys) -> Light:
        port = free_port()
        cfg = load_config(None, {"input.source": "none", "wyoming.uri": uri or f"tcp://{HOST}:{port}",
                                 "wyoming.max_audio_s": max_audio_s,
                                 **{f"wyoming.{k}": v for k, v in keys.items()}})
        worker = Worker(engine=None).start()  # no request here gets as far as a job
        options = SessionOptions(window_s=30.0, max_audio_s=max_audio_s, partial_interval_ms=0,
                                 speculate_after_ms=None, frame_ms=cfg.vad.frame_ms)
        server = WyomingServer(cfg.wyoming, worker, Service("whisper-test", ["en"], "0"), options,
                               lambda: make_detector(cfg.vad), idle_timeout_s=idle_timeout_s).start()
        made.append(Light(server, worker, port))
        return made[-1]

    yield make
    for item in made:
        item.server.stop()
        item.worker.stop(1.0)


def described(port: int) -> bool:
    """A normal client: `describe` answered with `info`."""
    events = exchange(port, frame("describe"))
    return [e.type for e in events] == ["info"]


def server_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name in (SERVER_LOGGER, "asyncio")]


def settled(server: WyomingServer) -> None:
    """Every connection's handler has ended and what its end left to the event loop has run
    (how asyncio reports a connection's task that raised, say)."""
    wait_until(lambda: server.stats.connections == 0)
    for _ in range(2):  # a task that ends schedules its callbacks: one more turn runs them
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), server.loop).result(5)


def assert_no_traceback(caplog, server: WyomingServer | None = None) -> None:
    """No line with a traceback, once the server has settled (a stopped one has)."""
    if server is not None:
        settled(server)
    gc.collect()  # a task that ended in an exception nobody retrieved is reported when collected
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    # (how a connection's task that raised is reported: "Unhandled exception in
    # client_connected_cb" from Python 3.11.3 on, "Task exception was never retrieved" before)
    for sign in ("Task exception was never retrieved", "Unhandled exception", "Traceback"):
        assert sign not in caplog.text, caplog.text


def test_unknown_events_do_not_keep_a_connection_open(light, caplog):
    """Row 1: only progress resets the idle timer; an event nobody asked for is no progress."""
    srv = light(idle_timeout_s=1.0)
    received = b""
    with connect(srv.port) as sock:
        t0 = time.monotonic()
        closed = None
        sock.settimeout(0.25)
        while time.monotonic() - t0 < 5:
            try:
                sock.sendall(frame("nonsense", {"n": 1}))
                data = sock.recv(65536)
                received += data
                if data == b"":
                    closed = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except ConnectionError:
                closed = time.monotonic() - t0
                break
    assert closed is not None and closed >= 0.9, closed  # closed, and not before the idle timeout
    assert b'"timeout"' in received
    # a describe every half second is progress: the connection outlives the idle timeout
    with connect(srv.port) as sock, sock.makefile("rb") as stream:
        for _ in range(3):
            sock.sendall(frame("describe"))
            assert read_event(stream).type == "info"
            time.sleep(0.5)
    assert_no_traceback(caplog, srv.server)


def test_at_the_cap_an_idle_connection_makes_room_and_sessions_are_kept(light, caplog):
    """Row 1: wyoming.max_connections; a new client is served by closing the connection idle
    longest that holds no session, and turned away only when every one is transcribing."""
    srv = light(max_connections=4, max_sessions=4)
    idle = [connect(srv.port) for _ in range(4)]
    wait_until(lambda: srv.server.stats.connections == 4)
    assert described(srv.port)  # the fifth connection took the place of an idle one
    assert idle[0].recv(100) == b""  # the oldest idle one was closed
    sessions = []
    for _ in range(4):
        sock = connect(srv.port)
        sock.sendall(start16())
        with sock.makefile("rb") as stream:
            assert read_event(stream).type == "transcript-start"
        sessions.append(sock)
    turned = exchange(srv.port, frame("describe"))
    assert codes(turned) == ["busy"]
    assert srv.server.metrics()["turned_away"] == 1 and srv.server.stats.active == 4
    for sock in idle + sessions:
        sock.close()
    wait_until(lambda: srv.server.stats.connections == 0)
    assert srv.server.stats.active == 0
    assert described(srv.port)
    assert_no_traceback(caplog, srv.server)


def test_refused_and_ended_sessions_leave_no_lane_behind(light, caplog):
    """Row 3: an audio-start refused (bad format, busy) makes no lane; a session that ends
    (the client leaves, or is cut off) closes its lane. (Each kind a few times over
    wyoming.max_sessions: one lane left behind would show.)"""
    srv = light(max_sessions=1)
    for _ in range(20):
        assert codes(exchange(srv.port, start16(rate=0, width=3))) == ["bad-request"]
    holder = connect(srv.port)
    holder.sendall(start16())
    holder.recv(100)
    for _ in range(10):
        assert codes(exchange(srv.port, start16())) == ["bad-request"]  # busy: wyoming.max_sessions
    holder.close()
    for i in range(10):  # sessions that end without audio-stop: the client leaves, or is cut off
        wait_until(lambda: srv.server.stats.active == 0)
        with connect(srv.port) as sock:
            sock.sendall(start16() + chunk16(b"\0\0" * 1600))
            with sock.makefile("rb") as stream:
                assert read_event(stream).type == "transcript-start"
            if i % 2:
                sock.sendall(chunk16(b"\0" * 320, rate=8000))  # the server ends this one
                assert codes(events_until_close(sock)) == ["bad-request"]
    wait_until(lambda: srv.server.stats.active == 0)
    assert srv.server.stats.refused == 10 and srv.server.stats.sessions == 11
    assert srv.worker._lanes == []  # every lane the server opened was closed
    assert_no_traceback(caplog, srv.server)


MALFORMED = {
    "a JSON list": b"[1, 2, 3]\n",
    "a JSON string": b'"audio-start"\n',
    "JSON null": b"null\n",
    "no type": b'{"data": {"rate": 16000}}\n',
    "an empty type": b'{"type": ""}\n',
    "data not an object": b'{"type": "transcribe", "data": [1]}\n',
    "data_length a string": b'{"type": "transcribe", "data_length": "12"}\n',
    "payload_length a string": b'{"type": "audio-chunk", "payload_length": "320"}\n',
    "a negative length": b'{"type": "transcribe", "data_length": -5}\n',
    "a float length": b'{"type": "transcribe", "data_length": 1e3}\n',
    "bad UTF-8": b'{"type": "\xff\xfe"}\n',
    "not JSON": b"GET / HTTP/1.1\n",
    "JSON nested past the parser": b"[" * 50_000 + b"\n",
    "an integer of 5000 digits": b'{"type": "x", "data_length": ' + b"9" * 5000 + b"}\n",
    "a header line without end": b'{"type": "' + b"x" * 70_000,
    "data that is not an object": b'{"type": "transcribe", "data_length": 3}\n[1]',
    "a data_length over the cap": b'{"type": "transcribe", "data_length": 2147483648}\n',
    "audio-start rate as a string": frame("audio-start", {"rate": "16000", "width": 2, "channels": 1}),
    "audio-start width 3, rate 0": start16(rate=0, width=3),
    "audio-chunk before audio-start": chunk16(b"\0\0" * 160),
    "audio-stop before audio-start": frame("audio-stop"),
    "a chunk of another format": start16() + chunk16(b"\0" * 320, rate=8000),
    "a language that is a list": frame("transcribe", {"language": ["en"]}),
    "disconnect inside a header's data": b'{"type": "transcribe", "data_length": 100}\n{"lang',
    "disconnect inside a payload": start16() + chunk16(b"\0\0" * 1600)[:-1000],
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_every_malformed_input_gets_an_error_event_and_one_log_line(light, caplog, name):
    """Row 5: an `error` event (the client only closed its sending side, so the socket still
    takes one), one log line, no traceback; the next client is served."""
    srv = light()
    caplog.set_level(logging.INFO)
    caplog.clear()
    events = exchange(srv.port, MALFORMED[name])
    assert [e.type for e in events][-1:] == ["error"], events
    assert [e.type for e in events if e.type != "transcript-start"] == ["error"]
    assert_no_traceback(caplog, srv.server)
    lines = server_lines(caplog)
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert described(srv.port)


def test_abrupt_disconnects_mid_event_cost_one_line_each(light, caplog):
    """Row 5: clients that vanish (RST) in the middle of a header, its data or a payload."""
    srv = light()
    caplog.set_level(logging.INFO)
    cuts = [b'{"type": "audio-st', b'{"type": "transcribe", "data_length": 100}\n{"la',
            start16() + chunk16(b"\0\0" * 1600)[:-100]]
    for i in range(15):
        sock = connect(srv.port)
        sock.sendall(cuts[i % 3])
        time.sleep(0.01)  # the server reads what came before the reset
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close = RST
        sock.close()
    assert_no_traceback(caplog, srv.server)
    assert len(server_lines(caplog)) <= 15
    assert described(srv.port)


def test_clients_outside_wyoming_allow_are_closed_at_once(light, caplog):
    """Access control: loopback is not in this allow-list, so a connection from it is closed
    before anything is read or sent, with one log line."""
    srv = light(allow=["10.0.0.0/8", "fc00::/7"])
    caplog.set_level(logging.INFO)
    caplog.clear()
    assert exchange(srv.port, frame("describe")) == []
    lines = server_lines(caplog)
    assert len(lines) == 1 and "not in wyoming.allow" in lines[0].getMessage()
    assert srv.server.metrics()["denied"] == 1
    assert load_config(None).wyoming.allow == ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12",
                                               "192.168.0.0/16", "fc00::/7", "fe80::/10")


def test_a_flood_of_bad_clients_is_logged_at_a_bounded_rate(light, caplog):
    srv = light()
    caplog.set_level(logging.INFO)
    for _ in range(60):  # three times the burst
        exchange(srv.port, b"[]\n")
    lines = server_lines(caplog)
    assert len(lines) <= 21, len(lines)  # a burst of 20, then counted for a summary line
    assert srv.server.stats.errors == 60
    assert described(srv.port)


def test_a_unix_socket_path_that_is_not_a_socket_is_never_deleted(tmp_path):
    """Row 8: the config refuses it (exit 78); a server handed it all the same refuses too."""
    path = tmp_path / "precious.txt"
    path.write_text("keep me")
    with pytest.raises(ConfigError, match="is a file, not a socket"):
        load_config(None, {"wyoming.uri": f"unix://{path}", "input.source": "none"})
    options = replace(WyomingConfig(), uri=f"unix://{path}")
    server = WyomingServer(options, Worker(engine=None), Service("m", ["en"], "0"),
                           SessionOptions(30.0, 30.0, 0, None, 30), lambda: make_detector(load_config(None).vad))
    with pytest.raises(ConfigError) as info:
        server.start()
    assert info.value.exit_code == 78 and path.read_text() == "keep me"


def test_a_leftover_socket_is_replaced_and_a_live_one_is_not_taken(tmp_path, light):
    path = tmp_path / "wyoming.sock"
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(path))
    left.close()  # a socket file nobody listens on: what a killed server leaves
    srv = light(uri=f"unix://{path}")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(frame("describe"))
        sock.shutdown(socket.SHUT_WR)
        assert [e.type for e in events_until_close(sock)] == ["info"]
    second = WyomingServer(replace(WyomingConfig(), uri=f"unix://{path}"), Worker(engine=None),
                           Service("m", ["en"], "0"), SessionOptions(30.0, 30.0, 0, None, 30),
                           lambda: make_detector(load_config(None).vad))
    with pytest.raises(EdgeAsrError, match="another server listens"):
        second.start()
    srv.server.stop()
    assert not path.exists()  # the server removes its own socket


class Discard:
    """A lane that takes no job (none is submitted without partials, speculation or commits)."""

    def submit(self, job, stop=None) -> list:
        raise AssertionError("no job expected")

    def offer_partial(self, job) -> None:
        raise AssertionError("no job expected")

    def close(self) -> None:
        pass


def test_chunk_handling_is_linear_in_the_audio_however_it_is_chunked():
    """Row 6: one-sample chunks cost a byte copy each, not a conversion of all the audio so far:
    4x the chunks cost about 4x the time (quadratic would be 16x)."""
    cfg = load_config(None)
    options = SessionOptions(window_s=30.0, max_audio_s=30.0, partial_interval_ms=0, speculate_after_ms=None,
                             frame_ms=30)

    def cost(samples: int) -> float:
        session = Session(Discard(), options, make_detector(cfg.vad), language=None,  # type: ignore[arg-type]
                          on_partial=print, on_final=print, on_error=print)
        session.start(16000, 2, 1)
        one = b"\1\0"
        t0 = time.process_time()
        for _ in range(samples):
            session.add(one, 16000, 2, 1)
        elapsed = time.process_time() - t0
        assert abs(session.seconds - samples / 16000) < 0.03
        return elapsed

    small, large = cost(40_000), cost(160_000)
    print(f"\n40,000 one-sample chunks: {small:.2f} s; 160,000: {large:.2f} s ({large / small:.1f}x)")
    assert large / small < 7  # the growth, whatever the machine's speed


def test_after_the_endpoint_only_chunks_with_audio_count_as_progress():
    """Row 1: once the transcript went out at wyoming.endpoint_ms, the client may go on sending
    until its own VAD stops it; an empty audio-chunk then is no progress, as before the endpoint."""
    handler = Connection(None, None, None, "test", None)  # type: ignore[arg-type]  # _handle uses none of them
    handler.answered, handler.last_progress = True, 0.0
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    assert asyncio.run(handler._handle(Event("audio-chunk", fmt, b"")))
    assert handler.last_progress == 0.0
    assert asyncio.run(handler._handle(Event("audio-chunk", fmt, b"\0\0")))
    assert handler.last_progress > 0.0


def test_a_chunk_over_the_audio_limit_is_refused_before_it_is_converted(light):
    """Row 4, in process: a chunk more than wyoming.max_audio_s long is refused on its declared
    length, before a byte of it is read."""
    srv = light(max_audio_s=5.0)
    with connect(srv.port) as sock:
        sock.sendall(start16())
        header = {"type": "audio-chunk", "data_length": 42, "payload_length": 16000 * 2 * 6}
        data = json.dumps({"rate": 16000, "width": 2, "channels": 1}).encode()
        assert len(data) == 42
        sock.sendall(json.dumps(header).encode() + b"\n" + data)
        events = events_until_close(sock)
    assert codes(events) == ["audio-too-long"] and "wyoming.max_audio_s" in events[-1].data["text"]


def test_a_client_still_sending_after_its_error_reads_it_and_a_clean_close(light):
    """A client streaming faster than real time is still sending when its session is refused.
    Closing on its unread audio would make the kernel reset the connection, which can destroy
    the error event: the server shuts its side and drops what still comes, then closes."""
    srv = light(max_audio_s=5.0)
    rest = bytes(2 << 20)  # the audio the client sends after the refused chunk: 65 s
    with connect(srv.port) as sock:
        sock.sendall(start16() + chunk16(bytes(16000 * 2 * 6)) + rest)  # refused on its header
        with sock.makefile("rb") as stream:
            answer = read_event(stream)
            while answer is not None and answer.type == "transcript-start":
                answer = read_event(stream)
            assert answer is not None and codes([answer]) == ["audio-too-long"]
            assert stream.read() == b""  # the end of the stream, not ConnectionResetError
        sock.shutdown(socket.SHUT_WR)


def test_stopping_with_clients_connected_logs_nothing(light, caplog):
    """A server stopped (the daemon's SIGTERM) with connections open ends them quietly: no
    task cancelled into asyncio's log, none left pending."""
    srv = light()
    clients = [connect(srv.port) for _ in range(3)]
    clients[0].sendall(start16())  # one of them in a session
    wait_until(lambda: srv.server.stats.connections == 3)
    caplog.clear()
    srv.server.stop()
    for sock in clients:
        sock.close()
    assert_no_traceback(caplog)
    for sign in ("Exception in callback", "Task was destroyed", "CancelledError"):
        assert sign not in caplog.text, caplog.text


# -- the daemon in a subprocess: what an attack costs it --------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@dataclass(frozen=True)
class Idle:
    """What the daemon holds between requests."""

    rss_mb: float
    files: int
    threads: int

    @classmethod
    def of(cls, d: Server) -> Idle:
        return cls(d.rss(), d.files(), d.threads())


@pytest.fixture(scope="module")
def daemon(wyoming_daemon: Server) -> Iterator[Server]:
    """The shared Wyoming daemon (its open files limited: a flood of connections runs it out of
    them unless the cap holds), warmed up by one request; after the attacks here, its log holds
    no traceback and no sign that it ran out of anything."""
    d = wyoming_daemon
    # warm: the engine's first decodes (one window and more) allocate what later ones reuse
    assert asyncio.run(transcribe(d.uri, dev_clip(LONG))).text and served(d)
    yield d
    text = d.log_text()
    assert "Traceback" not in text and "Task exception" not in text and "out of system resource" not in text


def served(d: Server) -> bool:
    """A normal request, as Home Assistant makes it (the `wyoming` package's client)."""
    reply = asyncio.run(transcribe(d.uri, dev_clip(SHORT)))
    ok = reply.error is None and "silly" in (reply.text or "").lower()
    if not ok:
        print(f"a normal request failed: {reply}")
    return ok


def recovered(d: Server, before: Idle, what: str) -> dict:
    """The targets after an attack: a normal client served, and then nothing left behind: the
    connections closed and no thread more than before, RSS within 50 MB of before, no
    traceback in the log."""
    assert served(d), f"{what}: a normal request failed"
    # the server closes its side of the last connection
    wait_until(lambda: d.files() <= before.files and d.threads() <= before.threads, 10,
               lambda: f"{what}: files {before.files} -> {d.files()}, threads {before.threads} -> {d.threads()}")
    figures = {"rss_before_mb": round(before.rss_mb, 1), "rss_after_mb": round(d.rss(), 1),
               "files": (before.files, d.files()), "threads": (before.threads, d.threads())}
    print(f"\n{what}: {figures}")
    assert d.files() <= before.files and d.threads() <= before.threads, figures
    assert figures["rss_after_mb"] - before.rss_mb < 50, figures
    text = d.log_text()
    assert "Traceback" not in text and "Task exception" not in text, text[-3000:]
    return figures


def test_row1_idle_connections_past_the_file_limit_do_not_lock_out_home_assistant(daemon):
    """Twice as many connections as the daemon may open files, each sending an unknown event:
    only wyoming.max_connections keeps it serving."""
    before, lines0 = Idle.of(daemon), len(daemon.log_text().splitlines())
    cap = load_config(None).wyoming.max_connections
    n = 2 * SHARED_FILE_LIMIT
    socks = []
    for _ in range(n):
        s = connect(daemon.port)
        s.sendall(frame("nonsense", {"every": "20 s"}))
        socks.append(s)
    assert served(daemon)  # while all of them are still open on the client's side
    closed = 0
    for s in socks:
        s.settimeout(0.01)
        try:
            closed += s.recv(100) == b""
        except ConnectionError:  # closed for a new connection: reset
            closed += 1
        except TimeoutError:
            pass
        s.close()
    assert closed >= n - cap  # all but the cap's worth were closed by the server
    new_lines = daemon.log_text().splitlines()[lines0:]
    print(f"\n{n} connections: {len(new_lines)} log lines")
    assert len(new_lines) < 60
    recovered(daemon, before, f"row 1: {n} connections sending unknown events")


def stream(port: int, head: bytes, total: int) -> tuple[list[Event], int]:
    """Send `head`, read the server's answer, then try to stream `total` bytes after it: the
    bytes the server took before it closed."""
    sent = 0
    with connect(port) as sock:
        sock.sendall(head)
        with sock.makefile("rb") as reader:
            answer = read_event(reader)
            while answer is not None and answer.type == "transcript-start":
                answer = read_event(reader)
        block = bytes(1 << 20)
        sock.settimeout(5)
        try:
            while sent < total:
                sent += sock.send(block)
        except (ConnectionError, TimeoutError):
            pass
    return ([answer] if answer else []), sent


READ_BOUND = 64 << 20  # what the server may have taken (socket buffers and its linger), far over


def test_row2_declared_lengths_are_refused_before_a_byte_is_read(daemon):
    before = Idle.of(daemon)
    for head in (b'{"type": "transcribe", "data_length": 2147483648}\n',
                 b'{"type": "nonsense", "payload_length": 2147483648}\n',
                 start16() + b'{"type": "audio-chunk", "payload_length": 2147483648}\n'):
        answer, sent = stream(daemon.port, head, 2 * READ_BOUND)
        assert codes(answer) in (["too-large"], ["audio-too-long"]), answer
        assert sent < READ_BOUND, sent  # socket buffers, not all that was offered
    recovered(daemon, before, "row 2: 2^31 declared, 128 MiB offered, 3 times")


def test_row3_refused_audio_starts_leave_nothing_behind(daemon):
    """The lanes are counted in process (above); here what many refusals cost the daemon."""
    before = Idle.of(daemon)
    for _ in range(200):
        assert codes(exchange(daemon.port, start16(rate=0, width=3))) == ["bad-request"]
    recovered(daemon, before, "row 3: 200 refused audio-starts")


def test_row4_a_256_mib_chunk_is_refused_within_100_mb_of_peak(daemon):
    before = Idle.of(daemon)
    Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    header = {"type": "audio-chunk", "data_length": 42, "payload_length": 256 << 20}
    data = json.dumps({"rate": 16000, "width": 2, "channels": 1}).encode()
    answer, sent = stream(daemon.port, start16() + json.dumps(header).encode() + b"\n" + data, 256 << 20)
    assert codes(answer) == ["too-large"] and sent < READ_BOUND  # over the 4 MiB a payload may have
    peak = proc_status(daemon.pid, "VmHWM")
    print(f"\nrow 4: peak RSS {peak:.0f} MB, {peak - before.rss_mb:.0f} MB over the {before.rss_mb:.0f} MB before")
    assert peak - before.rss_mb < 100
    recovered(daemon, before, "row 4: a 256 MiB audio-chunk")


def test_row4_the_largest_chunk_allowed_is_converted_within_100_mb_of_peak(daemon):
    """10 s at 48 kHz, stereo, 32 bits in one audio-chunk (3.8 MB, under the 4 MiB cap):
    converted and transcribed; the peak includes the decoding of its window."""
    at_48k = soxr.resample(dev_clip(LONG).astype(np.float32) / 32768, 16000, 48000)[: 48000 * 10]
    big = (np.repeat(at_48k, 2) * 2**31 * 0.9).astype("<i4").tobytes()
    assert 3 << 20 < len(big) < 4 << 20
    rss0 = daemon.rss()
    Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")
    with connect(daemon.port, timeout_s=DECODE_GUARD_S) as sock:  # a window decoded on a busy machine
        sock.sendall(start16(48000, 4, 2) + chunk16(big, 48000, 4, 2) + frame("audio-stop"))
        events = events_until_close(sock)
    assert len(next(e.data["text"] for e in events if e.type == "transcript").split()) > 10
    peak = proc_status(daemon.pid, "VmHWM")
    print(f"\nthe largest chunk: peak RSS {peak:.0f} MB, {peak - rss0:.0f} MB over the {rss0:.0f} MB before; "
          f"{daemon.rss():.0f} MB after")
    assert peak - rss0 < 100


def test_row5_malformed_events_and_abrupt_disconnects(daemon):
    before = Idle.of(daemon)
    for data in MALFORMED.values():
        assert codes(exchange(daemon.port, data)), data[:60]
    for i in range(15):
        sock = connect(daemon.port)
        sock.sendall(start16() + chunk16(b"\0\0" * 1600)[: 100 + i])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        sock.close()
    # the last sessions end as their resets are read (until then a new one is busy)
    wait_until(lambda: codes(exchange(daemon.port, start16())) == [], timeout_s=30)
    recovered(daemon, before, "row 5: malformed events, 15 abrupt disconnects")


def one_sample_events(pcm: bytes, samples_per_chunk: int) -> bytes:
    step = 2 * samples_per_chunk
    return b"".join(chunk16(pcm[i:i + step]) for i in range(0, len(pcm), step))


def timed_request(d: Server, pcm: bytes, samples_per_chunk: int) -> tuple[str, float, float]:
    """A request with its events pre-encoded and sent in one go: the transcript, the daemon's
    CPU seconds to it and the wall time."""
    blob = start16() + one_sample_events(pcm, samples_per_chunk) + frame("audio-stop")
    c0 = cpu_s(d.pid)
    t0 = time.monotonic()
    with connect(d.port, timeout_s=DECODE_GUARD_S) as sock:
        sock.sendall(blob)
        events = events_until_close(sock)
    wall = time.monotonic() - t0
    text = next(e.data["text"] for e in events if e.type == "transcript")
    return text, cpu_s(d.pid) - c0, wall


def test_row6_one_sample_chunks_read_as_the_same_audio(daemon, dev_dir):
    """11.7 s (a window committed while it arrives) in one-sample audio-chunks: the transcript
    of the same audio in 100 ms chunks. (That their cost is linear is checked in process.)"""
    before = Idle.of(daemon)
    pcm = dev_clip(LONG).tobytes()
    text_100ms, cpu_100ms, _ = timed_request(daemon, pcm, 1600)
    text_1, cpu_1, wall_1 = timed_request(daemon, pcm, 1)
    per_event_us = 1e6 * (cpu_1 - cpu_100ms) / (len(pcm) // 2)
    print(f"\nrow 6: {len(pcm) // 2 / 16000:.1f} s in 100 ms chunks {cpu_100ms:.1f} s CPU; in {len(pcm) // 2} "
          f"one-sample chunks {cpu_1:.1f} s CPU ({per_event_us:.0f} us per event), {wall_1:.1f} s to the transcript")
    assert wer(text_100ms, text_1) <= 0.05, (text_100ms, text_1)
    recovered(daemon, before, f"row 6: {len(pcm) // 2} one-sample chunks")


def test_fuzzed_headers_and_payloads_leave_the_server_serving(daemon):
    """Seeded random events, the same every run: headers of random JSON, lengths, types, data
    and payloads, whole or cut; the server answers or closes, and serves a normal client."""
    rng = random.Random(27)
    before = Idle.of(daemon)
    values = [None, True, -1, 0, 1, 3, 2**31, 2**64, 1.5, float("nan"), "", "x" * 100, [], {}, {"a": [1]}]
    types = ["describe", "transcribe", "audio-start", "audio-chunk", "audio-stop", "ping", "", "x" * 70]
    keys = ["type", "data", "data_length", "payload_length", "version", "rate", "width", "channels"]

    def fuzz_event() -> bytes:
        if rng.random() < 0.1:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
        header = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 4))}
        if rng.random() < 0.8:
            header["type"] = rng.choice(types)
        if rng.random() < 0.5:
            header["data"] = {k: rng.choice(values + [16000, 2, 1]) for k in rng.sample(keys[5:], rng.randint(0, 3))}
        payload = bytes(rng.randint(0, 3000))
        if rng.random() < 0.5:
            header["payload_length"] = len(payload) + rng.choice([0, 0, 0, -1, 1, 1000])
        raw = json.dumps(header, allow_nan=True).encode() + b"\n" + payload
        return raw[: rng.randint(1, len(raw))] if rng.random() < 0.2 else raw

    for _ in range(FUZZ_CONNECTIONS):
        prefix = rng.choice([b"", start16(), frame("transcribe") + start16()])
        with connect(daemon.port) as sock:
            sock.settimeout(5)
            try:
                sock.sendall(prefix + b"".join(fuzz_event() for _ in range(rng.randint(1, 5))))
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except (ConnectionError, TimeoutError):
                pass
    recovered(daemon, before, f"fuzz: {FUZZ_CONNECTIONS} connections of random events")


FUZZ_CONNECTIONS = 150


def test_the_daemon_serves_while_attacked(daemon):
    """A flood of malformed clients in a thread while normal requests go on beside it."""
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                exchange(daemon.port, b"[]\n")
            except OSError:
                pass

    before = Idle.of(daemon)
    attacker = threading.Thread(target=flood)
    attacker.start()
    try:
        for _ in range(3):
            assert served(daemon)
    finally:
        stop.set()
        attacker.join()
    recovered(daemon, before, "normal requests beside a flood of malformed clients")
