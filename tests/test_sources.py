"""File and stdin sources, and the stream clock, on real dev audio."""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from edgeasr.audio.clock import StreamClock
from edgeasr.audio.sources import FileSource, StdinSource, to_int16
from edgeasr.errors import AudioError, MissingInputError
from edgeasr.stages import SAMPLE_RATE, AudioChunk

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "dev"
CLIP = DEV / "audio" / "ls_test-other_1688-142285-0002.wav"  # 2.8 s, 16 kHz mono


def drain(source, timeout_s: float = 1.0) -> list[AudioChunk]:
    chunks = []
    while not source.ended:
        chunk = source.read(timeout_s)
        if chunk is not None:
            chunks.append(chunk)
    source.close()
    return chunks


def joined(chunks: list[AudioChunk]) -> np.ndarray:
    offsets = [c.start_sample for c in chunks]
    ends = np.cumsum([len(c.samples) for c in chunks])
    assert offsets == [0, *ends[:-1].tolist()], "chunks must be contiguous"
    assert all(c.samples.dtype == np.int16 and c.samples.ndim == 1 for c in chunks)
    return np.concatenate([c.samples for c in chunks])


def test_16k_mono_file_is_delivered_unchanged():
    x, _ = sf.read(CLIP, dtype="int16")
    chunks = drain(FileSource(CLIP, realtime=False, block_ms=30))
    np.testing.assert_array_equal(joined(chunks), x)
    assert {len(c.samples) for c in chunks[:-1]} == {480}


def test_44k1_stereo_file_comes_out_16k_mono(tmp_path):
    x, _ = sf.read(CLIP, dtype="float32")
    left = soxr.resample(x, 16000, 44100)
    stereo = np.stack([left, 0.5 * left], axis=1)  # mono downmix = 0.75 * left
    path = tmp_path / "stereo44k1.flac"
    sf.write(path, stereo, 44100, subtype="PCM_16")
    src = FileSource(path, realtime=False, block_ms=30)
    assert (src.native_rate, src.channels) == (44100, 2)
    y = joined(drain(src))
    stored = sf.read(path, dtype="float32")[0].mean(axis=1)
    expected = to_int16(soxr.resample(stored, 44100, 16000))
    assert abs(len(y) - len(expected)) <= 1
    n = min(len(y), len(expected))
    assert np.abs(y[:n].astype(np.int32) - expected[:n]).max() <= 2  # streamed vs one-shot soxr
    # and it is the original 16 kHz speech at 0.75 gain
    ref = 0.75 * x[:n] * 32768
    snr = 10 * np.log10(np.mean(ref**2) / np.mean((y[:n] - ref) ** 2))
    assert snr > 20


def test_realtime_file_is_paced_like_a_microphone():
    src = FileSource(CLIP, realtime=True, block_ms=30)
    assert src.read(0.0) is None  # the first block is not "captured" yet
    t0 = time.monotonic()
    chunks = drain(src, timeout_s=0.5)
    elapsed = time.monotonic() - t0
    duration = len(joined(chunks)) / SAMPLE_RATE
    assert elapsed >= 0.9 * duration  # a behaviour check: blocks are not delivered early
    monos = [c.t_mono for c in chunks]
    # each block is delivered no earlier than its end in stream time
    for c in chunks:
        assert c.t_mono - monos[0] >= (c.start_sample + len(c.samples) - 480) / SAMPLE_RATE - 0.01


def test_corrupt_file_is_an_audio_error_naming_it(tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + bytes(200))
    with pytest.raises(AudioError, match=r"broken\.wav: cannot decode audio") as info:
        FileSource(bad, realtime=False, block_ms=30)
    assert info.value.exit_code == 65
    text = tmp_path / "notes.flac"
    text.write_text("not audio at all\n")
    with pytest.raises(AudioError, match=r"notes\.flac"):
        FileSource(text, realtime=False, block_ms=30)


def test_missing_file_is_missing_input(tmp_path):
    with pytest.raises(MissingInputError, match=r"nothere\.wav: no such audio file") as info:
        FileSource(tmp_path / "nothere.wav", realtime=False, block_ms=30)
    assert info.value.exit_code == 66


def test_stdin_source_reads_a_real_pipe(tmp_path):
    x, _ = sf.read(CLIP, dtype="int16")
    raw = tmp_path / "clip.raw"
    raw.write_bytes(x.astype("<i2").tobytes())
    # the writer starts only after a while: read() must time out meanwhile, not block
    proc = subprocess.Popen(["sh", "-c", f"sleep 0.5; cat {raw}"], stdout=subprocess.PIPE)
    src = StdinSource(proc.stdout, block_ms=30)
    assert src.read(0.05) is None and not src.ended
    y = joined(drain(src))
    proc.wait(timeout=10)
    np.testing.assert_array_equal(y, x)


def test_stdin_odd_byte_is_dropped_not_misaligned(tmp_path):
    x = np.arange(-1000, 1000, dtype=np.int16)
    raw = tmp_path / "odd.raw"
    raw.write_bytes(x.astype("<i2").tobytes() + b"\x01")
    with raw.open("rb", buffering=0) as stream:  # unbuffered: short reads happen
        y = joined(drain(StdinSource(stream, block_ms=10)))
    np.testing.assert_array_equal(y, x)


def test_stream_clock_maps_samples_to_utc():
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    clock = StreamClock(now_utc=lambda: now, monotonic=lambda: 100.5)
    # first chunk: samples 0..16000 captured, the last one at t_mono 100.0, seen at 100.5
    clock.observe(AudioChunk(np.zeros(16000, np.int16), 0, 100.0))
    assert clock.utc(0) == now - dt.timedelta(seconds=1.5)
    assert clock.utc(24000) - clock.utc(8000) == dt.timedelta(seconds=1)
    clock.observe(AudioChunk(np.zeros(16000, np.int16), 16000, 101.0))  # the anchor stays
    assert clock.utc(0) == now - dt.timedelta(seconds=1.5)
    assert clock.utc(0).tzinfo is dt.UTC
