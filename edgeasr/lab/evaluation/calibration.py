"""`edgeasr models calibrate BUNDLE --dataset DIR [--dataset DIR ...]`: measure the decoding
settings that suit these weights, and store them in the bundle's manifest (`decoding`), where
the runtime reads them (a config key left at null means "the bundle's value").

The procedure resists fitting the voices it is run on: values fitted to a small pool need not
carry to new speakers. The sets are read as one pool, cut into folds by speaker
(`scoring.folds`):

1. Start from plain decoding (`DecodingOptions`' defaults: Whisper as it was trained).
2. For each key in `GRID` order, decode the pool with each of its values (the others as
   chosen so far). A value replaces the current one only if it lowers the pool's WER by at
   least `MIN_GAIN` *and* lowers it on most folds (`better`). One pass; no value finer than
   the grid. A key that changes only the windows after the first (`LONG_ONLY`), nearly all
   of them in speech longer than a window, is judged on that speech: on the whole pool its
   gain would be diluted by the short utterances it cannot touch.
3. Cross-validation of the procedure itself: for each fold, steps 1-2 on the other folds
   alone, then the values they choose are scored on the fold left out. The report's table
   says whether calibrating helps on voices it has not heard.
4. The same with each source held out (LibriSpeech, VCTK, FLEURS...: `scoring.source_of`):
   steps 1-2 on the other sources' utterances, scored on the one left out. A value that wins
   on one corpus's reading and recording alone and loses on another is a fit, not a gain.

Calibrated values are also kept per weights file (models/known_decoding.py), so that
`edgeasr models import` applies them to a new bundle at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from edgeasr.bundle import Bundle
from edgeasr.lab.evaluation.scoring import Score, Scorer, Utterance

log = logging.getLogger(__name__)

# key -> the values tried: plain decoding's first, then the ones the presets use
GRID: dict[str, tuple] = {
    "encoder_padding": (1500, 700, 0),
    "repetition_penalty": (1.0, 1.1, 1.2),
    "eos_threshold": (None, 0.3),
    "condition_on_previous_text": (False, True),
}
START: dict = {key: values[0] for key, values in GRID.items()}
# keys that change only the windows after the first (a short utterance has one but when its
# decoder stops early and the rest is decoded again)
LONG_ONLY = ("condition_on_previous_text",)
MIN_GAIN = 0.005  # WER: half a point, about what tiny numeric changes move it by
PROCEDURE = ("coordinate descent over GRID from plain decoding, one pass; a value is taken if it lowers "
             f"the pool's WER by >= {MIN_GAIN:.3f} and lowers it on most speaker folds ({', '.join(LONG_ONLY)}: "
             "the WER of the speech longer than a window); then each fold and each source held out")

Hyps = list[str]


def better(candidate: Hyps, current: Hyps, scorer: Scorer, folds: Sequence[int], without: str | None = None,
           long_only: bool = False) -> bool:
    """The rule that lets a value replace the current one, judged on `folds` only (`without`:
    less the utterances of that source; `long_only`: on the speech longer than a window)."""
    parts = [[i for i in scorer.fold_indexes(f, without) if not long_only or i in scorer.long] for f in folds]
    ix = [i for part in parts for i in part]
    if not ix or scorer.score(candidate, ix).wer > scorer.score(current, ix).wer - MIN_GAIN:
        return False
    # a fold with none of the speech judged is no win
    wins = sum(bool(part) and scorer.score(candidate, part).wer < scorer.score(current, part).wer for part in parts)
    return wins > len(folds) / 2


def descend(decode: Callable[[dict], Hyps], scorer: Scorer, folds: Sequence[int],
            report: Callable[[dict, Hyps], None] = lambda values, hyps: None, without: str | None = None) -> dict:
    """Steps 1-2 on `folds` (`without`: less that source's utterances): the values chosen.
    `decode(values)` gives the pool's texts."""
    values = dict(START)
    current = decode(values)
    report(values, current)
    for key, options in GRID.items():
        best_value, best = values[key], current
        for option in options:
            if option == values[key]:
                continue
            trial = decode({**values, key: option})
            report({**values, key: option}, trial)
            if better(trial, best, scorer, folds, without, key in LONG_ONLY):
                best_value, best = option, trial
        values, current = {**values, key: best_value}, best
    return values


class CachedEncoder:
    """The encoder with its outputs remembered per window: the grid decodes the same
    windows many times over."""

    def __init__(self, encoder) -> None:
        self.encoder, self.backend = encoder, encoder.backend
        self._cache: dict[bytes, np.ndarray] = {}

    def encode(self, mel: np.ndarray) -> np.ndarray:
        key = hashlib.sha1(np.ascontiguousarray(mel).tobytes()).digest()
        if key not in self._cache:
            self._cache[key] = self.encoder.encode(mel)
        return self._cache[key]

    def close(self) -> None:
        self.encoder.close()


def calibrate(bundle: Bundle, pool: list[Utterance], threads: int, sets: Sequence[Path] = (),
              language: str | None = None, out=print) -> dict:
    """Run the procedure on the pool with the CPU engine (int8, the daemon's default) and
    return the manifest's `decoding` section (values, scores, the cross-validation table)."""
    from edgeasr.asr.decoding import DecoderSession, preset_options
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.engine import EngineOptions, EngineSessions, gates, single_threaded_blas
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.config import DecoderConfig, VadOptions

    single_threaded_blas()
    scorer = Scorer(pool, bundle.audio.window_s, language=language or "en")
    sessions = EngineSessions(bundle, CachedEncoder(OnnxEncoder(bundle, "int8", threads)),
                              DecoderSession(bundle, "int8", threads), "int8", threads)
    decoded: dict[str, Hyps] = {}

    def decode(values: dict) -> Hyps:
        key = json.dumps(values, sort_keys=True)
        if key not in decoded:
            options = preset_options(None, values, language=language)  # as the runtime reads a manifest
            config = DecoderConfig()
            engine = Transcriber(sessions, EngineOptions(options, gates(config), config.on_gate_fail),
                                 SpeechJudge(VadOptions()))
            decoded[key] = [engine.transcribe(u.audio).text for u in pool]
        return decoded[key]

    def report(values: dict, hyps: Hyps) -> None:
        folds = "  ".join(f"{s.wer:.2%}" for s in scorer.per_fold(hyps))
        out(f"{json.dumps(values)}: pool {scorer.score(hyps).row()}; folds {folds}")

    every = list(range(scorer.k))
    values = descend(decode, scorer, every, report)
    held_out = []
    for fold in every:
        chosen = descend(decode, scorer, [f for f in every if f != fold])
        ix = scorer.fold_indexes(fold)
        before, after = scorer.score(decode(START), ix), scorer.score(decode(chosen), ix)
        held_out.append({"fold": fold, "values": chosen, "wer_start": round(before.wer, 4),
                         "wer_chosen": round(after.wer, 4)})
        out(f"fold {fold} held out: {json.dumps(chosen)}: WER {before.wer:.2%} -> {after.wer:.2%}")
    held_out_sources = []
    for source in scorer.sources:
        chosen = descend(decode, scorer, every, without=source)
        ix = scorer.source_indexes(source)
        before, after = scorer.score(decode(START), ix), scorer.score(decode(chosen), ix)
        held_out_sources.append({"source": source, "values": chosen, "wer_start": round(before.wer, 4),
                                 "wer_chosen": round(after.wer, 4)})
        out(f"source {source} held out: {json.dumps(chosen)}: WER {before.wer:.2%} -> {after.wer:.2%}")
    hyps = decode(values)
    return {"values": values, "pool": _cells(scorer.score(hyps)),
            "groups": {name: _cells(s) for name, s in scorer.per_group(hyps).items()},
            "folds": [round(s.wer, 4) for s in scorer.per_fold(hyps)], "cross_validation": held_out,
            "sources_held_out": held_out_sources,
            "datasets": [str(s) for s in sets], "utterances": len(pool), "procedure": PROCEDURE,
            "date": dt.date.today().isoformat()}


def _cells(score: Score) -> dict:
    cells = asdict(score)
    cells["wer"], cells["cer"] = round(score.wer, 4), round(score.cer, 4)
    return cells

