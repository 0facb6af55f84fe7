"""Home Assistant's Wyoming protocol end to end: the daemon in a subprocess, the real `wyoming`
client library (AsyncClient.from_uri), real dev speech."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from conftest import normalize, wer
from test_daemon import Running
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming_fixtures import Server, start_server, stop_server  # noqa: F401  (others import it from here)

CHUNK_S = 0.1  # audio per audio-chunk event, as Home Assistant sends about
SHORT = "ls_test-other_1688-142285-0002"  # 7.6 s
LONG = "ls_dev-clean_2412-153948-0000"  # 11.7 s: past the 10 s window

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture
def server(wyoming_daemon: Server) -> Server:
    return wyoming_daemon


def clip(dev_dir: Path, name: str) -> np.ndarray:
    audio, rate = sf.read(dev_dir / "audio" / f"{name}.wav", dtype="int16")
    assert rate == 16000
    return audio


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


def test_describe_reports_one_streaming_asr_program(server):
    async def ask() -> Info:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), 5)
            return Info.from_event(event)

    info = asyncio.run(ask())
    assert len(info.asr) == 1
    program = info.asr[0]
    assert program.installed and program.supports_transcript_streaming and program.version
    assert program.attribution.name
    (model,) = program.models
    assert model.name == "whisper-tiny.en" and model.languages == ["en"] and model.installed


def test_any_rate_width_and_channels_are_resampled(server, dev_dir, dev_manifest):
    audio = clip(dev_dir, SHORT).astype(np.float32) / 32768
    at_44k = soxr.resample(audio, 16000, 44100, quality="VHQ")
    stereo_int32 = (np.stack([at_44k, at_44k], axis=1) * 2**31 * 0.999).astype(np.int32)
    reply = asyncio.run(transcribe(server.uri, stereo_int32.reshape(-1), rate=44100, width=4, channels=2))
    assert reply.error is None, reply.error
    reference = next(r["reference"] for r in dev_manifest if r["id"] == SHORT)
    assert wer(reference, reply.text) <= 0.15
    # the events of a request's reply, in order (its text is `edgeasr transcribe`'s: test_same_text)
    assert reply.events[0] == TranscriptStart().event().type and reply.events[-1] == "transcript-stop"
    assert reply.events.index("transcript") < reply.events.index("transcript-stop")


def test_partial_text_arrives_while_a_long_utterance_is_spoken(server, dev_dir, dev_manifest):
    audio = clip(dev_dir, LONG)
    reply = asyncio.run(transcribe(server.uri, audio, realtime=True))
    assert reply.error is None, reply.error
    assert reply.chunks_before_stop >= 1
    # chunks are appended by clients: together they continue into the final transcript
    assert normalize(reply.text).startswith(normalize("".join(reply.chunks)).split(" ")[0])
    reference = next(r["reference"] for r in dev_manifest if r["id"] == LONG)
    assert wer(reference, reply.text) <= 0.2
    print(f"\nfirst transcript-chunk {reply.first_chunk_s:.2f} s after the audio began; "
          f"audio-stop -> transcript {reply.stop_to_transcript_s * 1e3:.0f} ms")


def test_an_oversized_session_gets_an_error(server, dev_dir):
    audio = np.concatenate([clip(dev_dir, LONG)] * 2)  # 23 s, over wyoming.max_audio_s
    reply = asyncio.run(transcribe(server.uri, audio))
    assert reply.error is not None and reply.error.code == "audio-too-long"
    assert "wyoming.max_audio_s" in reply.error.text
    assert asyncio.run(transcribe(server.uri, clip(dev_dir, SHORT))).text and server.alive()


@pytest.mark.alsa  # its virtual microphone is made in the test
def test_three_clients_while_the_microphone_pipeline_runs(tiny_default_bundle, dev_dir, dev_manifest, tmp_path):
    """One engine for both front ends: a virtual ALSA microphone fed at real time (the real
    PortAudio path) speaks JFK into the MQTT-side pipeline (stdout here) while three Wyoming
    clients are served at the same time."""
    from alsa_fixtures import VirtualMics

    mics = VirtualMics(tmp_path / "alsa", ["fifomic"])
    jfk, sr = sf.read(dev_dir / "audio" / "jfk_inaugural-1961.wav", dtype="int16")
    server = start_server(tmp_path, tiny_default_bundle, {"input.source": "mic", "input.device": "fifomic",
                                                          "input.samplerate": sr, "output.stdout": True},
                          env=mics.env)
    daemon = Running(server.proc)
    # once the daemon captures (PortAudio's enumeration at its start may read from the FIFO)
    feeder = mics.feed("fifomic", np.concatenate([np.zeros(sr, np.int16), jfk]), sr, 480)
    names = ["ls_test-other_1688-142285-0002", "ljs_LJ001-0001", "cmu_goforward"]

    async def three() -> list[Reply]:
        return await asyncio.gather(*(transcribe(server.uri, clip(dev_dir, n), realtime=True) for n in names))

    def mic_text(lines: list[dict]) -> str:
        return normalize(" ".join(m["text"] for m in lines))

    try:
        replies = asyncio.run(three())
        # until JFK's last words are out (the feeder goes on: PortAudio's close waits for data)
        lines = daemon.wait_for(lambda lines: mic_text(lines).count("country") >= 2, timeout_s=60)
    finally:
        daemon.stop()
        err = daemon.finish(60) + server.log_text()
        feeder.stop()
        mics.close()
    references = {r["id"]: r["reference"] for r in dev_manifest}
    for name, reply in zip(names, replies):
        assert reply.error is None, (name, reply.error)
        assert wer(references[name], reply.text) <= 0.25, (name, reply.text)
    text = mic_text(lines)
    assert wer(references["jfk_inaugural-1961"], text) <= 0.15, (text, err[-2000:])
    assert "ask not what your country can do for you" in text and "ask what you can do for your country" in text
