"""The rows of `edgeasr bench`, each run in a process of its own: a row's runner (audio ->
its text and timings) and the loop over the set's utterances."""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import time
from typing import TYPE_CHECKING, Any

from edgeasr.lab.evaluation.runs import faster_whisper, row_config

if TYPE_CHECKING:
    from edgeasr.lab.evaluation.scoring import Entry

ROWS = {
    "30s-fp32": "30 s encoder fp32 (reference)",
    "10s-int8": "10 s int8 CPU (default)",
    "hybrid-hailo": "hybrid: Hailo encoder + CPU decoder",
    "full-npu-ref": "full-NPU reference (fixed-32 decoder, no cache)",
    "faster-whisper": "faster-whisper int8, greedy",
    "faster-whisper-beam5": "faster-whisper int8, beam 5",
}
DECODER_ROWS = ("30s-fp32", "10s-int8", "hybrid-hailo")  # ours, with the cached CPU decoder


def _engine_row(bundle, args, row: str):
    from edgeasr.asr.decoding import DecoderSession
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.engine import EngineOptions, EngineSessions, decoding_options
    from edgeasr.asr.transcriber import Transcriber, build_engine
    from edgeasr.audio.vad import SpeechJudge

    backend = "hailo" if row == "hybrid-hailo" else "onnx"
    cfg = row_config(args, {"encoder.backend": backend, "decoder.preset": args.preset})  # None: calibrated
    if row == "30s-fp32":
        full = bundle.n_audio_ctx
        audio = dataclasses.replace(bundle.audio, window_s=full * 2 * bundle.audio.hop_length
                                    / bundle.audio.sample_rate, n_frames=full * 2, n_positions=full)
        b30 = dataclasses.replace(bundle, audio=audio)
        sessions = EngineSessions(b30, OnnxEncoder(bundle, "fp32", args.threads, role="encoder_30s"),
                                  DecoderSession(bundle, "fp32", args.threads), "fp32", args.threads)
        return Transcriber(sessions, EngineOptions(decoding_options(cfg.model, cfg.decoder, bundle)))
    return build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad))


def _run_engine(engine, audio) -> dict:
    shortlist = engine.sessions.decoder.shortlist  # decoder.projection: shortlist
    before = dataclasses.replace(shortlist.counts) if shortlist is not None else None
    t0 = time.monotonic()
    r = engine.transcribe(audio)
    total = (time.monotonic() - t0) * 1e3
    out = {"text": r.text, "total_ms": total, "encoder_ms": r.timings_ms["encoder"],
           "decoder_ms": r.timings_ms["decoder"], "steps": r.decoder_steps, "runaway": r.runaway_windows,
           "windows": r.windows}
    if shortlist is not None and before is not None:  # steps taken on a shortlist, and those redone
        out.update(shortlist_steps=shortlist.counts.steps - before.steps,
                   shortlist_rollbacks=shortlist.counts.rollbacks - before.rollbacks)
    return out


def _full_npu(bundle, args):
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.features import MelSpec, log_mel
    from edgeasr.asr.tokenizer import Tokenizer
    from edgeasr.lab.hailo.reference_decoder import FullNpuReferenceDecoder

    encoder, decoder, tok = OnnxEncoder(bundle, "fp32", args.threads), FullNpuReferenceDecoder(
        bundle, threads=args.threads), Tokenizer(bundle)
    a = bundle.audio
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)

    def run(audio) -> dict:  # fixed 10 s chunks, as Hailo's app walks long audio
        out: dict[str, Any] = {"text": "", "total_ms": 0.0, "encoder_ms": 0.0, "decoder_ms": 0.0, "steps": 0, "runaway": 0,
               "windows": 0}
        t0 = time.monotonic()
        for start in range(0, len(audio), spec.n_samples):
            t1 = time.monotonic()
            feats = encoder.encode(log_mel(audio[start : start + spec.n_samples], spec))
            t2 = time.monotonic()
            tokens = decoder.decode(feats)
            out["encoder_ms"] += (t2 - t1) * 1e3
            out["windows"] += 1
            out["decoder_ms"] += (time.monotonic() - t2) * 1e3
            out["steps"] += decoder.last.steps
            out["runaway"] += int(len(tokens) >= decoder.max_new_tokens)
            out["text"] += tok.decode(tokens)
        out["total_ms"] = (time.monotonic() - t0) * 1e3
        return out

    return run


def _faster_whisper(bundle, args, beam_size: int = 1):
    model = faster_whisper(bundle, args.threads)
    if model is None:
        return None
    language = row_config(args, {}).model.language if bundle.multilingual else "en"

    def run(audio) -> dict:
        t0 = time.monotonic()
        segments, _ = model.transcribe(audio, beam_size=beam_size, language=language, vad_filter=False)
        text = "".join(s.text for s in segments)
        return {"text": text, "total_ms": (time.monotonic() - t0) * 1e3, "encoder_ms": None,
                "decoder_ms": None, "steps": None, "runaway": 0, "windows": None}

    return run


def runner(bundle, args, row: str):
    """The row's function audio -> result dict, or a string saying why the row is skipped."""
    if row == "hybrid-hailo":
        from importlib.util import find_spec

        if find_spec("hailo_platform") is None:
            return "no Hailo device here (HailoRT's hailo_platform is not installed)"
        from edgeasr.asr.hailo import hailo_available

        if not hailo_available():
            return "no Hailo device here"
    if row == "30s-fp32" and not (bundle.has("encoder_30s") and bundle.has("decoder_step")):
        return "the bundle has no 30 s encoder or fp32 decoder (import with --with fp32,30s)"
    if row == "full-npu-ref" and not bundle.has("hailo_decoder"):
        return "the bundle has no fixed-length Hailo decoder (import with --with hailo)"
    if row in ("faster-whisper", "faster-whisper-beam5"):
        run = _faster_whisper(bundle, args, 5 if row.endswith("beam5") else 1)
        return run if run is not None else "faster-whisper needs the CTranslate2 weights the bundle came from"
    if row == "full-npu-ref":
        return _full_npu(bundle, args)
    engine = _engine_row(bundle, args, row)
    return lambda audio: _run_engine(engine, audio)


def open_row(args):
    """The child's row runner (or why it is skipped) and a loader of the set's utterances."""
    from edgeasr.asr.engine import single_threaded_blas
    from edgeasr.audio.files import load_audio
    from edgeasr.lab.evaluation.scoring import read_entries
    from edgeasr.models.default import open_bundle

    single_threaded_blas()  # every row, faster-whisper's too (its features use numpy as well)
    bundle = open_bundle(row_config(args, {}))
    utterances = read_entries(args.set_dirs, args.limit)

    def load(u: Entry):
        return load_audio(u.path, bundle.audio.sample_rate)

    return runner(bundle, args, args.row), utterances, load


def run_row(args) -> dict:
    """Child process: the row on every utterance of the set."""
    run, utterances, load = open_row(args)
    if isinstance(run, str):
        return {"skipped": run}
    run(load(utterances[0]))  # warm-up, not counted
    results = []
    for u in utterances:
        audio = load(u)
        cpu = time.process_time()  # all of the process's threads: spinning ones count
        r = run(audio)
        r.update(id=u.id, duration_s=u.duration_s, cpu_ms=(time.process_time() - cpu) * 1e3)
        results.append(r)
    return {"results": results, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def serve_row(args) -> None:
    """Child process taking turns with another (`interleaved`): reads an utterance index per
    line on stdin and answers with that utterance's total ms on stdout."""
    run, utterances, load = open_row(args)
    if isinstance(run, str):
        print(json.dumps({"skipped": run}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"total_ms": run(load(utterances[int(line)]))["total_ms"]}), flush=True)
