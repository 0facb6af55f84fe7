"""edgeasr.lab.hailo.calibration_set on the real dev speech: shapes, content, silence skipping, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from edgeasr.asr.features import log_mel
from edgeasr.audio.files import load_audio
from edgeasr.bundle import load_bundle
from edgeasr.errors import AudioError, MissingInputError, OutputError, UsageError
from edgeasr.lab.hailo.calibration_set import (
    audio_files,
    build_calibration_set,
    loud_fraction,
    mel_spec,
    speech_windows,
)

CLIP = "jfk_inaugural-1961.wav"  # 11 s: one full 10 s window and a 1 s tail


@pytest.fixture(scope="module")
def audio_spec(tiny_bundle):
    return load_bundle(tiny_bundle).audio


def test_set_from_dev_speech(dev_dir, audio_spec, tmp_path):
    out = build_calibration_set(dev_dir / "audio", 12, tmp_path / "calib.npy", audio_spec)
    data = np.load(out)
    assert out == tmp_path / "calib.npy"
    assert data.shape == (12, 1, audio_spec.n_frames, audio_spec.n_mels) and data.dtype == np.float32
    assert not list(tmp_path.glob(".*.part"))
    # The first window is the start of the first file (in the set's fixed order) that is speech.
    first = next(
        f
        for f in audio_files(dev_dir / "audio")
        if loud_fraction(
            load_audio(f, audio_spec.sample_rate)[: audio_spec.n_samples], audio_spec.sample_rate
        )
        >= 0.2
    )
    samples = load_audio(first, audio_spec.sample_rate)
    assert np.array_equal(data[0], log_mel(samples[: audio_spec.n_samples], mel_spec(audio_spec))[0])
    # Speech windows: Whisper's normalised log-mel spans its range, none is the constant of silence.
    assert np.all(data.reshape(12, -1).std(axis=1) > 0.1)
    assert len({row.tobytes() for row in data}) == 12


def test_windows_of_a_long_clip(dev_dir, audio_spec):
    samples = load_audio(dev_dir / "audio" / CLIP, audio_spec.sample_rate)
    windows = list(speech_windows(samples, audio_spec))
    spec = mel_spec(audio_spec)
    assert len(windows) == 2  # 0-10 s, then the 1 s tail, zero-padded as the daemon pads
    assert np.array_equal(windows[1], log_mel(samples[spec.n_samples :], spec))


def test_near_silent_audio_is_skipped(dev_dir, audio_spec, tmp_path):
    d = tmp_path / "audio"
    d.mkdir()
    (d / CLIP).symlink_to(dev_dir / "audio" / CLIP)
    hiss = np.random.default_rng(0).normal(0, 10 ** (-70 / 20), 12 * audio_spec.sample_rate)  # -70 dBFS
    sf.write(d / "room_tone.wav", hiss.astype(np.float32), audio_spec.sample_rate, subtype="FLOAT")
    assert loud_fraction(hiss, audio_spec.sample_rate) == 0.0
    out = tmp_path / "calib.npy"
    with pytest.raises(AudioError, match=r"its 2 files hold 2 speech windows of 10 s, fewer than --count 3"):
        build_calibration_set(d, 3, out, audio_spec)
    assert not out.exists() and not list(tmp_path.glob(".*.part"))
    build_calibration_set(d, 2, out, audio_spec)
    assert np.load(out).shape[0] == 2


def test_bad_input(dev_dir, audio_spec, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no audio here")
    with pytest.raises(MissingInputError, match="no audio files in it"):
        build_calibration_set(empty, 4, tmp_path / "c.npy", audio_spec)
    with pytest.raises(MissingInputError, match="no such directory"):
        build_calibration_set(tmp_path / "nowhere", 4, tmp_path / "c.npy", audio_spec)
    with pytest.raises(UsageError, match="--count must be at least 1"):
        build_calibration_set(dev_dir / "audio", 0, tmp_path / "c.npy", audio_spec)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="cannot write here"):
        build_calibration_set(dev_dir / "audio", 4, blocker / "c.npy", audio_spec)


def test_loud_fraction():
    rate = 16_000
    t = np.arange(rate) / rate
    assert loud_fraction((0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate) == 1.0  # -23 dBFS
    assert loud_fraction(np.zeros(rate, np.float32), rate) == 0.0
    half = np.concatenate([np.zeros(rate // 2), 0.1 * np.ones(rate // 2)]).astype(np.float32)
    assert loud_fraction(half, rate) == pytest.approx(0.5)
