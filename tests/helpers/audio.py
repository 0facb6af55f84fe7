"""The recordings the tests read: ../shared/eval beside the repository (the dev set, the recorded
commands, more dev speech), by id or by path."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import numpy as np
import soundfile as sf

from edgeasr.stages import SAMPLE_RATE
from helpers import REPO

SHARED = REPO.parent / "shared"
DEV = SHARED / "eval" / "dev"
LONGFORM = DEV / "longform"
WINDOW_S = 10.0  # the tiny bundle's window

# two dev utterances the Wyoming and smoke tests send
SHORT = "ls_test-other_1688-142285-0002"  # 7.6 s
LONG = "ls_dev-clean_2412-153948-0000"  # 11.7 s: past the 10 s window


def read_wav(path: Path) -> np.ndarray:
    """A 16 kHz WAV file's samples as int16 (AssertionError at another rate)."""
    samples, rate = sf.read(path, dtype="int16")
    assert rate == SAMPLE_RATE, f"{path}: {rate} Hz"
    return samples


@functools.cache
def _clip(name: str) -> np.ndarray:
    for folder in ("dev", "dev-commands", "dev-more"):
        path = SHARED / "eval" / folder / "audio" / f"{name}.wav"
        if path.is_file():
            return read_wav(path)
    raise FileNotFoundError(f"no recording {name} in {SHARED / 'eval'}/{{dev,dev-commands,dev-more}}/audio")


def dev_clip(name: str) -> np.ndarray:
    """The recording `name` of ../shared/eval (dev, dev-commands or dev-more), int16 at 16 kHz;
    a copy of what was read once."""
    return _clip(name).copy()


def as_float(audio: np.ndarray) -> np.ndarray:
    """int16 samples as float32 in [-1, 1): what edgeasr.audio.files.load_audio reads from the
    same 16 kHz mono file."""
    return audio.astype(np.float32) / 32768


def dev_reference(name: str) -> str:
    """The reference text of a dev utterance (the dev set's manifest.tsv)."""
    return _references()[name]


@functools.cache
def _references() -> dict[str, str]:
    with (DEV / "manifest.tsv").open(newline="") as f:
        return {r["id"]: r["reference"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}


def stream_rows(stream_id: str) -> list[dict]:
    """The utterances of a long-form dev stream (longform/segments.tsv), in order: their
    samples (start_sample, end_sample) and reference text."""
    with (LONGFORM / "segments.tsv").open(newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [r for r in rows if r["stream_id"] == stream_id]


def sentence_pause_sentence(pause_s: float = 0.15) -> tuple[np.ndarray, int, int]:
    """An 8.3 s utterance, a pause that with its trailing quiet stays shorter than the
    hangover, another utterance (int16); returns the audio and the pause's first and last sample."""
    a = dev_clip("ls_test-other_1998-15444-0004")
    b = dev_clip("ls_test-other_1688-142285-0002")
    pad = np.zeros(SAMPLE_RATE // 2, dtype=np.int16)
    pause = np.zeros(int(pause_s * SAMPLE_RATE), dtype=np.int16)
    x = np.concatenate([pad, a, pause, b, pad])
    return x, len(pad) + len(a), len(pad) + len(a) + len(pause)
