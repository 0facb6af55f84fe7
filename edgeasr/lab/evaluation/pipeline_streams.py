"""The microphone pipeline on long-form streams, clean and noisy, for each speech detector and
hangover (`edgeasr bench-streams`).

Streams are made from the sets' utterances with real noise mixed in at each `--snr`
(evaluation/streams.py) and read, as fast as the disk gives them, through the daemon's own
segmenter, worker and pipeline (every segment decoded once). Per stream condition and detector
setting: the stream WER (all its transcripts against all its references) beside the WER of the
same utterances cut from the same stream and transcribed one by one, so that what the
segmentation costs shows apart from what the noise costs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def run(args) -> dict:
    """Every stream condition through every detector setting: the report."""
    import numpy as np

    from edgeasr.asr.transcriber import build_engine
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.commands.common import load
    from edgeasr.lab.evaluation.scoring import normalizer, read_pool
    from edgeasr.lab.evaluation.streams import make_streams, mix, noise_for, room_tone, write
    from edgeasr.models.default import open_bundle

    cfg = load(args, {"encoder.backend": "onnx", **({"model.path": args.model} if args.model else {})})
    bundle = open_bundle(cfg)
    engine = build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad))
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
    return report


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
