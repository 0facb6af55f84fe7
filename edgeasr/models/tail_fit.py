"""A bundle's tail map, fitted at import (asr/tail.py says what it is and how the decoder reads it).

The fit is a distillation: the teacher is the same model's 30 s encoder on the same audio, so any
speech serves, unlabelled, in any language. The import says prose (`tail_speech.txt`) with the
voices this machine has (models/voices.py), cuts it into windows, and keeps of each window what
the map reads at run time (its encoding by the bundle's own int8 encoder, pooled, and its
silence level) and what it predicts (the mean of each band of the 30 s encoder's positions past
the window). Each band's row is then a ridge regression, its penalty chosen by cross-validation
with each voice on one side only.

For the weights edgeasr knows, the map fitted this way is shipped (`tail_maps/`, by the weights'
sha256 and the window's positions), so that a device imports them with neither voices nor the
minutes of the 30 s encoder's work.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr import __version__
from edgeasr.asr.features import MelSpec, log_mel, silence_level
from edgeasr.asr.tail import FORMAT, TailMap, design, pooled
from edgeasr.errors import ToolMissingError, UsageError
from edgeasr.models import TAIL_MODES
from edgeasr.models.voices import (
    ESPEAK_RATES,
    PIPER_LENGTH_SCALES,
    PIPER_NOISE_SCALES,
    PIPER_VOICE,
    SAMPLE_RATE,
    Speakers,
    Voice,
    installed,
)

log = logging.getLogger(__name__)

TAIL_MAP_FILE = "tail_map.npz"
SHIPPED = Path(__file__).with_name("tail_maps")  # <weights sha256>-<positions>.npz
TEXT = Path(__file__).with_name("tail_speech.txt")

# The map's form, chosen on held-out speech (docs/benchmarks.md): 8 bands beat one for base
# everywhere and 16 gained nothing; 32 components of the pooled encoding beat a constant when
# the fitting speech is synthesised; the last 64 positions (1.3 s) are the window's end
BANDS = 8
RANK = 32
LAST = 64
# R² on held-out speech levels off from about 200 windows: 300 take a few minutes at import
FIT_WINDOWS = 300
PENALTIES = (0.1, 1.0, 10.0, 100.0, 1000.0)
FOLDS = 5
SEED = 0

# the fitting speech: how many words a clip says (a command, a sentence, a paragraph) and how
# often; the voices, then loudness, pauses around the speech and pink noise, as recordings vary
CLIP_WORDS = ((0.35, 2, 10), (0.45, 10, 28), (0.20, 30, 75))
ESPEAK_VOICES = ("en-us", "en", "en-us+f3", "en+m3", "en-us+f2", "en+f4", "en-gb-scotland", "en-us+m7")
PEAK_DB = (-30.0, -1.0)
LEAD_S, TRAIL_S = (0.05, 0.8), (0.1, 1.0)
SNR_DB = (None, None, 40, 30, 20, 10)
MIN_WINDOW_S = 0.1  # a clip's last piece shorter than this is no window


@dataclass(frozen=True)
class Sample:
    """One window of fitting speech, as the fit reads it."""

    pooled: np.ndarray  # [2 d] its encoding pooled (asr.tail.pooled)
    silence: float  # its log-mel value of silence
    bands: np.ndarray  # [K, d] the teacher's positions past the window, the mean of each band
    group: str  # the voice that said it: cross-validation keeps a voice on one side


def band_edges(n_tail: int, k: int) -> np.ndarray:
    """K equal bands over the positions past the window."""
    return np.linspace(0, n_tail, k + 1).round().astype(np.int64)


def _ridge(x: np.ndarray, y: np.ndarray, penalty: float, free: int = 3) -> np.ndarray:
    """Ridge regression of y [N, m] on x [N, q]; the first `free` columns (1, the silence level
    and its square) are not penalised."""
    weights = np.full(x.shape[1], penalty)
    weights[:free] = 1e-6
    x64 = x.astype(np.float64)
    return np.linalg.solve(x64.T @ x64 + np.diag(weights), x64.T @ y)


def fit(samples: list[Sample], n_positions: int, edges: np.ndarray, rank: int = RANK,
        last: int = LAST) -> tuple[TailMap, dict[str, Any]]:
    """The tail map for these samples, and how well it fitted (the penalty taken, the
    cross-validated R² of the band rows)."""
    features = np.stack([s.pooled for s in samples])
    silence = np.array([s.silence for s in samples], np.float32)
    targets = np.stack([s.bands for s in samples])
    n, k, d = targets.shape
    mean = features.mean(0)
    _, singular, directions = np.linalg.svd(features - mean, full_matrices=False)
    r = min(rank, len(singular))
    basis = (directions[:r].T / (singular[:r] / np.sqrt(n))).astype(np.float32)  # unit-variance components
    x = design((features - mean) @ basis, silence)
    y = targets.reshape(n, k * d).astype(np.float64)
    groups = sorted({s.group for s in samples})
    fold = np.array([groups.index(s.group) % FOLDS for s in samples])
    errors = {}
    for penalty in PENALTIES:
        errors[penalty] = sum(float(((x[fold == f] @ _ridge(x[fold != f], y[fold != f], penalty)
                                      - y[fold == f]) ** 2).sum()) for f in range(FOLDS) if (fold == f).any())
    penalty = min(errors, key=lambda p: errors[p])
    coef = _ridge(x, y, penalty).reshape(x.shape[1], k, d).transpose(1, 0, 2).astype(np.float32)
    spread = float(((y - y.mean(0)) ** 2).sum())
    quality = {"windows": n, "voices": len(groups), "penalty": penalty,
               "cv_r2": round(1 - errors[penalty] / spread, 3) if spread else None}
    return TailMap(n_positions, edges, last, mean.astype(np.float32), basis, coef), quality


class Teacher:
    """The bundle's two encoders on a window: its int8 encoding (what the map reads at run time)
    and the 30 s encoder's output past it (what the map predicts), on the window's audio padded
    to 30 s, as Whisper pads it."""

    def __init__(self, encoder_int8: Path, encoder_30s, spec: MelSpec, n_positions: int, bands: int = BANDS) -> None:
        from edgeasr.asr.encoder import ort_session

        self.student = ort_session(encoder_int8, threads=2)
        self.encoder_30s = encoder_30s  # an onnxruntime session: mel [1, 1, 3000, n_mels] -> [1, 1500, d]
        frames_30s = encoder_30s.get_inputs()[0].shape[2]
        self.spec, self.n_positions = spec, n_positions
        self.spec_30s = MelSpec(spec.sample_rate, spec.n_fft, spec.hop_length, spec.n_mels, frames_30s)
        self.edges = band_edges(frames_30s // 2 - n_positions, bands)

    def sample(self, audio: np.ndarray, group: str) -> Sample:
        mel = log_mel(audio, self.spec)
        encoding = self.student.run(None, {self.student.get_inputs()[0].name: mel})[0][0]
        past = self.encoder_30s.run(None, {"mel": log_mel(audio, self.spec_30s)})[0][0, self.n_positions:]
        bands = np.stack([past[a:b].mean(0) for a, b in zip(self.edges[:-1], self.edges[1:])])
        return Sample(pooled(encoding, LAST), silence_level(mel), bands, group)


def _clip_words(rng: random.Random) -> int:
    u = rng.random()
    for share, low, high in CLIP_WORDS:
        if u < share:
            return rng.randint(low, high)
        u -= share
    return rng.randint(*CLIP_WORDS[-1][1:])


def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.maximum(1, np.arange(len(spectrum))) ** 0.5
    x = np.fft.irfft(spectrum, n).astype(np.float32)
    return x / (np.sqrt(np.mean(x**2)) + 1e-9)


def fitting_speech(kinds: tuple[str, ...], window_samples: int, seed: int = SEED) -> Iterator[tuple[np.ndarray, str]]:
    """Windows of synthesised speech and the voice of each, without end: clips of the prose said
    by the voices of `kinds` in turn at random speeds, each at a random loudness with pauses
    around it and pink noise under some, cut into windows."""
    words = " ".join(line for line in TEXT.read_text().splitlines() if not line.startswith("#")).split()
    rng, noise_rng = random.Random(seed), np.random.default_rng(seed)
    speakers = Speakers(piper="piper" in kinds, espeak="espeak" in kinds)
    for clip in itertools.count():
        count = _clip_words(rng)
        start = rng.randrange(len(words) - count)
        if kinds[clip % len(kinds)] == "piper":
            voice = Voice("piper", PIPER_VOICE, rng.choice(PIPER_LENGTH_SCALES), rng.choice(PIPER_NOISE_SCALES))
        else:
            voice = Voice("espeak", rng.choice(ESPEAK_VOICES), rng.choice(ESPEAK_RATES))
        speech = speakers.say(" ".join(words[start : start + count]), voice)
        speech *= 10 ** (rng.uniform(*PEAK_DB) / 20) / (np.max(np.abs(speech)) + 1e-9)
        audio = np.concatenate([np.zeros(int(SAMPLE_RATE * rng.uniform(*LEAD_S)), np.float32), speech,
                                np.zeros(int(SAMPLE_RATE * rng.uniform(*TRAIL_S)), np.float32)])
        snr = rng.choice(SNR_DB)
        if snr is not None:
            audio += _pink(len(audio), noise_rng) * np.sqrt(np.mean(speech**2)) * 10 ** (-snr / 20)
        audio = np.clip(audio, -1, 1).astype(np.float32)
        for at in range(0, len(audio), window_samples):
            if len(audio) - at >= MIN_WINDOW_S * SAMPLE_RATE:
                yield audio[at : at + window_samples], voice.describe()


def fit_on_speech(teacher: Teacher, kinds: tuple[str, ...], windows: int = FIT_WINDOWS,
                  seed: int = SEED) -> tuple[TailMap, dict[str, Any]]:
    """The tail map fitted on `windows` windows of speech said by the voices of `kinds`, and
    how it was fitted (the manifest's `tail_map.fitted`)."""
    samples = []
    for audio, voice in fitting_speech(kinds, teacher.spec.n_frames * teacher.spec.hop_length, seed):
        samples.append(teacher.sample(audio, voice))
        if len(samples) % 50 == 0:
            log.info("tail map: %d of %d windows of speech", len(samples), windows)
        if len(samples) == windows:
            break
    tail, quality = fit(samples, teacher.n_positions, teacher.edges)
    said = ", ".join("piper " + PIPER_VOICE if k == "piper" else "espeak-ng" for k in kinds)
    return tail, {"speech": f"{TEXT.name} said by {said}", "teacher": "the 30 s encoder (fp32)",
                  **quality, "seed": seed, "edgeasr_version": __version__}


def shipped(weights_sha256: str, n_positions: int) -> Path | None:
    """The tail map edgeasr ships for these weights and window, if any."""
    path = SHIPPED / f"{weights_sha256}-{n_positions}.npz"
    return path if weights_sha256 and path.is_file() else None


def fitted_info(path: Path) -> dict[str, Any]:
    """How a tail map file was fitted (saved with it)."""
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["fitted"])) if "fitted" in z else {}


def write_tail_map(out: Path, weights_sha256: str, n_positions: int, mode: str,
                   teacher: Callable[[], Teacher]) -> dict[str, Any] | None:
    """The bundle's tail map (`mode`: one of TAIL_MODES), written to out/TAIL_MAP_FILE; returns
    the manifest's `tail_map` section, or None when the bundle gets none. `teacher` makes the
    bundle's encoders ready, when a map is fitted."""
    if mode not in TAIL_MODES:
        raise UsageError(f"--tail: {mode!r} is not one of {', '.join(TAIL_MODES)}")
    if mode == "none":
        return None
    known = shipped(weights_sha256, n_positions) if mode == "auto" else None
    kinds = installed()
    if known is not None:
        shutil.copyfile(known, out / TAIL_MAP_FILE)
        source = "shipped with edgeasr for these weights"
    elif not kinds:
        if mode == "fit":
            raise ToolMissingError("--tail fit: no voice to say the fitting speech with "
                                   "(apt install espeak-ng, or pip install 'edgeasr[commands]')")
        log.warning("no tail map for these weights: no voice is installed to fit one (espeak-ng, or "
                    "edgeasr[commands]'s piper); windows are padded with the silence row")
        return None
    else:
        log.info("fitting the tail map on %d windows of synthesised speech (a few minutes)", FIT_WINDOWS)
        tail, info = fit_on_speech(teacher(), kinds)
        tail.save(out / TAIL_MAP_FILE, info)
        source = "fitted at import"
    tail = TailMap.load(out / TAIL_MAP_FILE)
    return {"format": FORMAT, "bands": len(tail.edges) - 1, "rank": int(tail.feature_basis.shape[1]),
            "n_positions": tail.n_positions, "n_tail": tail.n_tail, "source": source,
            "fitted": fitted_info(out / TAIL_MAP_FILE)}
