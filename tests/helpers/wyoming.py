"""The daemon as a Wyoming server in a subprocess, and a client that talks to it as Home Assistant
does.

- `start_server` (a test that needs its own settings) and `stop_server`; the fixture
  `wyoming_daemon`, one plain server shared by every test that only talks to it.
- `transcribe(uri, audio)`: one request through the `wyoming` package's own client, as Home
  Assistant makes it; the `Reply` says what came back and when."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient
from wyoming.error import Error

from edgeasr.audio.vad import make_detector
from edgeasr.config import Config
from edgeasr.stages import SAMPLE_RATE
from edgeasr.wyoming.session import to_float, vad_samples
from helpers import REPO
from helpers.ports import HOST, free_port

MAX_AUDIO_S = 20.0  # wyoming.max_audio_s of every server here: a request of 23 s is over it
START_TIMEOUT_S = 120
CHUNK_S = 0.1  # audio per audio-chunk event, as Home Assistant sends about
# the shared server's open files: an idle daemon holds about 11, and asyncio accepts up to 100
# connections a turn of its loop, two turns before the cap (wyoming.max_connections) has closed
# one; a flood of a few hundred connections runs it out of them unless the cap holds
SHARED_FILE_LIMIT = 256


@dataclass
class Server:
    proc: subprocess.Popen
    uri: str
    port: int
    log: Path  # the daemon's stderr

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def rss(self) -> float:
        return proc_status(self.pid, "VmRSS")

    def files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))


def proc_status(pid: int, field: str) -> float:
    """A /proc/<pid>/status field in MB (VmRSS: resident now; VmHWM: the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def limit_files(n: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def start_server(tmp: Path, bundle: Path, extra: dict | None = None, env: dict | None = None, *,
                 files: int | None = None) -> Server:
    """The daemon serving Wyoming on a free port (`extra`: more "section.key" settings; `files`:
    its limit of open files), once it accepts connections. stdout is a pipe, stderr a file."""
    port = free_port()
    settings = {"model": {"path": str(bundle)}, "encoder": {"backend": "onnx"}, "input": {"source": "none"},
                "state_dir": str(tmp / "state"),
                "wyoming": {"uri": f"tcp://{HOST}:{port}", "max_audio_s": MAX_AUDIO_S}}
    for key, value in (extra or {}).items():
        section, leaf = key.split(".")
        settings.setdefault(section, {})[leaf] = value
    config = tmp / "edgeasr.yaml"
    config.write_text(yaml.safe_dump(settings))
    log = tmp / "daemon.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edgeasr", "--config", str(config)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                preexec_fn=limit_files(files) if files else None)
    server = Server(proc, f"tcp://{HOST}:{port}", port, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return server
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.communicate()
    raise AssertionError(f"the Wyoming server did not start:\n{server.log_text()[-3000:]}")


def stop_server(server: Server) -> tuple[str, str]:
    """SIGTERM; the daemon must exit 0. Its stdout and stderr."""
    server.proc.terminate()
    out, _ = server.proc.communicate(timeout=60)
    err = server.log_text()
    assert server.proc.returncode == 0, err[-3000:]
    return out, err


@pytest.fixture(scope="session")
def wyoming_daemon(tiny_default_bundle: Path, tmp_path_factory) -> Iterator[Server]:
    """The daemon as a Wyoming server only: tiny.en as imported by default, wyoming.max_audio_s
    20 s, SHARED_FILE_LIMIT open files. Shared by the tests that send it requests, attacks included (each of
    those checks that the server recovers); it must stop cleanly, with no traceback logged."""
    server = start_server(tmp_path_factory.mktemp("wyoming"), tiny_default_bundle, files=SHARED_FILE_LIMIT)
    try:
        yield server
    finally:  # the daemon never outlives the run, whatever failed
        _, err = stop_server(server)
    for sign in ("Traceback", "Task exception", "out of system resource"):
        assert sign not in err, err[-3000:]


@dataclass
class Reply:
    events: list = field(default_factory=list)
    text: str | None = None
    chunks: list[str] = field(default_factory=list)
    chunks_before_stop: int = 0
    error: Error | None = None
    stop_to_transcript_s: float | None = None
    first_chunk_s: float | None = None  # after the first audio was sent


async def send_audio(client: AsyncClient, pcm: bytes, rate: int, width: int, channels: int,
                     realtime: bool, stop_at: float = 1.0) -> None:
    step = int(CHUNK_S * rate) * width * channels
    end = int(len(pcm) * stop_at) // (width * channels) * (width * channels)
    for i in range(0, end, step):
        await client.write_event(AudioChunk(rate=rate, width=width, channels=channels, audio=pcm[i:i + step]).event())
        if realtime:
            await asyncio.sleep(CHUNK_S)


async def transcribe(uri: str, audio: np.ndarray, rate: int = 16000, width: int = 2, channels: int = 1,
                     realtime: bool = False, language: str | None = None) -> Reply:
    """One Wyoming request as Home Assistant makes it; `audio` is int16 (or int32 for width 4)."""
    reply = Reply()
    pcm = audio.astype({2: "<i2", 4: "<i4"}[width]).tobytes()
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Transcribe(language=language).event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        t0 = time.monotonic()
        sender = asyncio.create_task(send_audio(client, pcm, rate, width, channels, realtime))
        stopped: float | None = None
        # one read at a time, never cancelled: a read cut between an event's header and its data
        # would lose the event (asyncio.wait_for cancels on its timeout; asyncio.wait does not)
        reading = asyncio.ensure_future(client.read_event())
        try:
            while True:
                if stopped is None and sender.done():
                    await sender
                    await client.write_event(AudioStop().event())
                    stopped = time.monotonic()
                done, _ = await asyncio.wait({reading}, timeout=0.05 if stopped is None else 60)
                if not done:
                    if stopped is not None:
                        raise TimeoutError("no reply within 60 s of audio-stop")
                    continue
                event = reading.result()
                reading = asyncio.ensure_future(client.read_event())
                if event is None:
                    break
                reply.events.append(event.type)
                if TranscriptChunk.is_type(event.type):
                    reply.chunks.append(TranscriptChunk.from_event(event).text)
                    if stopped is None:
                        reply.chunks_before_stop += 1
                        reply.first_chunk_s = reply.first_chunk_s or time.monotonic() - t0
                elif Transcript.is_type(event.type):
                    reply.text = Transcript.from_event(event).text
                    reply.stop_to_transcript_s = time.monotonic() - stopped if stopped else None
                elif Error.is_type(event.type):
                    reply.error = Error.from_event(event)
                    break
                elif TranscriptStop.is_type(event.type):
                    break
        finally:
            reading.cancel()  # the read after the last event
    return reply


def verdicts(cfg: Config, audio: np.ndarray) -> np.ndarray:
    """The session's VAD verdict on each whole frame of `audio` (int16), as it judges them."""
    n = SAMPLE_RATE * cfg.vad.frame_ms // 1000
    samples = vad_samples(to_float(audio.tobytes(), 2, 1))
    detector = make_detector(cfg.vad)
    return np.array([detector.is_speech(samples[i : i + n]) for i in range(0, len(samples) - n + 1, n)])
