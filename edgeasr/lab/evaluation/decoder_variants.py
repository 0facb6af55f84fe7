"""Greedy decoding against the beam, the cost of word timestamps, and the two-stage projection
(`edgeasr bench-decoder`).

One process, one engine's sessions: an engine is built on them for greedy decoding, for each
beam size asked for, and for greedy decoding with word timestamps; with `--shortlist`, a second
engine greedy on the two-stage projection (decoder.projection: shortlist), its own sessions. Every utterance is
transcribed by every variant in turn, the order rotating from one utterance to the next, so
that a busy spell of a shared machine slows them alike; ratios are medians of the
per-utterance ratios against greedy. Reported per variant: WER and CER (Whisper's English
normaliser), decoder ms per window and per token (medians over utterances), their ratios to
greedy, how many texts differ from greedy's, and for the words variant the alignment's ms per
window. `--load` runs it all beside one load's neighbours (evaluation/load.py).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from edgeasr.lab.evaluation.runs import read_set, row_config

GREEDY, WORDS, SHORTLIST = "greedy", "greedy+words", "greedy+shortlist"


def _variants(engine, beams: list[int]) -> dict:
    """name -> an engine built from the engine's options with that decoding, on its sessions."""
    out = {GREEDY: engine.variant(replace(engine.options, beam_size=1, words=False)),
           WORDS: engine.variant(replace(engine.options, beam_size=1, words=True))}
    for size in beams:
        out[f"beam{size}"] = engine.variant(replace(engine.options, beam_size=size, words=False))
    return out


def _scores(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    refs, hyps = [norm(r) for r in references], [norm(h) for h in hypotheses]
    return jiwer.wer(refs, hyps), jiwer.cer(refs, hyps)


def run(args) -> dict:
    from edgeasr.asr.transcriber import build_engine
    from edgeasr.audio.files import load_audio
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.lab.evaluation.load import Neighbours, parse_loads
    from edgeasr.models.default import open_bundle

    (load,) = parse_loads(args.load)
    cfg = row_config(args, {"encoder.backend": "onnx"})
    bundle = open_bundle(cfg)
    engine = build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad))
    beams = [int(b) for b in args.beams.split(",") if b]
    variants = _variants(engine, beams)
    if args.shortlist:
        short = row_config(args, {"encoder.backend": "onnx", "decoder.projection": "shortlist"})
        variants[SHORTLIST] = build_engine(bundle, short.model, short.encoder, short.decoder, SpeechJudge(short.vad))
    names = list(variants)
    utterances = read_set(args.set_dir, args.limit)
    rows: dict[str, list[dict]] = {name: [] for name in names}
    with Neighbours([load]) as neighbours:
        neighbours.use(load)
        for k, u in enumerate([utterances[0], *utterances]):  # the first one twice: a warm-up
            audio = load_audio(args.set_dir / u["file"], bundle.audio.sample_rate)
            for name in names[k % len(names):] + names[: k % len(names)]:
                r = variants[name].transcribe(audio)
                if k:
                    rows[name].append({"text": r.text, "windows": r.windows, "steps": r.decoder_steps,
                                       "decoder_ms": r.timings_ms["decoder"],
                                       "words_ms": r.timings_ms.get("words", 0.0)})
    references = [u["reference"] for u in utterances]
    report = {**summarize(rows, references), "load": load}
    if args.shortlist:
        report["shortlist"] = dict(variants[SHORTLIST].sessions.decoder.shortlist.counts.__dict__)
    return report


def summarize(rows: dict[str, list[dict]], references: list[str]) -> dict:
    greedy = [r["decoder_ms"] / r["windows"] for r in rows[GREEDY]]
    greedy_token = [r["decoder_ms"] / max(1, r["steps"]) for r in rows[GREEDY]]
    table = {}
    for name, results in rows.items():
        per_window = [r["decoder_ms"] / r["windows"] for r in results]
        per_token = [r["decoder_ms"] / max(1, r["steps"]) for r in results]
        wer, cer = _scores(references, [r["text"] for r in results])
        table[name] = {
            "wer": round(wer, 4), "cer": round(cer, 4),
            "decoder_ms_per_window": round(statistics.median(per_window), 1),
            "decoder_ratio": round(statistics.median(p / g for p, g in zip(per_window, greedy)), 3),
            "decoder_ms_per_token": round(statistics.median(per_token), 3),
            "token_ratio": round(statistics.median(p / g for p, g in zip(per_token, greedy_token)), 3),
            "texts_unlike_greedy": sum(r["text"] != g["text"] for r, g in zip(results, rows[GREEDY])),
            "words_ms_per_window": round(statistics.median(r["words_ms"] / r["windows"] for r in results), 1),
        }
    return {"utterances": len(references), "rows": table}
