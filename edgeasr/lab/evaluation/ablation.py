"""`edgeasr models ablate --dataset DIR ...`: what each rule that can remove text removes.

Every guard against made-up text can also remove words that were said. Each rule is turned
off in turn (or, where the bundle's decoding has it off, on at the value its preset uses) and
the pool decoded both ways. Both texts of each utterance are aligned to its reference: the
real words (hits), made-up words (insertions) and misheard ones (substitutions) the text
without the rule has more of are what the rule removed. A rule that removes more real words
than made-up ones costs more than it saves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeasr.lab.evaluation.scoring import Scorer, Utterance

if TYPE_CHECKING:
    from edgeasr.asr.engine import EngineOptions
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.config import Config

# What a removed word was, in the text without the rule against the reference.
HIT, INSERTED, MISHEARD = "real", "made up", "misheard"


@dataclass(frozen=True)
class Rule:
    name: str
    what: str
    off: Callable[[EngineOptions], EngineOptions]  # the engine's options without the rule
    # where the engine's options have the rule off: the options with it on (at a preset's value)
    on: Callable[[EngineOptions], EngineOptions] | None = None


def _without_gate(name: str) -> Callable[[EngineOptions], EngineOptions]:
    return lambda o: replace(o, gates=tuple(g for g in o.gates if g.name != name))


def _without_guard(field: str) -> Callable[[EngineOptions], EngineOptions]:
    return lambda o: replace(o, guards=replace(o.guards, **{field: False}))


def _option(field: str, value: Any) -> Callable[[EngineOptions], EngineOptions]:  # Any: the field is named at run time
    return lambda o: replace(o, decoding=replace(o.decoding, **{field: value}))


def _is_on(rule: Rule, options: EngineOptions) -> bool:
    return rule.off(options) != options


RULES = (
    Rule("no_speech gate", "a window the model calls silence, unsure of its text, is dropped",
         _without_gate("no_speech")),
    Rule("avg_logprob gate", "an unsure window is decoded again at higher temperatures",
         _without_gate("avg_logprob")),
    Rule("compression_ratio gate", "a repetitive window is decoded again at higher temperatures",
         _without_gate("compression_ratio")),
    Rule("repeats", "a window's text is cut where it starts repeating itself", _without_guard("repeats")),
    Rule("silent segments", "a segment with no speech under it, that a gate doubts, is dropped",
         _without_guard("silent_segments")),
    Rule("stock phrases", '"Thank you." and the like over little speech are dropped',
         _without_guard("stock_phrases")),
    Rule("short tails", "the last second after kept text, that the model calls silence, is dropped",
         _without_guard("short_tails")),
    Rule("unspoken words", "closing words the alignment finds no audio for are dropped",
         lambda o: replace(o, judge_words=False)),
    Rule("EOS boost", "a window ends once end-of-text is this likely (0.3: the conservative preset)",
         _option("eos_threshold", None), _option("eos_threshold", 0.3)),
    Rule("padding rows", "the window is padded with silence rows (1500 positions: as trained)",
         _option("encoder_padding", 0), _option("encoder_padding", 1500)),
    Rule("repetition penalty", "recent tokens are made less likely (1.1: the balanced preset)",
         _option("repetition_penalty", 1.0), _option("repetition_penalty", 1.1)),
)


@dataclass
class Removed:
    """Words a rule removed and added over the pool, by what they were."""

    removed: dict[str, int]
    added: dict[str, int]
    wer_with: float
    wer_without: float
    changed: int  # utterances whose text the rule changed
    default: bool  # the rule is on in the bundle's decoding (else measured at its preset's value)


def counts(reference: str, hypothesis: str) -> dict[str, int]:
    """The (normalized) hypothesis's words against the reference: real (hits), made up
    (insertions), misheard (substitutions)."""
    import jiwer

    words = hypothesis.split()
    if not reference.split():
        return {HIT: 0, INSERTED: len(words), MISHEARD: 0}
    if not words:
        return {HIT: 0, INSERTED: 0, MISHEARD: 0}
    out = jiwer.process_words(reference, hypothesis)
    return {HIT: out.hits, INSERTED: out.insertions, MISHEARD: out.substitutions}


def compare(refs: Sequence[str], with_rule: Sequence[str], without: Sequence[str]) -> tuple[dict, dict, int]:
    """Per utterance, the words of each kind the text without the rule has and the text with it
    lacks (removed), and the reverse (added), summed over the pool; and the utterances changed.
    Both texts are aligned to the reference, so a word decoded differently elsewhere in the
    utterance is not counted as removed."""
    removed = {HIT: 0, INSERTED: 0, MISHEARD: 0}
    added = {HIT: 0, INSERTED: 0, MISHEARD: 0}
    changed = 0
    for ref, a, b in zip(refs, with_rule, without):
        if a == b:
            continue
        changed += 1
        on, off = counts(ref, a), counts(ref, b)
        for kind in removed:
            removed[kind] += max(0, off[kind] - on[kind])
            added[kind] += max(0, on[kind] - off[kind])
    return removed, added, changed


def ablate(engine: Transcriber, pool: Sequence[Utterance], scorer: Scorer, rules: Sequence[Rule] = RULES,
           out=print) -> dict[str, Removed]:
    """Each rule's count on the pool, the engine otherwise as built: each text is decoded by an
    engine built from the options with or without the rule, on the engine's sessions."""
    built = engine.options
    results: dict[str, Removed] = {}
    for rule in rules:
        with_rule = built if _is_on(rule, built) or rule.on is None else rule.on(built)
        texts = {}
        for name, options in (("with", with_rule), ("without", rule.off(with_rule))):
            variant = engine.variant(options)
            texts[name] = [scorer.normalize(variant.transcribe(u.audio).text) for u in pool]
        removed, added, changed = compare(scorer.refs, texts["with"], texts["without"])
        results[rule.name] = Removed(removed, added, scorer.score(texts["with"]).wer,
                                     scorer.score(texts["without"]).wer, changed, with_rule is built)
        out(f"{rule.name}: {json.dumps(asdict(results[rule.name]))}")
    return results


def markdown(results: dict[str, Removed]) -> str:
    lines = ["| rule | on by default | what it does | real words removed | made-up words removed "
             "| misheard removed | real / made-up added | utterances changed | WER with / without |",
             "|---|---|---|---|---|---|---|---|---|"]
    what = {r.name: r.what for r in RULES}
    for name, r in results.items():
        lines.append(f"| {name} | {'yes' if r.default else 'no'} | {what.get(name, '')} | {r.removed[HIT]} | {r.removed[INSERTED]} | "
                     f"{r.removed[MISHEARD]} | {r.added[HIT]} / {r.added[INSERTED]} | {r.changed} | "
                     f"{r.wer_with:.2%} / {r.wer_without:.2%} |")
    return "\n".join(lines)


def run(cfg: Config, sets: Sequence[Path], out=print) -> str:
    """The table for the configured bundle as the daemon builds its engine (the CPU encoder)."""
    from edgeasr.asr.engine import EngineSessions, engine_options, load_sessions
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.lab.evaluation.calibration import CachedEncoder
    from edgeasr.lab.evaluation.scoring import read_pool
    from edgeasr.models.default import open_bundle

    bundle = open_bundle(cfg)
    language = cfg.model.language
    loaded = load_sessions(bundle, cfg.encoder, cfg.decoder)
    # every rule decodes the same windows: their encoder outputs are kept
    sessions = EngineSessions(bundle, CachedEncoder(loaded.encoder), loaded.decoder, loaded.precision, loaded.threads)
    engine = Transcriber(sessions, engine_options(cfg.model, cfg.decoder, bundle), SpeechJudge(cfg.vad))
    pool = read_pool(sets, bundle.audio.sample_rate)
    scorer = Scorer(pool, bundle.audio.window_s, language=language or "en")
    return markdown(ablate(engine, pool, scorer, out=out))
