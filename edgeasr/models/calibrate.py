"""`edgeasr models calibrate BUNDLE --dataset DIR`: measure the decoding settings that suit
these weights, and store them in the bundle's manifest (`decoding`), where the runtime
reads them (a config key left at null means "the bundle's value").

The presets were tuned on tiny.en, and Whisper base does best with none of them: each
model needs its own. The procedure is a coordinate descent on a coarse grid, made to
resist fitting the noise of a small set (tiny numeric changes move the dev set's WER by
+-0.6 points):

1. Start from the `balanced` preset, gate failures dropped, no prompt.
2. For each key in `GRID` order, decode the whole set with each of its values (the others
   as chosen so far). The best value replaces the current one only if it lowers the whole
   set's WER by at least `MIN_GAIN` and raises no group's (`groups`: utterances within one
   window and longer ones; each corpus with `MIN_GROUP` utterances or more) by more than
   `MAX_GROUP_LOSS`. One pass; no value finer than the grid.

Calibrated values are also kept per weights file (`known.json`, keyed by the sha256 of the
weights), so that `edgeasr models import` applies them to a new bundle at once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import MANIFEST, Bundle

log = logging.getLogger(__name__)

KNOWN = Path(__file__).with_name("known.json")
# key -> the values tried: first the settings of the greedy loop, then the ones around it
GRID: dict[str, tuple] = {
    "repetition_penalty": (1.0, 1.1, 1.2),
    "eos_threshold": (None, 0.5),
    "encoder_padding": (0, 700, 1500),
    "condition_on_previous_text": (False, True),
    "on_gate_fail": ("drop", "retry"),
}
START = {"on_gate_fail": "drop", "condition_on_previous_text": False, "repetition_penalty": 1.1,
         "eos_threshold": 0.5, "encoder_padding": 700}
MIN_GAIN = 0.005  # WER: half a point, about the set's noise
MAX_GROUP_LOSS = 0.01  # WER: a value may not cost any group a point
MIN_GROUP = 10  # utterances: smaller corpora are too few to judge a value on
PROCEDURE = ("coordinate descent over GRID from START, one pass; a value is taken if it lowers the "
             f"whole set's WER by >= {MIN_GAIN:.3f} and no group's by more than {MAX_GROUP_LOSS:.3f}")


@dataclass(frozen=True)
class Utterance:
    id: str
    audio: np.ndarray
    reference: str
    duration_s: float


def groups(utterances: list[Utterance], window_s: float) -> dict[str, list[int]]:
    """Indexes of each group's utterances: within one window, longer, and each corpus (the
    id's prefix before its first "_") with at least MIN_GROUP utterances."""
    out: dict[str, list[int]] = {"one window": [], "longer": []}
    corpora: dict[str, list[int]] = {}
    for i, u in enumerate(utterances):
        out["one window" if u.duration_s <= window_s else "longer"].append(i)
        corpora.setdefault(u.id.split("_", 1)[0], []).append(i)
    out.update({name: ids for name, ids in corpora.items() if len(ids) >= MIN_GROUP})
    return {name: ids for name, ids in out.items() if ids}


class Scorer:
    """WER of hypotheses against the set's references, whole and per group."""

    def __init__(self, utterances: list[Utterance], window_s: float) -> None:
        import jiwer
        from whisper_normalizer.english import EnglishTextNormalizer

        self._wer, self._norm = jiwer.wer, EnglishTextNormalizer()
        self.refs = [self._norm(u.reference) for u in utterances]
        self.groups = groups(utterances, window_s)

    def __call__(self, hyps: list[str]) -> dict[str, float]:
        h = [self._norm(t) for t in hyps]
        scores = {"all": float(self._wer(self.refs, h))}
        for name, ids in self.groups.items():
            scores[name] = float(self._wer([self.refs[i] for i in ids], [h[i] for i in ids]))
        return scores


def better(candidate: dict[str, float], current: dict[str, float]) -> bool:
    """The rule that lets a value replace the current one."""
    if candidate["all"] > current["all"] - MIN_GAIN:
        return False
    return all(candidate[g] <= current[g] + MAX_GROUP_LOSS for g in current if g != "all")


def descend(evaluate: Callable[[dict], dict[str, float]], report: Callable[[dict, dict], None]) -> tuple[dict, dict]:
    """The procedure: `evaluate(values)` scores one set of values; returns the chosen values
    and their scores."""
    values = dict(START)
    scores = evaluate(values)
    report(values, scores)
    for key, options in GRID.items():
        best_value, best_scores = values[key], scores
        for option in options:
            if option == values[key]:
                continue
            trial = {**values, key: option}
            trial_scores = evaluate(trial)
            report(trial, trial_scores)
            if better(trial_scores, best_scores):
                best_value, best_scores = option, trial_scores
        values, scores = {**values, key: best_value}, best_scores
    return values, scores


class CachedEncoder:
    """The encoder with its outputs remembered per window: the grid decodes the same
    windows many times over."""

    def __init__(self, encoder) -> None:
        self.encoder, self.backend = encoder, encoder.backend
        self._cache: dict[bytes, np.ndarray] = {}

    def encode(self, mel: np.ndarray) -> np.ndarray:
        import hashlib

        key = hashlib.sha1(np.ascontiguousarray(mel).tobytes()).digest()
        if key not in self._cache:
            self._cache[key] = self.encoder.encode(mel)
        return self._cache[key]

    def close(self) -> None:
        self.encoder.close()


def read_dataset(set_dir: Path, sample_rate: int) -> list[Utterance]:
    import csv

    from edgeasr.audio.files import load_audio

    with (set_dir / "manifest.tsv").open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Utterance(r["id"], load_audio(set_dir / r["file"], sample_rate), r["reference"],
                      float(r["duration_s"])) for r in rows]


def calibrate(bundle: Bundle, set_dir: Path, threads: int = 2, out=print) -> dict:
    """Run the procedure on `set_dir` with the CPU engine (int8, the daemon's default) and
    return the manifest's `decoding` section."""
    from edgeasr.asr.decoding import DecoderSession, preset_options
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.engine import single_threaded_blas
    from edgeasr.asr.gates import default_gates
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.audio.segmenter import PauseFinder
    from edgeasr.config import VadOptions

    single_threaded_blas()
    utterances = read_dataset(set_dir, bundle.audio.sample_rate)
    scorer = Scorer(utterances, bundle.audio.window_s)
    encoder = CachedEncoder(OnnxEncoder(bundle, "int8", threads))
    decoder = DecoderSession(bundle, "int8", threads)

    def evaluate(values: dict) -> dict[str, float]:
        options = preset_options(None, values)  # as the runtime reads a manifest's values
        engine = Transcriber(bundle, encoder, decoder, options, default_gates(), values["on_gate_fail"],
                             pauses=PauseFinder(VadOptions()))
        return scorer([engine.transcribe(u.audio).text for u in utterances])

    def report(values: dict, scores: dict) -> None:
        cells = "  ".join(f"{g} {s:.2%}" for g, s in scores.items())
        out(f"{json.dumps(values)}: {cells}")

    values, scores = descend(evaluate, report)
    return {"values": values, "wer": {g: round(s, 4) for g, s in scores.items()},
            "dataset": str(set_dir), "utterances": len(utterances), "procedure": PROCEDURE,
            "date": dt.date.today().isoformat()}


def write_decoding(root: Path, decoding: dict) -> dict:
    """Store a `decoding` section in the bundle's manifest; returns the manifest."""
    path = Path(root) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["decoding"] = decoding
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def known_decoding(weights_sha256: str) -> dict | None:
    """The calibration recorded for these weights (edgeasr/models/known.json), if any."""
    return json.loads(KNOWN.read_text()).get(weights_sha256)


def apply_known(root: Path, manifest: dict) -> dict:
    """Give a freshly imported bundle the calibration recorded for its weights."""
    decoding = known_decoding(manifest.get("source", {}).get("sha256", ""))
    return write_decoding(root, decoding) if decoding is not None else manifest
