"""Whisper's log-mel spectrogram in numpy: one window at once, or while the audio arrives.

The same numbers as openai/whisper `log_mel_spectrogram` and Hugging Face
`WhisperFeatureExtractor`: centred STFT (reflect padding, periodic Hann window), power
spectrum, Slaney mel filterbank, log10 floored at 1e-10, dynamic range clamped to 8
decades below the window's maximum, then (x + 4) / 4. Audio shorter than the window is
zero-padded *before* the STFT, so padding frames hold the log-mel of silence as in
openai/HF (faster-whisper pads the log-mel with 0, which changes transcripts).

Every size comes from a `MelSpec` filled from the model bundle's manifest. Output is NHWC
float32 [1, 1, n_frames, n_mels], the layout the Hailo encoder takes; the ONNX encoder takes
the same graph and layout.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgeasr.errors import ModelError

# Whisper's definition of its input, not model sizes (those are in MelSpec).
LOG_FLOOR = 1e-10  # power floor before log10
DYNAMIC_RANGE = 8.0  # decades kept below the window's maximum
NORM_OFFSET = 4.0  # (log10 + NORM_OFFSET) / NORM_SCALE maps speech to about [-1, 1]
NORM_SCALE = 4.0

# Slaney's mel scale (Auditory Toolbox; librosa's default): linear below 1 kHz, log above.
_SLANEY_HZ_PER_MEL = 200.0 / 3.0
_SLANEY_LOG_HZ = 1000.0
_SLANEY_LOG_MEL = _SLANEY_LOG_HZ / _SLANEY_HZ_PER_MEL
_SLANEY_LOG_STEP = np.log(6.4) / 27.0

_MAX_CACHED_SPECS = 8  # filterbanks and windows kept; a process loads one or two models


@dataclass(frozen=True)
class MelSpec:
    """The front end's sizes, as the model bundle's manifest states them."""

    sample_rate: int  # Hz of the audio fed in
    n_fft: int  # STFT size and Hann window length, samples (even)
    hop_length: int  # samples between frame centres
    n_mels: int  # mel bands: the encoder's input channels
    n_frames: int  # frames in one encoder window

    def __post_init__(self) -> None:
        for name in ("sample_rate", "n_fft", "hop_length", "n_mels", "n_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ModelError(f"mel settings: {name} must be a positive integer, got {value!r}")
        if self.n_fft % 2:
            # An odd size would give Whisper one frame fewer than n_frames per window.
            raise ModelError(f"mel settings: n_fft must be even, got {self.n_fft}")
        if self.pad >= self.n_samples:
            raise ModelError(
                f"mel settings: a window of {self.n_samples} samples is too short "
                f"for n_fft {self.n_fft}"
            )

    @property
    def n_samples(self) -> int:
        """Audio samples in one window."""
        return self.n_frames * self.hop_length

    @property
    def window_s(self) -> float:
        return self.n_samples / self.sample_rate

    @property
    def pad(self) -> int:
        """Reflect padding on each side of the window (the STFT is centred)."""
        return self.n_fft // 2


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    octaves = np.log(np.maximum(hz, _SLANEY_LOG_HZ) / _SLANEY_LOG_HZ)
    log_part = _SLANEY_LOG_MEL + octaves / _SLANEY_LOG_STEP
    return np.where(hz >= _SLANEY_LOG_HZ, log_part, hz / _SLANEY_HZ_PER_MEL)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    above = np.maximum(mel, _SLANEY_LOG_MEL) - _SLANEY_LOG_MEL
    log_part = _SLANEY_LOG_HZ * np.exp(_SLANEY_LOG_STEP * above)
    return np.where(mel >= _SLANEY_LOG_MEL, log_part, mel * _SLANEY_HZ_PER_MEL)


@functools.lru_cache(maxsize=_MAX_CACHED_SPECS)
def mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Slaney mel filterbank, float32 [n_fft // 2 + 1, n_mels], read-only.

    Triangles evenly spaced on the Slaney mel scale from 0 Hz to Nyquist, each scaled
    to unit area ("slaney" norm): librosa.filters.mel's defaults, which made Whisper's
    mel_filters.npz.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)[:, None]
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (fft_hz - lower) / (centre - lower)
    falling = (upper - fft_hz) / (upper - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (upper - lower))
    weights = weights.astype(np.float32)
    weights.setflags(write=False)
    return weights


@functools.lru_cache(maxsize=_MAX_CACHED_SPECS)
def _hann(n_fft: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default), float32, read-only."""
    window = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    window.setflags(write=False)
    return window


def _log_power(frames: np.ndarray, spec: MelSpec) -> np.ndarray:
    """log10 mel power [T, n_mels] of audio frames [T, n_fft] (before clamp and scaling)."""
    spectrum = np.fft.rfft(frames * _hann(spec.n_fft), axis=-1)
    power = spectrum.real**2 + spectrum.imag**2
    mel = power @ mel_filters(spec.sample_rate, spec.n_fft, spec.n_mels)
    return np.log10(np.maximum(mel, np.float32(LOG_FLOOR)))


def _frame_view(padded: np.ndarray, spec: MelSpec) -> np.ndarray:
    """Frames [.., n_fft] of centre-padded audio, one per hop (a view, no copy)."""
    return sliding_window_view(padded, spec.n_fft)[:: spec.hop_length]


def normalised(log10_power: Any) -> Any:
    """A log10 power as the encoder sees it (before the clamp)."""
    return (log10_power + NORM_OFFSET) / NORM_SCALE


SILENCE = float(normalised(np.log10(LOG_FLOOR)))  # zero audio, unclamped: the lowest value there is


def _normalise(log_power: np.ndarray) -> np.ndarray:
    """Whisper's dynamic-range clamp over the whole window, then (x + 4) / 4, as NHWC."""
    clamped = np.maximum(log_power, log_power.max() - np.float32(DYNAMIC_RANGE))
    scaled = normalised(clamped)
    return scaled[None, None].astype(np.float32, copy=False)


def _as_samples(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"expected mono audio as a 1-D array, got shape {audio.shape}")
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"expected float samples in [-1, 1], got {audio.dtype}")
    return audio.astype(np.float32, copy=False)


def _zero_padded(audio: np.ndarray, spec: MelSpec) -> np.ndarray:
    """The window's audio, zero-padded to spec.n_samples."""
    if len(audio) > spec.n_samples:
        raise ValueError(
            f"{len(audio)} samples do not fit a {spec.window_s:g} s window "
            f"({spec.n_samples} samples)"
        )
    window = np.zeros(spec.n_samples, dtype=np.float32)
    window[: len(audio)] = audio
    return window


def log_mel(audio: np.ndarray, spec: MelSpec) -> np.ndarray:
    """Log-mel of one window, NHWC float32 [1, 1, n_frames, n_mels].

    audio: float mono at spec.sample_rate, at most one window long (zero-padded to it).
    """
    samples = _as_samples(audio)
    padded = np.pad(_zero_padded(samples, spec), spec.pad, mode="reflect")
    frames = _frame_view(padded, spec)[: spec.n_frames]  # the STFT's last frame is dropped
    # silent frames are one constant: not transformed (a 5 s utterance in a 10 s window
    # halves the work)
    silent = _silent(np.arange(spec.n_frames) * spec.hop_length, len(samples), spec)
    log_power = np.empty((spec.n_frames, spec.n_mels), dtype=np.float32)
    log_power[~silent] = _log_power(frames[~silent], spec)
    log_power[silent] = _silent_frame(spec)
    return _normalise(log_power)


def _silent(left: np.ndarray, m: int, spec: MelSpec) -> np.ndarray:
    """Which frames, by first sample in the padded window, read only zero padding when the
    window holds m samples of audio."""
    # The end's reflect padding mirrors samples from n_samples - 1 - pad on.
    end_pad_silent = m <= spec.n_samples - 1 - spec.pad
    clear_of_end_pad = left + spec.n_fft <= spec.pad + spec.n_samples
    return (left >= spec.pad + m) & (end_pad_silent | clear_of_end_pad)


@functools.lru_cache(maxsize=_MAX_CACHED_SPECS)
def _silent_frame(spec: MelSpec) -> np.ndarray:
    """log10 mel power of a frame of zeros."""
    return _log_power(np.zeros((1, spec.n_fft), dtype=np.float32), spec)[0]


def silence_level(mel: np.ndarray) -> float:
    """The value silence has in this window after the clamp: what zero audio appended to
    it would look like. Whisper's 30 s windows end in such padding."""
    return max(SILENCE, float(np.max(mel)) - DYNAMIC_RANGE / NORM_SCALE)


class MelStream:
    """Log-mel frames computed while the audio arrives, so a window costs little at its end.

    push() computes the log-power of every frame whose STFT window lies within the audio
    received (past the window start's reflect padding). window()/finish() then compute only
    the frames at the edges: a few where the audio ends, the start's and end's reflect-padded
    frames, and none for silence (a constant). The result equals log_mel() on the same audio.

    Positions are stream samples counted from the first push after creation or finish().
    At most `_CAPACITY_WINDOWS` windows of audio past the current window start are held.
    """

    # A cut window plus the audio that goes on arriving while it is transcribed.
    _CAPACITY_WINDOWS = 2

    def __init__(self, spec: MelSpec) -> None:
        self.spec = spec
        self._capacity = self._CAPACITY_WINDOWS * spec.n_samples
        self._audio = np.zeros(self._capacity, dtype=np.float32)
        max_frames = self._capacity // spec.hop_length + 1
        self._log_power = np.zeros((max_frames, spec.n_mels), dtype=np.float32)
        # Frames before `_lead` read the window start's reflect padding: never stored.
        self._lead = -(-spec.pad // spec.hop_length)
        # Frames whose STFT window ends inside the window (the rest read its end padding).
        self._inner = (spec.n_samples - spec.pad) // spec.hop_length + 1
        self._silence = _silent_frame(spec)
        self.reset()

    def reset(self) -> None:
        """Forget all audio; the next push is stream sample 0."""
        self._start = 0  # stream position of self._audio[0]: the current window start
        self._n = 0  # samples held from the window start on
        self._done = self._lead  # frames [_lead, _done) are stored

    @property
    def start(self) -> int:
        """Stream position where the current window starts."""
        return self._start

    @property
    def end(self) -> int:
        """Stream position after the last sample pushed."""
        return self._start + self._n

    @property
    def pending_frames(self) -> int:
        """Frames that window() at `start` would still have to transform."""
        return len(self._todo(min(self._n, self.spec.n_samples)))

    def push(self, samples: np.ndarray) -> None:
        """Append audio (float mono at spec.sample_rate) and compute the frames it completes."""
        samples = _as_samples(samples)
        if self._n + len(samples) > self._capacity:
            raise ValueError(
                f"MelStream holds at most {self._capacity} samples past the window start "
                f"(at {self._start}); move it on with window(start_sample) or finish()"
            )
        self._audio[self._n : self._n + len(samples)] = samples
        self._n += len(samples)
        self._catch_up()

    def window(self, start_sample: int = 0) -> np.ndarray:
        """Log-mel [1, 1, n_frames, n_mels] of the window starting at stream position
        start_sample and holding what was pushed from there (at most one window of it).

        Equals log_mel(audio[start_sample:start_sample + n_samples]). Audio before
        start_sample is released, so later windows cannot start earlier.
        """
        if not self._start <= start_sample <= self.end:
            raise ValueError(
                f"window start {start_sample} is outside the audio held [{self._start}, {self.end}]"
            )
        self._advance(start_sample - self._start)
        spec = self.spec
        m = min(self._n, spec.n_samples)
        out = np.empty((spec.n_frames, spec.n_mels), dtype=np.float32)
        stored = slice(self._lead, self._stored_end())
        out[stored] = self._log_power[stored]
        todo = self._todo(m)
        out[stored.stop :] = self._silence
        out[: self._lead] = self._silence
        if len(todo):
            padded = np.pad(_zero_padded(self._audio[:m], spec), spec.pad, mode="reflect")
            out[todo] = _log_power(_frame_view(padded, spec)[todo], spec)
        return _normalise(out)

    def finish(self) -> np.ndarray:
        """The current window's log-mel; the stream then starts afresh at position 0."""
        if self._n > self.spec.n_samples:
            raise ValueError(
                f"{self._n} samples past the window start do not fit one window; "
                "take a window(start_sample) first"
            )
        mel = self.window(self._start)
        self.reset()
        return mel

    def _catch_up(self) -> None:
        """Compute the stored frames now complete: frame k needs samples up to k*hop + pad."""
        spec = self.spec
        ready = (self._n - spec.pad) // spec.hop_length + 1 if self._n >= spec.pad else 0
        if ready <= self._done:
            return
        first = self._done * spec.hop_length - spec.pad
        audio = self._audio[first : (ready - 1) * spec.hop_length + spec.pad]
        self._log_power[self._done : ready] = _log_power(_frame_view(audio, spec), spec)
        self._done = ready

    def _advance(self, shift: int) -> None:
        """Move the window start `shift` samples on, keeping the frames still on its hop grid."""
        if shift == 0:
            return
        hop = self.spec.hop_length
        self._audio[: self._n - shift] = self._audio[shift : self._n]
        self._n -= shift
        self._start += shift
        kept_end = self._done - shift // hop
        if shift % hop == 0 and kept_end > self._lead:
            # The frames that now read the new start's reflect padding are dropped.
            moved = self._log_power[self._lead + shift // hop : self._done]
            self._log_power[self._lead : kept_end] = moved
            self._done = kept_end
        else:
            self._done = self._lead
        self._catch_up()

    def _stored_end(self) -> int:
        """End of the stored frames that a window at `start` can take as they are."""
        return max(self._lead, min(self._done, self._inner, self.spec.n_frames))

    def _todo(self, m: int) -> np.ndarray:
        """Indices of the frames a window holding m samples must transform here: the
        start's reflect-padded frames, the frames after the stored ones, minus silence."""
        spec = self.spec
        if m == 0:
            return np.empty(0, dtype=np.intp)
        tail = np.arange(self._stored_end(), spec.n_frames)
        silent = _silent(tail * spec.hop_length, m, spec)
        return np.concatenate([np.arange(min(self._lead, spec.n_frames)), tail[~silent]])
