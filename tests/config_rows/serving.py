"""Rows for `pipeline`, `wyoming` and `output`: the microphone front end's queue
(daemon.build_pipeline), the Wyoming server the daemon builds (daemon.build_wyoming: its socket,
its limits, and a request's session fed by audio position), and what the publishers print."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import soundfile as sf
from helpers.audio import dev_clip
from helpers.ports import HOST, free_port
from helpers.wyoming import verdicts
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart
from wyoming.event import Event, read_event, write_event
from wyoming.info import Describe

from config_rows.lab import Lab, Rows, frames, silence, transcript
from edgeasr.bundle import load_bundle
from edgeasr.daemon import build_outputs, build_pipeline, build_wyoming
from edgeasr.stages import SAMPLE_RATE, Intent, Vocabulary
from edgeasr.worker import Job, Worker
from edgeasr.wyoming.server import WyomingServer
from edgeasr.wyoming.session import Session

rows = Rows()
SHORT = "alsa_front-center"  # "Front Center": 1.2 s of speech
FRAME = 480  # samples in a 30 ms VAD frame
GUARD_S = 10.0  # a socket read's guard against a hang, not a measurement


# -- pipeline ------------------------------------------------------------------------------------

@rows.observe("pipeline.queue_s", "model")
def _pipeline_queue_s(lab: Lab) -> None:
    """A live input's queue holds this many seconds of speech: beyond, the oldest is dropped."""
    path = lab.tmp / "said.wav"
    sf.write(path, dev_clip(SHORT), SAMPLE_RATE)
    dropped = {}
    for queue_s in (60.0, 3.0):
        cfg = lab.cfg({"input.source": "file", "input.path": str(path), "input.realtime": True,
                       "pipeline.queue_s": queue_s, "model.path": str(lab.bundle)})
        worker = Worker(lab.engine())  # not started: what is queued stays queued
        pipeline = build_pipeline(cfg, load_bundle(lab.bundle), worker, build_outputs(cfg, "whisper-test", "onnx"))
        for _ in range(3):
            pipeline.lane.submit(Job(lambda engine, should_stop: None, 2.0))
        dropped[queue_s] = pipeline.lane.dropped
    assert dropped == {60.0: 0, 3.0: 2}


rows.cannot("pipeline.stop_deadline_s", "a deadline on SIGTERM: only a timed wait shows it (no timing assertions)")


@dataclass
class Recorder:
    """A lane that runs nothing and notes where in the audio each job came."""

    at: Callable[[], int]
    finals: list[int] = field(default_factory=list)
    partials: list[int] = field(default_factory=list)

    def submit(self, job, stop=None) -> list:
        self.finals.append(self.at())
        return []

    def offer_partial(self, job) -> None:
        self.partials.append(self.at())

    def close(self) -> None:
        pass


def server(lab: Lab, keys: dict, worker: Worker | None = None) -> WyomingServer:
    """The Wyoming server the daemon builds for these keys (not started)."""
    cfg = lab.cfg({"input.source": "none", "wyoming.uri": f"tcp://{HOST}:{free_port()}",
                   "model.path": str(lab.bundle), **keys})
    return build_wyoming(cfg, load_bundle(lab.bundle), worker or Worker(None), lambda: None, Vocabulary)


def request(lab: Lab, keys: dict, audio: np.ndarray, block: int) -> tuple[Recorder, list[int]]:
    """A request's session as the server makes it, fed `block` samples at a time; its clock is
    the audio's position. Returns its jobs' positions and where its endpoint came."""
    built = server(lab, keys)
    fed = [0]
    lane = Recorder(lambda: fed[0])
    endpoints: list[int] = []
    session = Session(lane, built.session_options, built.detector(), language=None, on_partial=print,  # type: ignore[arg-type]
                      on_final=print, on_error=print, on_endpoint=lambda: endpoints.append(fed[0]),
                      clock=lambda: fed[0] / SAMPLE_RATE)
    session.start(SAMPLE_RATE, 2, 1)
    for piece in frames(audio, block):
        fed[0] += len(piece)
        session.add(piece.tobytes(), SAMPLE_RATE, 2, 1)
    return lane, endpoints


@rows.observe("pipeline.partial_interval_ms", "model")
def _pipeline_partial_interval_ms(lab: Lab) -> None:
    """Speech still going on is decoded every 200 ms of it, more often than every 500 ms (and never at 0)."""
    audio = np.concatenate([silence(0.3), dev_clip(SHORT)])
    offered = {ms: len(request(lab, {"pipeline.partial_interval_ms": ms}, audio, SAMPLE_RATE // 10)[0].partials)
               for ms in (0, 200, 500)}
    assert offered[0] == 0 < offered[500] < offered[200], offered


def _speculated_at(lab: Lab, after_ms: int | None) -> list[int]:
    audio = np.concatenate([silence(0.3), dev_clip(SHORT), silence(1.0)])
    keys = {"pipeline.speculate_after_ms": after_ms, "pipeline.partial_interval_ms": 0}
    return request(lab, keys, audio, FRAME)[0].finals


@rows.observe("pipeline.speculate_after_ms", "model")
def _pipeline_speculate_after_ms(lab: Lab) -> None:
    """The pause after the speech is decoded once it has lasted 600 ms: 300 ms later than by default."""
    (default,), (later,) = _speculated_at(lab, 300), _speculated_at(lab, 600)
    assert later - default == 300 * SAMPLE_RATE // 1000
    assert _speculated_at(lab, None) == []


# -- wyoming: the server -------------------------------------------------------------------------

@contextmanager
def serving(lab: Lab, keys: dict) -> Iterator[WyomingServer]:
    started = server(lab, {"pipeline.partial_interval_ms": 0, "pipeline.speculate_after_ms": None, **keys}).start()
    try:
        yield started
    finally:
        started.stop()


def port_of(served: WyomingServer) -> int:
    assert served.options.uri is not None
    return int(served.options.uri.rsplit(":", 1)[1])


class Client:
    """A Wyoming client on a plain socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=GUARD_S)
        self.stream = self.sock.makefile("rwb")

    def send(self, *events: Event) -> None:
        for event in events:
            write_event(event, self.stream)

    def read(self) -> Event | None:
        try:
            return read_event(self.stream)
        except ConnectionError:
            return None

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def start_request(client: Client) -> Event | None:
    client.send(Transcribe().event(), AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
    return client.read()


@rows.observe("wyoming.uri", "model")
def _wyoming_uri(lab: Lab) -> None:
    path = lab.tmp / "wyoming.sock"
    cfg = lab.cfg({"input.source": "none", "wyoming.uri": f"unix://{path}", "model.path": str(lab.bundle)})
    served = build_wyoming(cfg, load_bundle(lab.bundle), Worker(None), lambda: None, Vocabulary).start()
    try:
        with socket.socket(socket.AF_UNIX) as sock, sock.makefile("rwb") as stream:
            sock.settimeout(GUARD_S)
            sock.connect(str(path))
            write_event(Describe().event(), stream)
            info = read_event(stream)
        assert info is not None and info.type == "info"
    finally:
        served.stop()


@rows.observe("wyoming.zeroconf", "model")
def _wyoming_zeroconf(lab: Lab) -> None:
    from zeroconf import Zeroconf

    with serving(lab, {"wyoming.zeroconf": "edgeasr-rows"}) as served:
        browser = Zeroconf()
        try:
            info = browser.get_service_info("_wyoming._tcp.local.", "edgeasr-rows._wyoming._tcp.local.",
                                            timeout=int(GUARD_S * 1000))
        finally:
            browser.close()
    assert info is not None and info.port == port_of(served)


@rows.observe("wyoming.max_sessions", "model")
def _wyoming_max_sessions(lab: Lab) -> None:
    with serving(lab, {"wyoming.max_sessions": 1}) as served:
        first, second = Client(port_of(served)), Client(port_of(served))
        assert start_request(first).type == "transcript-start"
        refused = start_request(second)
        assert refused.type == "error" and "wyoming.max_sessions" in refused.data["text"]
        first.close(), second.close()


@rows.observe("wyoming.max_audio_s", "model")
def _wyoming_max_audio_s(lab: Lab) -> None:
    second = AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=bytes(2 * SAMPLE_RATE)).event()
    with serving(lab, {"wyoming.max_audio_s": 0.5}) as served:
        client = Client(port_of(served))
        assert start_request(client).type == "transcript-start"
        client.send(second)
        refused = client.read()
        client.close()
    assert refused is not None and refused.data["code"] == "audio-too-long"


@rows.observe("wyoming.max_connections", "model")
def _wyoming_max_connections(lab: Lab) -> None:
    """At one connection, a new one replaces the idle one."""
    with serving(lab, {"wyoming.max_connections": 1, "wyoming.max_sessions": 1}) as served:
        idle, new = Client(port_of(served)), Client(port_of(served))
        new.send(Describe().event())
        assert new.read().type == "info"
        assert idle.read() is None  # closed to make room
        idle.close(), new.close()


@rows.observe("wyoming.allow", "model")
def _wyoming_allow(lab: Lab) -> None:
    with serving(lab, {"wyoming.allow": ["10.0.0.0/8"]}) as served:
        client = Client(port_of(served))
        with contextlib.suppress(OSError):  # closed before it was written to
            client.send(Describe().event())
        assert client.read() is None  # loopback is not in the list: closed at once
        client.close()


@rows.observe("wyoming.endpoint_ms", "model")
def _wyoming_endpoint_ms(lab: Lab) -> None:
    """The transcript goes out within a frame of the silence after the speech reaching 500 ms."""
    keys = {"wyoming.endpoint_ms": 500}
    audio = np.concatenate([silence(0.3), dev_clip(SHORT)[: len(dev_clip(SHORT)) // FRAME * FRAME], silence(2.0)])
    spoken = np.flatnonzero(verdicts(lab.cfg(keys), audio))
    speech_end = (spoken[-1] + 1) * FRAME
    _, endpoints = request(lab, keys, audio, FRAME)
    assert len(endpoints) == 1 and 0 <= endpoints[0] - (speech_end + SAMPLE_RATE // 2) < FRAME, endpoints
    assert request(lab, {}, audio, FRAME)[1] == []  # null: only audio-stop ends a request


# -- output -------------------------------------------------------------------------------------------

@rows.observe("output.stdout")
def _output_stdout(lab: Lab) -> None:
    assert len(lab.published({}, transcript())) == 1
    assert lab.published({"output.stdout": False}, transcript()) == []


@rows.observe("output.words", "model")
def _output_words(lab: Lab) -> None:
    timed = lab.transcribe({"output.words": True}, dev_clip(SHORT))
    words = [w for s in timed.segments for w in s.words]
    assert [w.word.strip() for w in words] == ["Front", "Center."] and words[0].end <= words[1].start
    assert all(not s.words for s in lab.transcribe({}, dev_clip(SHORT)).segments)


@rows.observe("output.intent")
def _output_intent(lab: Lab) -> None:
    said = transcript(intent=Intent("HassTurnOn", (("name", "Lamp"),)))
    (line,) = lab.published({"output.intent": True}, said)
    assert line["intent"] == {"name": "HassTurnOn", "slots": {"name": "Lamp"}}
    assert "intent" not in lab.published({}, said)[0]

