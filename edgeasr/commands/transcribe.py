"""`edgeasr transcribe FILE...`: audio files -> text (plain) or one JSON object per file.

The JSON names (file, text, segments, duration_s, windows, tokens, timings_ms with load,
features, encoder, decoder, total) are a public contract; with --words (output.words) each
segment has `words` (word, start, end in seconds from the file's start, probability).
timings_ms also has `words` when words were aligned (--words, or the judge of
decoder.drop_unspoken_words) and `command` when the home's sentences were searched; then
`reading` says what the command reading did (steps, rows: the hypotheses those steps took,
matched: the texts Home Assistant's matcher read, cut: 1 where its budget ended it). A file
that cannot be read
gets one line on stderr; the other files are still transcribed, and the exit code is
that of the first failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edgeasr.commands.common import load
from edgeasr.config import DECODER_PRESETS, ENCODER_BACKENDS, PRECISIONS, EncoderConfig


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Short forms of the engine's config keys (each is a --set)."""
    p.add_argument("--model", type=Path, default=None,
                   help="model bundle directory, the same as --set model.path=DIR (default: "
                   "tiny.en from the installed weights package)")
    defaults = EncoderConfig()
    p.add_argument("--backend", choices=ENCODER_BACKENDS, default=None,
                   help=f"encoder.backend (default: {defaults.backend}; auto = hailo when present)")
    p.add_argument("--preset", choices=DECODER_PRESETS, default=None,
                   help="decoder.preset (default: the values calibrated for the bundle)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help=f"encoder.precision and decoder.precision (default: {defaults.precision})")
    p.add_argument("--threads", type=int, default=None,
                   help=f"encoder.threads and decoder.threads (default: {defaults.threads})")
    p.add_argument("--language", default=None, help="model.language (default: detect)")


def engine_overrides(args: argparse.Namespace) -> dict:
    pairs = {"model.path": args.model, "encoder.backend": args.backend, "decoder.preset": args.preset,
             "encoder.precision": args.precision, "decoder.precision": args.precision,
             "encoder.threads": args.threads, "decoder.threads": args.threads,
             "model.language": args.language}
    return {k: v for k, v in pairs.items() if v is not None}


def register(subparsers) -> None:
    p = subparsers.add_parser("transcribe", help="transcribe audio files (WAV/FLAC/OGG, any rate)")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    add_engine_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object per file, one per line")
    p.add_argument("--words", action="store_true",
                   help="word timestamps in --json's segments (output.words; one more decoder run per window)")
    p.set_defaults(func=main)


def word_json(w) -> dict:
    """A word as the JSON outputs carry it: times in seconds (3 decimals), text stripped."""
    return {"word": w.word.strip(), "start": w.start, "end": w.end, "probability": w.probability}


def result_json(path: Path, duration_s: float, result, load_ms: float, total_ms: float,
                words: bool = False, intent: bool = False) -> dict:
    from edgeasr.output.payload import intent_message

    return {
        "file": str(path),
        "text": result.text,
        "language": result.language,
        "segments": [
            {"start": s.start, "end": s.end, "text": s.text.strip(),
             "avg_logprob": round(s.avg_logprob, 4), "no_speech_prob": round(s.no_speech_prob, 4),
             **({"words": [word_json(w) for w in s.words]} if words else {})}
            for s in result.segments
        ],
        "duration_s": round(duration_s, 3),
        "windows": result.windows,
        "tokens": result.tokens,
        "timings_ms": {"load": round(load_ms, 1),
                       **{k: round(v, 1) for k, v in result.timings_ms.items()},
                       "total": round(total_ms, 1)},
        **({"intent": intent_message(result.intent)} if intent and result.intent else {}),
        **({"reading": dict(result.reading)} if result.reading else {}),
    }


def home_vocabulary(cfg):
    """The home's names as the daemon holds them: the config's `vocabulary`, and Home
    Assistant's when `homeassistant.url` is set (read once, now; on failure one line and the
    config's alone)."""
    from edgeasr.home.source import VocabularySource

    source = VocabularySource.from_config(cfg, start=False)
    if source.homeassistant is not None:
        source.homeassistant.refresh()
    return source.current()


def main(args) -> int:
    from tqdm import tqdm

    from edgeasr.audio.files import load_audio
    from edgeasr.daemon import engine_for
    from edgeasr.errors import EdgeAsrError
    from edgeasr.models.default import open_bundle

    cfg = load(args, engine_overrides(args))
    vocabulary = home_vocabulary(cfg)
    bundle = open_bundle(cfg)
    transcriber = engine_for(cfg, bundle, words=cfg.output.words or args.words)
    sr = bundle.audio.sample_rate
    status = 0
    show = sys.stderr.isatty() and len(args.files) > 1
    for path in tqdm(args.files, unit="file", disable=not show, file=sys.stderr):
        try:
            t0 = time.monotonic()
            audio = load_audio(path, sr)
            t1 = time.monotonic()
            result = transcriber.transcribe(audio, vocabulary=vocabulary)
            t2 = time.monotonic()
        except EdgeAsrError as exc:
            print(f"edgeasr: {exc}", file=sys.stderr)
            status = status or exc.exit_code
            continue
        if args.json:
            line = json.dumps(result_json(path, len(audio) / sr, result, (t1 - t0) * 1e3,
                                          (t2 - t1) * 1e3, words=transcriber.options.words,
                                          intent=cfg.output.intent), ensure_ascii=False)
            print(line, flush=True)
        else:
            print(result.text, flush=True)
    return status
