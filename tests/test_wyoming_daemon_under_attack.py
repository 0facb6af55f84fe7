"""What an attack on the Wyoming socket costs the daemon: the daemon in a subprocess with tiny.en
(the server the Wyoming tests share, its open files limited), and after each attack, from /proc,
its RSS, peak RSS, open files and threads, and that a normal request (the `wyoming` package's own
client, as Home Assistant uses it) is served right after. Each limit is hit a few times over, not
thousands of times. The same limits seen from inside the server: test_wyoming_limits.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soxr
from helpers.audio import LONG, SHORT, dev_clip
from helpers.text import wer
from helpers.waiting import wait_until
from helpers.wyoming import SHARED_FILE_LIMIT, Server, proc_status, transcribe
from helpers.wyoming_wire import MALFORMED, chunk16, codes, connect, events_until_close, exchange, frame, start16
from wyoming.event import Event, read_event

from edgeasr.config import load_config

# the daemon started and warmed, then each attack and its recovery: 40 s for the first test in the
# full run (its tests share the daemon, so they go together)
pytestmark = pytest.mark.slow

DECODE_GUARD_S = 120.0  # a guard against a hang where a reply waits for a decode, not a measurement


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


def test_idle_connections_past_the_file_limit_do_not_lock_out_home_assistant(daemon):
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
    recovered(daemon, before, f"{n} connections sending unknown events")


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


def test_declared_lengths_are_refused_before_a_byte_is_read(daemon):
    before = Idle.of(daemon)
    for head in (b'{"type": "transcribe", "data_length": 2147483648}\n',
                 b'{"type": "nonsense", "payload_length": 2147483648}\n',
                 start16() + b'{"type": "audio-chunk", "payload_length": 2147483648}\n'):
        answer, sent = stream(daemon.port, head, 2 * READ_BOUND)
        assert codes(answer) in (["too-large"], ["audio-too-long"]), answer
        assert sent < READ_BOUND, sent  # socket buffers, not all that was offered
    recovered(daemon, before, "2^31 bytes declared, 128 MiB offered, 3 times")


def test_refused_audio_starts_leave_nothing_behind(daemon):
    """The lanes are counted in process (test_wyoming_limits.py); here what many refusals cost the daemon."""
    before = Idle.of(daemon)
    for _ in range(200):
        assert codes(exchange(daemon.port, start16(rate=0, width=3))) == ["bad-request"]
    recovered(daemon, before, "200 refused audio-starts")


def test_a_256_mib_chunk_is_refused_within_100_mb_of_peak(daemon):
    before = Idle.of(daemon)
    Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    header = {"type": "audio-chunk", "data_length": 42, "payload_length": 256 << 20}
    data = json.dumps({"rate": 16000, "width": 2, "channels": 1}).encode()
    answer, sent = stream(daemon.port, start16() + json.dumps(header).encode() + b"\n" + data, 256 << 20)
    assert codes(answer) == ["too-large"] and sent < READ_BOUND  # over the 4 MiB a payload may have
    peak = proc_status(daemon.pid, "VmHWM")
    print(f"\na 256 MiB audio-chunk: peak RSS {peak:.0f} MB, {peak - before.rss_mb:.0f} MB over the {before.rss_mb:.0f} MB before")
    assert peak - before.rss_mb < 100
    recovered(daemon, before, "a 256 MiB audio-chunk")


def test_the_largest_chunk_allowed_is_converted_within_100_mb_of_peak(daemon):
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


def test_malformed_events_and_abrupt_disconnects_leave_the_daemon_serving(daemon):
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
    recovered(daemon, before, "malformed events, 15 abrupt disconnects")


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


def test_one_sample_chunks_read_as_the_same_audio(daemon, dev_dir):
    """11.7 s (a window committed while it arrives) in one-sample audio-chunks: the transcript
    of the same audio in 100 ms chunks. (test_wyoming_limits.py checks that their cost is linear.)"""
    before = Idle.of(daemon)
    pcm = dev_clip(LONG).tobytes()
    text_100ms, cpu_100ms, _ = timed_request(daemon, pcm, 1600)
    text_1, cpu_1, wall_1 = timed_request(daemon, pcm, 1)
    per_event_us = 1e6 * (cpu_1 - cpu_100ms) / (len(pcm) // 2)
    print(f"\none-sample chunks: {len(pcm) // 2 / 16000:.1f} s in 100 ms chunks {cpu_100ms:.1f} s CPU; in {len(pcm) // 2} "
          f"one-sample chunks {cpu_1:.1f} s CPU ({per_event_us:.0f} us per event), {wall_1:.1f} s to the transcript")
    assert wer(text_100ms, text_1) <= 0.05, (text_100ms, text_1)
    recovered(daemon, before, f"{len(pcm) // 2} one-sample chunks")


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
