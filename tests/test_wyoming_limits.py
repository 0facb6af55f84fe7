"""The Wyoming server's limits under careless and hostile clients, seen from inside: a
WyomingServer in process on loopback, with a worker that runs no job, holds no more than its
limits allow (connections, sessions, lanes, audio, log lines), answers every malformed input with
an `error` event and one log line, and logs no traceback. Clients are plain sockets writing
Wyoming's wire format byte by byte (helpers.wyoming_wire). What an attack costs the daemon itself:
test_wyoming_daemon_under_attack.py."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from helpers.ports import HOST, free_port
from helpers.waiting import wait_until
from helpers.wyoming_wire import MALFORMED, chunk16, codes, connect, events_until_close, exchange, frame, start16
from wyoming.event import Event, read_event

from edgeasr.audio.vad import make_detector
from edgeasr.config import WyomingConfig, load_config
from edgeasr.errors import ConfigError, EdgeAsrError
from edgeasr.worker import Worker
from edgeasr.wyoming.connection import Connection, Service
from edgeasr.wyoming.server import WyomingServer
from edgeasr.wyoming.session import Session, SessionOptions

SERVER_LOGGER = "edgeasr.wyoming.server"


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
    """Only progress resets the idle timer; an event nobody asked for is no progress."""
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
    """wyoming.max_connections: a new client is served by closing the connection idle
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
    """An audio-start refused (bad format, busy) makes no lane; a session that ends
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


@pytest.mark.parametrize("name", list(MALFORMED))
def test_every_malformed_input_gets_an_error_event_and_one_log_line(light, caplog, name):
    """An `error` event (the client only closed its sending side, so the socket still
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
    """Clients that vanish (RST) in the middle of a header, its data or a payload."""
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
    """The config refuses it (exit 78); a server handed it all the same refuses too."""
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
    """One-sample chunks cost a byte copy each, not a conversion of all the audio so far:
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
    """Once the transcript went out at wyoming.endpoint_ms, the client may go on sending
    until its own VAD stops it; an empty audio-chunk then is no progress, as before the endpoint."""
    handler = Connection(None, None, None, "test", None)  # type: ignore[arg-type]  # _handle uses none of them
    handler.answered, handler.last_progress = True, 0.0
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    assert asyncio.run(handler._handle(Event("audio-chunk", fmt, b"")))
    assert handler.last_progress == 0.0
    assert asyncio.run(handler._handle(Event("audio-chunk", fmt, b"\0\0")))
    assert handler.last_progress > 0.0


def test_a_chunk_over_the_audio_limit_is_refused_before_it_is_converted(light):
    """A chunk more than wyoming.max_audio_s long is refused on its declared
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
