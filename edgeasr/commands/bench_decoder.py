"""`edgeasr bench-decoder --dataset DIR`: greedy against the beam, and the cost of word timestamps.

One process, one engine: its decoder is switched between greedy decoding and beams of the
sizes asked for (`Transcriber.decode`), and its word aligner on and off. Every utterance is
transcribed by every variant in turn, the order rotating from one utterance to the next, so
that a busy spell of a shared machine slows them alike; ratios are medians of the
per-utterance ratios against greedy. Reported per variant: WER and CER (Whisper's English
normaliser), decoder ms per window (median over utterances), its ratio to greedy, and for
the words variant the alignment's ms per window.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from edgeasr.config import DecoderConfig

GREEDY, WORDS = "greedy", "greedy+words"


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-decoder", help="greedy vs beam sizes, and word timestamps' cost, interleaved")
    p.add_argument("--dataset", dest="set_dir", type=Path, required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, duration_s, reference)")
    p.add_argument("--model", type=Path, default=None, help="bundle (imported --with beam for beams)")
    p.add_argument("--beams", default="2,3,5", help="comma-separated beam sizes (empty: none)")
    p.add_argument("--threads", type=int, default=DecoderConfig().threads)
    p.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.set_defaults(func=main)


def _variants(engine, bundle, beams: list[int], threads: int) -> dict:
    """name -> (decode hook, aligner) on the one engine."""
    from edgeasr.asr.beam import BeamDecoder
    from edgeasr.asr.decoding import decode_window
    from edgeasr.asr.words import WordAligner

    aligner = WordAligner(bundle, engine.decoder, "int8", threads)
    out = {GREEDY: (decode_window, None), WORDS: (decode_window, aligner)}
    for size in beams:
        out[f"beam{size}"] = (BeamDecoder(bundle, engine.decoder, size, "int8", threads), None)
    return out


def _scores(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    refs, hyps = [norm(r) for r in references], [norm(h) for h in hypotheses]
    return jiwer.wer(refs, hyps), jiwer.cer(refs, hyps)


def run(args) -> dict:
    from edgeasr.asr.engine import build_engine
    from edgeasr.audio.files import load_audio
    from edgeasr.audio.segmenter import PauseFinder
    from edgeasr.commands.bench import _row_config, read_set
    from edgeasr.models.default import open_bundle

    cfg = _row_config(args, {"encoder.backend": "onnx"})
    bundle = open_bundle(cfg)
    engine = build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, PauseFinder(cfg.vad))
    beams = [int(b) for b in args.beams.split(",") if b]
    variants = _variants(engine, bundle, beams, args.threads)
    names = list(variants)
    utterances = read_set(args.set_dir, args.limit)
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for k, u in enumerate([utterances[0], *utterances]):  # the first one twice: a warm-up
        audio = load_audio(args.set_dir / u["file"], bundle.audio.sample_rate)
        for name in names[k % len(names):] + names[: k % len(names)]:
            engine.decode, engine.aligner = variants[name]
            r = engine.transcribe(audio)
            if k:
                rows[name].append({"text": r.text, "windows": r.windows,
                                   "decoder_ms": r.timings_ms["decoder"], "words_ms": r.timings_ms.get("words", 0.0)})
    references = [u["reference"] for u in utterances]
    return summarize(rows, references)


def summarize(rows: dict[str, list[dict]], references: list[str]) -> dict:
    greedy = [r["decoder_ms"] / r["windows"] for r in rows[GREEDY]]
    table = {}
    for name, results in rows.items():
        per_window = [r["decoder_ms"] / r["windows"] for r in results]
        wer, cer = _scores(references, [r["text"] for r in results])
        table[name] = {
            "wer": round(wer, 4), "cer": round(cer, 4),
            "decoder_ms_per_window": round(statistics.median(per_window), 1),
            "decoder_ratio": round(statistics.median(p / g for p, g in zip(per_window, greedy)), 3),
            "words_ms_per_window": round(statistics.median(r["words_ms"] / r["windows"] for r in results), 1),
        }
    return {"utterances": len(references), "rows": table}


def main(args) -> int:
    report = run(args)
    print(f"{report['utterances']} utterances, interleaved; ratio: median of per-utterance decoder ms per window / greedy's")
    print(f"{'variant':14} {'WER':>7} {'CER':>7} {'dec ms/win':>11} {'ratio':>6} {'words ms/win':>13}")
    for name, row in report["rows"].items():
        print(f"{name:14} {row['wer']:7.2%} {row['cer']:7.2%} {row['decoder_ms_per_window']:11.1f} "
              f"{row['decoder_ratio']:6.2f} {row['words_ms_per_window']:13.1f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0
