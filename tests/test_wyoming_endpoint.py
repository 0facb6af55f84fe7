"""`wyoming.endpoint_ms`: the transcript goes out once the silence after the speech reaches it,
whatever the VAD frame (`vad.frame_ms`), before the client's audio-stop.

A real Wyoming server in process (daemon.build_wyoming, the real worker, tiny.en), a client
on its socket. Where the endpoint fires is read from audio positions, not from the clock: the
request is speech A, digital silence, then speech B. The VAD the session runs is run here on
the same samples (it is deterministic), so the silence after A is known to the frame. With
one frame less than it takes to reach endpoint_ms, no endpoint: B is heard and the transcript
waits for audio-stop. With exactly the frames that reach it, the transcript comes without
audio-stop, and B, which starts on the next frame (in the same audio-chunk), is not heard.
"""

from __future__ import annotations

import csv
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from helpers.audio import DEV, read_wav
from helpers.ports import HOST, free_port
from helpers.text import normalize
from helpers.wyoming import verdicts
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import read_event, write_event

from edgeasr.bundle import load_bundle
from edgeasr.config import Config, load_config
from edgeasr.daemon import build_wyoming
from edgeasr.stages import SAMPLE_RATE, Vocabulary, frames_reaching
from edgeasr.worker import Worker

CHUNK = SAMPLE_RATE // 10  # 100 ms per audio-chunk, as Home Assistant sends
REPLY_TIMEOUT_S = 120.0  # a guard against a hang, not a measurement
SPEECH_A = DEV / "audio" / "alsa_front-center.wav"  # "Front Center", a 270 ms pause inside
SPEECH_B = DEV / "audio" / "alsa_rear-left.wav"  # "Rear Left"


@dataclass
class Served:
    cfg: Config
    port: int


@pytest.fixture
def serve(tiny_extras_engine, tiny_bundle) -> Iterator:
    """serve(**config keys) -> a started server with the real engine; stopped after."""
    worker = Worker(tiny_extras_engine).start()
    servers = []

    def make(keys: dict) -> Served:
        port = free_port()
        cfg = load_config(None, {"input.source": "none", "wyoming.uri": f"tcp://{HOST}:{port}",
                                 "model.path": str(tiny_bundle), **keys})
        server = build_wyoming(cfg, load_bundle(tiny_bundle), worker, lambda: None, Vocabulary)
        servers.append(server.start())
        return Served(cfg, port)

    yield make
    for server in servers:
        server.stop()
    worker.stop(10.0)


@dataclass(frozen=True)
class Request:
    audio: np.ndarray  # int16: A, silence, B
    speech_end: int  # samples: the end of A's last speech frame
    silence: int  # frames of silence between A's speech and B's
    frame: int  # samples per VAD frame


def request(cfg: Config, silent_frames: int) -> Request:
    """A, digital silence, B, with exactly `silent_frames` frames judged silent between the
    last speech frame of A and the first of B (so that B starts on the frame after them)."""
    n = SAMPLE_RATE * cfg.vad.frame_ms // 1000
    a, b = read_wav(SPEECH_A), read_wav(SPEECH_B)
    a = a[: len(a) // n * n]
    zeros = silent_frames
    for _ in range(5):  # the VAD's overhang and B's quiet start count too: measured, then adjusted
        audio = np.concatenate([a, np.zeros(zeros * n, np.int16), b])
        spoken = np.flatnonzero(verdicts(cfg, audio))
        last_a = spoken[spoken < len(a) // n + zeros].max()
        first_b = spoken[spoken > last_a].min()
        silence = first_b - last_a - 1
        if silence == silent_frames:
            gaps = np.diff(spoken) - 1
            assert sorted(gaps)[-2] < silent_frames, gaps  # no other pause as long in the request
            return Request(audio, (last_a + 1) * n, silence, n)
        zeros += silent_frames - silence
    raise AssertionError(f"no silence of {silent_frames} frames between A and B")


def chunks(audio: np.ndarray, straddle: int) -> Iterator[np.ndarray]:
    """100 ms chunks, but one second from `straddle` on in one chunk."""
    bounds = [*range(0, straddle, CHUNK), straddle, *range(straddle + SAMPLE_RATE, len(audio), CHUNK), len(audio)]
    for start, end in zip(bounds, bounds[1:]):
        yield audio[start:end]


def send(port: int, request: Request, stop: bool) -> str:
    """One request in chunks, the one from the frame before B on holding the start of B too
    (audio-stop only if `stop`); the transcript's text."""
    with socket.create_connection((HOST, port), timeout=REPLY_TIMEOUT_S) as sock, sock.makefile("rwb") as stream:
        write_event(Transcribe().event(), stream)
        write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event(), stream)
        for chunk in chunks(request.audio, request.speech_end + (request.silence - 1) * request.frame):
            write_event(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=chunk.tobytes()).event(), stream)
        if stop:
            write_event(AudioStop().event(), stream)
        while (event := read_event(stream)) is not None:
            if Transcript.is_type(event.type):
                return Transcript.from_event(event).text
    raise AssertionError("the connection closed without a transcript")


@pytest.mark.parametrize("endpoint_ms, frame_ms", [(500, 30), (710, 20), (10_000, 30)])
def test_the_endpoint_comes_within_a_frame_of_the_silence_reaching_it(serve, endpoint_ms, frame_ms):
    served = serve({"wyoming.endpoint_ms": endpoint_ms, "vad.frame_ms": frame_ms})
    frame = SAMPLE_RATE * frame_ms // 1000
    needed = frames_reaching(endpoint_ms, frame_ms)
    assert needed * frame_ms != endpoint_ms  # not a multiple of the frame

    short = request(served.cfg, needed - 1)  # the silence falls short of endpoint_ms
    assert short.silence * frame < endpoint_ms * SAMPLE_RATE // 1000
    heard = normalize(send(served.port, short, stop=True))
    assert "front center" in heard and "left" in heard, heard

    reached = request(served.cfg, needed)
    fired_at = reached.speech_end + reached.silence * frame  # where the frame that reaches it ends
    reach = reached.speech_end + endpoint_ms * SAMPLE_RATE // 1000  # where the silence reaches endpoint_ms
    assert 0 <= fired_at - reach < frame
    heard = normalize(send(served.port, reached, stop=False))  # no audio-stop: the endpoint answers
    assert "front center" in heard and "left" not in heard and "rear" not in heard, heard


COMMANDS = DEV.parent / "dev-commands"


@pytest.mark.parametrize("clip", ["rhasspy3_play_the_beatles", "rhasspy3_turn_on_the_lamp",
                                  "rhasspy_mqtt_what_time_is_it"])
def test_a_click_before_a_command_is_no_speech_for_the_endpoint(serve, clip):
    """Recorded commands start with a sound the VAD calls speech for a few frames, then a pause
    longer than the endpoint, then the command: the endpoint waits for vad.min_speech_ms of
    speech (what the segmenter keeps as speech), so the command is heard, not cut before it."""
    served = serve({"wyoming.endpoint_ms": 250})
    audio = read_wav(COMMANDS / "audio" / f"{clip}.wav")
    frames = verdicts(served.cfg, audio)
    first = int(np.argmax(frames))  # a blip of speech frames, then a pause longer than 250 ms
    blip = int(np.argmin(frames[first:]))
    pause = int(np.argmax(frames[first + blip :]))
    frame_ms = served.cfg.vad.frame_ms
    assert blip * frame_ms < served.cfg.vad.min_speech_ms and pause * frame_ms > 250, (blip, pause)
    n = SAMPLE_RATE * frame_ms // 1000
    whole = Request(np.concatenate([audio, np.zeros(SAMPLE_RATE, np.int16)]), len(audio), 1, n)
    heard = normalize(send(served.port, whole, stop=False))  # no audio-stop: the endpoint answers
    expected = normalize(next(r["reference"] for r in csv.DictReader(
        (COMMANDS / "manifest.tsv").open(), delimiter="\t", quoting=csv.QUOTE_NONE) if r["id"] == clip))
    assert heard == expected, (heard, expected)
