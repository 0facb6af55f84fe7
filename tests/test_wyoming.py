"""Home Assistant's Wyoming protocol end to end: the daemon in a subprocess, the real `wyoming`
client library (AsyncClient.from_uri), real dev speech."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import soundfile as sf
import soxr
from helpers.audio import LONG, SHORT, dev_clip
from helpers.daemon import Running
from helpers.text import normalize, wer
from helpers.wyoming import Reply, Server, start_server, transcribe
from wyoming.asr import TranscriptStart
from wyoming.client import AsyncClient
from wyoming.info import Describe, Info

pytestmark = pytest.mark.model


@pytest.fixture
def server(wyoming_daemon: Server) -> Server:
    return wyoming_daemon


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
    audio = dev_clip(SHORT).astype(np.float32) / 32768
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
    audio = dev_clip(LONG)
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
    audio = np.concatenate([dev_clip(LONG)] * 2)  # 23 s, over wyoming.max_audio_s
    reply = asyncio.run(transcribe(server.uri, audio))
    assert reply.error is not None and reply.error.code == "audio-too-long"
    assert "wyoming.max_audio_s" in reply.error.text
    assert asyncio.run(transcribe(server.uri, dev_clip(SHORT))).text and server.alive()


@pytest.mark.alsa  # its virtual microphone is made in the test
def test_three_clients_while_the_microphone_pipeline_runs(tiny_default_bundle, dev_dir, dev_manifest, tmp_path):
    """One engine for both front ends: a virtual ALSA microphone fed at real time (the real
    PortAudio path) speaks JFK into the MQTT-side pipeline (stdout here) while three Wyoming
    clients are served at the same time."""
    from helpers.alsa import VirtualMics

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
        return await asyncio.gather(*(transcribe(server.uri, dev_clip(n), realtime=True) for n in names))

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
