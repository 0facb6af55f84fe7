"""The voices that say a command set (piper, espeak-ng: models/voices.py) and the noise mixed under them."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from edgeasr.errors import AudioError, MissingInputError
from edgeasr.lab.evaluation.command_phrases import LANGUAGES, Language
from edgeasr.models.voices import (
    ESPEAK_RATES,
    PIPER_LENGTH_SCALES,
    PIPER_NOISE_SCALES,
    PIPER_VOICE,
    SAMPLE_RATE,
    Voice,
)

PAD_S = 0.3  # silence before and after the speech
PEAK = 0.95  # a mix louder than this is scaled down to it
NOISE_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "eval" / "dev" / "longform"
NOISY_STREAM, CLEAN_STREAM = "dev_stream_01_noisy20db.wav", "dev_stream_01.wav"


def pick_voice(rng: random.Random, kind: str, lang: Language = LANGUAGES["en"]) -> Voice:
    if kind == "piper":
        return Voice("piper", PIPER_VOICE, rng.choice(PIPER_LENGTH_SCALES), rng.choice(PIPER_NOISE_SCALES))
    return Voice("espeak", rng.choice(lang.espeak_voices), rng.choice(ESPEAK_RATES))


def read_noise(noise_dir: Path) -> np.ndarray:
    """The noise under the dev set's noisy stream: that stream minus its clean one (checked to
    be sample-aligned: the difference is smallest at lag 0)."""
    import soundfile

    paths = [noise_dir / NOISY_STREAM, noise_dir / CLEAN_STREAM]
    for p in paths:
        if not p.is_file():
            raise MissingInputError(f"{p}: the noise is read from the dev set's streams (--noise-dir)")
    (noisy, rate_n), (clean, rate_c) = (soundfile.read(p, dtype="float32") for p in paths)
    if rate_n != SAMPLE_RATE or rate_c != SAMPLE_RATE or len(noisy) != len(clean):
        raise AudioError(f"{paths[0]} and {paths[1]}: not the same length at {SAMPLE_RATE} Hz")
    noise = noisy - clean
    shifted = noisy[1:] - clean[:-1]
    if np.mean(noise**2) * 2 > np.mean(shifted**2):
        raise AudioError(f"{paths[0]} and {paths[1]}: not sample-aligned")
    return noise


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float | None, rng: random.Random) -> np.ndarray:
    """Speech with PAD_S of silence around it, and noise over all of it at `snr_db` below the
    speech's mean power (a stretch of the noise picked at random)."""
    pad = np.zeros(int(PAD_S * SAMPLE_RATE), np.float32)
    out = np.concatenate([pad, speech, pad])
    if snr_db is not None:
        start = rng.randrange(len(noise) - len(out))
        piece = noise[start : start + len(out)]
        gain = np.sqrt(np.mean(speech**2) / (np.mean(piece**2) * 10 ** (snr_db / 10)))
        out = out + gain * piece
    peak = float(np.max(np.abs(out)))
    return out * (PEAK / peak) if peak > PEAK else out
