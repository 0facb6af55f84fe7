"""`edgeasr bench-streams --dataset DIR ...`: the microphone pipeline on long-form streams, clean
and noisy, for each speech detector and hangover.

Streams are made from the sets' utterances with real noise mixed in at each `--snr`
(models/streams.py) and read, as fast as the disk gives them, through the daemon's own
segmenter, worker and pipeline (every segment decoded once). Per stream condition and detector
setting: the stream WER (all its transcripts against all its references) beside the WER of the
same utterances cut from the same stream and transcribed one by one, so that what the
segmentation costs shows apart from what the noise costs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-streams", help="the microphone pipeline on long streams, clean and noisy, "
                              "per speech detector and hangover")
    p.add_argument("--dataset", type=Path, action="append", required=True, metavar="DIR",
                   help="a directory with manifest.tsv; repeat it to pool several sets")
    p.add_argument("--model", type=Path, default=None, metavar="BUNDLE", help="bundle (default: the embedded default)")
    p.add_argument("--snr", default="20,10", help="noise levels in dB, comma-separated (default 20,10)")
    p.add_argument("--detectors", default="webrtc,silero,ten", help="vad.detector values (default: all three)")
    p.add_argument("--hangover-ms", default="900", help="vad.hangover_ms values, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="write the streams here (else a temp dir)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from edgeasr.asr.engine import build_engine
    from edgeasr.audio.segmenter import PauseFinder
    from edgeasr.commands.common import load
    from edgeasr.models.default import open_bundle
    from edgeasr.models.scoring import normalizer, read_pool
    from edgeasr.models.streams import make_streams, mix, noise_for, room_tone, write

    cfg = load(args, {"encoder.backend": "onnx", **({"model.path": args.model} if args.model else {})})
    bundle = open_bundle(cfg)
    engine = build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, PauseFinder(cfg.vad))
    pool = read_pool(args.dataset, bundle.audio.sample_rate)
    clean = make_streams(pool, args.seed)
    tone = room_tone(pool)
    rng = np.random.default_rng(args.seed)
    conditions = {"clean": clean}
    for snr in (float(s) for s in args.snr.split(",") if s):
        conditions[f"{snr:g} dB"] = [
            mix(s, noise_for(s, tone, [u for u in pool if u.id not in s.ids], rng), snr) for s in clean]
    norm = normalizer(cfg.model.language or "en")
    work = args.keep or Path(tempfile.mkdtemp(prefix="edgeasr-streams-"))
    report: dict = {"model": bundle.name, "streams": len(clean), "conditions": {}}
    for name, streams in conditions.items():
        write(streams, work / name.replace(" ", ""))
        refs = norm(" ".join(r for s in streams for r in s.references))
        one_by_one = " ".join(engine.transcribe(s.audio[a:b]).text for s in streams for a, b in s.spans)
        row = {"one by one": _wer(refs, norm(one_by_one))}
        for detector in args.detectors.split(","):
            for hangover in (int(h) for h in args.hangover_ms.split(",")):
                texts = [_daemon_text(cfg, bundle, engine, work / name.replace(" ", "") / f"{s.id}.wav",
                                      detector, hangover) for s in streams]
                row[f"{detector}, hangover {hangover} ms"] = _wer(refs, norm(" ".join(texts)))
                print(f"bench-streams: {name}, {detector}, {hangover} ms: {row}", flush=True)
        report["conditions"][name] = row
    print(markdown(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _daemon_text(cfg, bundle, engine, path: Path, detector: str, hangover_ms: int) -> str:
    """The stream through the daemon's segmenter, worker and pipeline: its transcripts' text."""
    import dataclasses

    from edgeasr.audio.clock import StreamClock
    from edgeasr.audio.segmenter import Segmenter
    from edgeasr.audio.sources import FileSource
    from edgeasr.daemon import window_s
    from edgeasr.pipeline import Pipeline
    from edgeasr.worker import Worker

    vad = dataclasses.replace(cfg.vad, detector=detector, hangover_ms=hangover_ms)
    after = cfg.pipeline.speculate_after_ms
    options = dataclasses.replace(cfg.pipeline, speculate_after_ms=after if after is None or after < hangover_ms
                                  else None)
    texts: list[str] = []

    class Collect:
        def publish(self, transcript) -> None:
            if not transcript.partial:
                texts.append(transcript.transcription.text)

        def close(self, timeout_s: float) -> None:
            pass

    worker = Worker(engine).start()
    pipeline = Pipeline(FileSource(path, False, cfg.input.block_ms),
                        Segmenter(vad, window_s(cfg, bundle), StreamClock()), worker, [Collect()], options,
                        live=False)
    pipeline.run()
    worker.stop(None)
    return " ".join(texts)


def _wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return round(float(jiwer.wer(reference, hypothesis)), 4)


def markdown(report: dict) -> str:
    rows = list(next(iter(report["conditions"].values())))
    lines = ["| stream WER | " + " | ".join(report["conditions"]) + " |", "|---|" + "---|" * len(report["conditions"])]
    for row in rows:
        cells = [f"{c[row]:.2%}" for c in report["conditions"].values()]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
