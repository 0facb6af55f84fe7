"""`edgeasr models calib`: a calibration set for the Hailo DFC's quantizer, from real speech.

The DFC's optimize step runs the encoder on representative inputs to choose its 8/16-bit
ranges, so the set must look like what the daemon feeds the NPU: Whisper log-mel windows
(NHWC [1, 1, n_frames, n_mels], float32) of speech, the last one of a file zero-padded as the
daemon pads a short utterance. Hailo builds its own from LibriSpeech dev-clean, 4000 windows
for tiny (hailocs/hailo-whisper: conversion/convert_whisper_encoder.py).

Files are visited in a fixed pseudo-random order (more speakers in a small set), each is cut
into consecutive windows of the bundle's length, and windows with too little loud audio are
skipped. The output is one .npy [count, 1, n_frames, n_mels] float32, written through a
memory map (a 4000-window set is 1.3 GB) and renamed into place when complete.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from edgeasr.asr.features import MelSpec, log_mel
from edgeasr.audio.files import load_audio
from edgeasr.bundle import AudioSpec
from edgeasr.errors import AudioError, MissingInputError, OutputError, UsageError

log = logging.getLogger(__name__)

SHUFFLE_SEED = 0  # the file order, so a set can be rebuilt identically
FRAME_S = 0.025  # loudness is judged on 25 ms frames
LOUD_DBFS = -45.0  # a frame this loud or louder counts as sound
MIN_LOUD_FRACTION = 0.2  # a window needs this share of loud frames (speech, not room tone)
MIN_WINDOW_S = 1.0  # a file's last, padded window must hold at least this much audio


def audio_files(audio_dir: Path) -> list[Path]:
    """Every file under audio_dir that libsndfile can read by its extension, in a fixed order."""
    import soundfile as sf

    suffixes = {"." + fmt.lower() for fmt in sf.available_formats()} | {".oga", ".aif", ".opus"}
    files = sorted(p for p in Path(audio_dir).rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    random.Random(SHUFFLE_SEED).shuffle(files)
    return files


def loud_fraction(samples: np.ndarray, sample_rate: int) -> float:
    """Share of 25 ms frames at or above LOUD_DBFS (samples in [-1, 1])."""
    n = max(1, int(FRAME_S * sample_rate))
    frames = samples[: len(samples) // n * n].reshape(-1, n)
    if not len(frames):
        return 0.0
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    dbfs = 20.0 * np.log10(np.maximum(rms, 1e-10))
    return float(np.mean(dbfs >= LOUD_DBFS))


def speech_windows(audio: np.ndarray, audio_spec: AudioSpec) -> Iterator[np.ndarray]:
    """Log-mel windows [1, 1, n_frames, n_mels] of one file's speech (near-silent ones skipped)."""
    spec = mel_spec(audio_spec)
    n, rate = spec.n_samples, audio_spec.sample_rate
    for start in range(0, len(audio), n):
        chunk = audio[start : start + n]
        if len(chunk) < MIN_WINDOW_S * rate or loud_fraction(chunk, rate) < MIN_LOUD_FRACTION:
            continue
        yield log_mel(chunk, spec)


def mel_spec(audio: AudioSpec) -> MelSpec:
    return MelSpec(audio.sample_rate, audio.n_fft, audio.hop_length, audio.n_mels, audio.n_frames)


def build_calibration_set(audio_dir: Path, count: int, out: Path, audio: AudioSpec) -> Path:
    """Write `count` speech windows to `out` (.npy, [count, 1, n_frames, n_mels] float32)."""
    audio_dir, out = Path(audio_dir), Path(out)
    if count < 1:
        raise UsageError(f"--count must be at least 1, got {count}")
    if not audio_dir.is_dir():
        raise MissingInputError(f"--audio {audio_dir}: no such directory")
    files = audio_files(audio_dir)
    if not files:
        raise MissingInputError(f"--audio {audio_dir}: no audio files in it (WAV, FLAC, OGG, ...)")
    tmp = out.with_name(f".{out.name}.part")
    try:
        data = np.lib.format.open_memmap(
            tmp, mode="w+", dtype=np.float32, shape=(count, 1, audio.n_frames, audio.n_mels)
        )
    except OSError as exc:
        raise OutputError(f"--out {out}: cannot write here ({exc.strerror or exc})") from exc
    try:
        filled, used = _fill(data, files, audio)
        data.flush()
        del data
        if filled < count:
            raise AudioError(
                f"--audio {audio_dir}: its {len(files)} files hold {filled} speech windows of "
                f"{audio.window_s:g} s, fewer than --count {count} (add audio or lower --count)"
            )
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("calibration set: %d windows from %d of %d files -> %s", count, used, len(files), out)
    return out


def _fill(data: np.ndarray, files: list[Path], audio: AudioSpec) -> tuple[int, int]:
    """Windows written into data, and how many files gave some."""
    filled = used = 0
    for path in files:
        try:
            samples = load_audio(path, audio.sample_rate)
        except (AudioError, MissingInputError) as exc:
            log.warning("skipping %s", exc)
            continue
        before = filled
        for mel in speech_windows(samples, audio):
            data[filled] = mel[0]
            filled += 1
            if filled == len(data):
                return filled, used + 1
        used += filled > before
    return filled, used
