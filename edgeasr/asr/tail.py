"""The tail: what the decoder reads past a window, the positions up to the 1500 it was trained
on (`PaddingRows`): the bundle's tail map for a window whose audio ends inside it, else one
silence row.

Whisper's decoder was trained on 30 s windows, 1500 encoder positions: past the speech it read
the encoder's output for the zero padding, which depends on the speech through the encoder's
self-attention. A 10 s window gives 500 positions. A bundle's tail map (`tail_map.npz`, fitted
at import by models/tail_fit.py, the 30 s encoder on the same audio as its teacher) predicts the
positions past the window from the window's own encoding: K rows, each the mean of one band of
those positions, which the decoder reads with the score bias log(band size), so that each
weighs as its band's rows would (as the one silence row does with log(count)).

The prediction is linear per band, in the window's silence level, its square and a few
numbers pooled from the window's encoding: the mean of all its positions and the mean of its
last `last` positions (silence after short speech, speech for a window full of it), reduced to
their leading principal components. Applying it is two means and two small products in numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import SILENCE_ROLE, TAIL_MAP_ROLE, Bundle
from edgeasr.errors import ModelError

FORMAT = "edgeasr-tailmap/1"
# The longest window whose windows cut in running speech are padded by the map too; longer ones
# keep the silence row there. Measured on base, the pool: on 10 s windows the map cost 1.7
# points of WER over 10 s on such windows; on the Hailo-8's 5 s windows, most of them cut so,
# it took the pool from 11.84 to 11.26 % (only ended windows: 11.78 %).
CUT_WINDOWS_MAX_S = 5.0


def pooled(encoding: np.ndarray, last: int) -> np.ndarray:
    """A window's encoding [positions, d] pooled: the mean of all its positions, then the mean
    of its last `last` positions [2 d]."""
    encoding = np.asarray(encoding, np.float32)
    return np.concatenate([encoding.mean(0), encoding[-last:].mean(0)])


def design(components: np.ndarray, silence: np.ndarray) -> np.ndarray:
    """The regression's inputs [N, 3 + r]: 1, the silence level, its square, the components [N, r]."""
    s = np.asarray(silence, np.float32).reshape(-1, 1)
    return np.concatenate([np.ones_like(s), s, s * s, np.asarray(components, np.float32)], axis=1)


@dataclass(frozen=True)
class TailMap:
    n_positions: int  # the window's encoder positions (500 for 10 s)
    edges: np.ndarray  # [K + 1] the bands over the positions past the window (0 .. n_tail)
    last: int  # the window's last positions pooled as one feature
    feature_mean: np.ndarray  # [2 d] the pooled features' mean over the fitting windows
    feature_basis: np.ndarray  # [2 d, r] their principal directions, scaled to unit variance
    coef: np.ndarray  # [K, 3 + r, d] per band, the row as a linear function of `design`

    @property
    def n_tail(self) -> int:
        """The positions past the window the rows stand for (1000 after a 10 s window)."""
        return int(self.edges[-1])

    @property
    def log_counts(self) -> np.ndarray:
        """Each row's score bias: the log of its band's size."""
        return np.log(np.diff(self.edges)).astype(np.float32)

    def rows(self, encoding: np.ndarray, silence: float) -> np.ndarray:
        """The rows past a window [K, d]: `encoding` its encoder output [n_positions, d],
        `silence` its log-mel value of silence (features.silence_level)."""
        return self.predict(pooled(encoding, self.last)[None], np.array([silence]))[0]

    def predict(self, features: np.ndarray, silence: np.ndarray) -> np.ndarray:
        """The rows [N, K, d] past N windows from their pooled encodings [N, 2 d] (`pooled`)
        and silence levels [N]."""
        x = design((features - self.feature_mean) @ self.feature_basis, silence)
        return np.einsum("nj,kjd->nkd", x, self.coef).astype(np.float32)

    def save(self, path: Path, fitted: dict | None = None) -> None:
        """An .npz, with how it was `fitted` (JSON); the basis and coefficients in float16 (half
        the bytes; the rows within about 1e-3 of float32's)."""
        with open(path, "wb") as f:  # np.savez would add ".npz" to another name
            np.savez(f, format=np.array(FORMAT), n_positions=np.int64(self.n_positions), edges=self.edges,
                     last=np.int64(self.last), feature_mean=self.feature_mean.astype(np.float32),
                     feature_basis=self.feature_basis.astype(np.float16), coef=self.coef.astype(np.float16),
                     fitted=np.array(json.dumps(fitted or {})))

    @classmethod
    def load(cls, path: Path) -> TailMap:
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["format"]) != FORMAT:
                    raise ModelError(f"{path}: format {str(z['format'])!r} is not {FORMAT!r} "
                                     "(re-create the bundle with `edgeasr models import`)")
                m = cls(int(z["n_positions"]), z["edges"].astype(np.int64), int(z["last"]),
                        z["feature_mean"].astype(np.float32), z["feature_basis"].astype(np.float32),
                        z["coef"].astype(np.float32))
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"{path}: not a tail map ({exc})") from exc
        k, r = len(m.edges) - 1, m.feature_basis.shape[1]
        if m.coef.shape[:2] != (k, 3 + r) or m.feature_basis.shape[0] != len(m.feature_mean):
            raise ModelError(f"{path}: a tail map with inconsistent shapes (re-create the bundle)")
        return m


class SilenceRows:
    """Per silence level, the mean encoder output past the window of a 30 s input that
    holds only that level (computed at import by the 30 s encoder). Silence looks different
    in loud and quiet recordings, because Whisper clamps the log-mel 8 decades below each
    window's maximum; the row for the nearest level is used."""

    def __init__(self, bundle: Bundle) -> None:
        path = bundle.path(SILENCE_ROLE)
        self.levels = np.asarray(bundle.silence_levels, np.float32)
        self.rows = np.load(path)
        if self.rows.shape != (len(self.levels), bundle.d_model) or self.rows.dtype != np.float32:
            raise ModelError(f"{path}: not float32 [{len(self.levels)} silence levels, {bundle.d_model}]")

    def row(self, level: float) -> np.ndarray:
        return self.rows[int(np.argmin(np.abs(self.levels - level)))]


@dataclass(frozen=True)
class WindowEnd:
    """How a window's audio ends: what the rows past the window's positions stand for."""

    silence: float  # the window's log-mel value of silence (features.silence_level)
    inside: bool = False  # its audio ends inside it (False: the speech was cut at its end, or not known)


class PaddingRows:
    """The rows that stand for the positions past a window, up to the 1500 the decoder was
    trained on, and their score biases log(count): for a window whose audio ends inside it,
    the bundle's tail map (`TailMap`: K rows predicted from the window's own encoding); for
    one cut in running speech, or a bundle without a tail map, one row, the encoder's output
    for silence at the window's level (`SilenceRows`).

    Measured against the silence row (docs/benchmarks.md): the tail map's rows are much nearer
    the 30 s encoder's (median relative error about 0.1 against 0.6), and the decoder alone
    stops inventing endings (base, greedy: WER 10.2 -> 5.5 %). On 10 s windows cut in running
    speech it cost base 1.7 points of WER over 10 s, so those keep the silence row; on shorter
    windows (CUT_WINDOWS_MAX_S: the Hailo-8's 5 s) the map pads them too."""

    def __init__(self, bundle: Bundle) -> None:
        self.silence = SilenceRows(bundle)
        self.tail: TailMap | None = None
        self.cut_windows_too = bundle.audio.window_s <= CUT_WINDOWS_MAX_S
        if bundle.has(TAIL_MAP_ROLE):
            path = bundle.path(TAIL_MAP_ROLE)
            self.tail = TailMap.load(path)
            if self.tail.n_positions != bundle.audio.n_positions or self.tail.coef.shape[2] != bundle.d_model:
                raise ModelError(f"{path}: a tail map for {self.tail.n_positions} positions of "
                                 f"{self.tail.coef.shape[2]}, the bundle's window has {bundle.audio.n_positions} "
                                 f"of {bundle.d_model} (re-create it with `edgeasr models import`)")

    def rows(self, audio_features: np.ndarray, count: int, end: WindowEnd | None) -> tuple[np.ndarray, np.ndarray]:
        """Rows [n, d] for the `count` positions past the window, and their score biases [n].
        The tail map stands for the whole 30 s window only (`count` its n_tail)."""
        if (end is not None and (end.inside or self.cut_windows_too) and self.tail is not None
                and count == self.tail.n_tail):
            return self.tail.rows(audio_features[0], end.silence), self.tail.log_counts
        row = self.silence.row(end.silence) if end is not None else np.zeros(audio_features.shape[2], np.float32)
        return row[None], np.array([np.log(count)], np.float32)
