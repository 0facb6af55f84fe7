"""`edgeasr bench --dataset DIR`: speed, accuracy and memory of each way to run the model.

Rows (each in its own process, so peak RSS is the row's own): the 30 s fp32 encoder,
our default 10 s int8 CPU engine (the bundle's calibrated decoding settings), the hybrid
Hailo engine (with a device only), the full-NPU reference (the fixed-length Hailo decoder
without cache, in onnxruntime) and faster-whisper int8 on the same weights, greedy and
beam 5 (a weights file in parts, as Whisper base ships, is joined in memory); then one row
per preset. Every row decodes in the same language: model.language, detected when null. Figures are medians
and ratios from one run: these machines are shared and noisy.

Rows run one after another, so a busy spell of the machine can slow one row and not the
other. The speed ratio against faster-whisper is therefore also measured interleaved:
the two rows' processes take turns on each utterance (alternating which goes first).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeasr.config import DECODER_PRESETS, DecoderConfig
from edgeasr.errors import MissingInputError, ToolMissingError

if TYPE_CHECKING:
    from edgeasr.models.scoring import Entry, Scorer

ROWS = {
    "30s-fp32": "30 s encoder fp32 (reference)",
    "10s-int8": "10 s int8 CPU (default)",
    "hybrid-hailo": "hybrid: Hailo encoder + CPU decoder",
    "full-npu-ref": "full-NPU reference (fixed-32 decoder, no cache)",
    "faster-whisper": "faster-whisper int8, greedy",
    "faster-whisper-beam5": "faster-whisper int8, beam 5",
}


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark the engine variants on an audio set")
    p.add_argument("--dataset", dest="set_dirs", type=Path, action="append", required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, duration_s, reference); repeat it to pool "
                   "several sets, scored as one")
    p.add_argument("--model", type=Path, default=None, help="bundle (default: the embedded default)")
    p.add_argument("--threads", type=int, default=DecoderConfig().threads, help="onnxruntime threads of every row")
    p.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run")
    p.add_argument("--no-presets", action="store_true", help="skip the per-preset rows")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # child process: run one row
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # child: take turns
    p.set_defaults(func=main)


def read_set(set_dir: Path, limit: int = 0) -> list[dict]:
    manifest = set_dir / "manifest.tsv"
    if not manifest.is_file():
        raise MissingInputError(f"{manifest}: no manifest.tsv in the benchmark set")
    with manifest.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[:limit] if limit else rows


# ---------------------------------------------------------------- one row (child process)


def _engine_row(bundle, args, row: str):
    from edgeasr.asr.decoding import DecoderSession
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.engine import build_engine, decoding_options
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.audio.segmenter import PauseFinder

    backend = "hailo" if row == "hybrid-hailo" else "onnx"
    cfg = _row_config(args, {"encoder.backend": backend, "decoder.preset": args.preset})  # None: calibrated
    if row == "30s-fp32":
        full = bundle.n_audio_ctx
        audio = dataclasses.replace(bundle.audio, window_s=full * 2 * bundle.audio.hop_length
                                    / bundle.audio.sample_rate, n_frames=full * 2, n_positions=full)
        b30 = dataclasses.replace(bundle, audio=audio)
        return Transcriber(b30, OnnxEncoder(bundle, "fp32", args.threads, role="encoder_30s"),
                           DecoderSession(bundle, "fp32", args.threads),
                           decoding_options(cfg.model, cfg.decoder, bundle))
    return build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, PauseFinder(cfg.vad))


def _row_config(args, keys: dict):
    from edgeasr.commands.common import load

    return load(args, {"model.path": args.model, "encoder.threads": args.threads,
                       "decoder.threads": args.threads, **keys})


def _run_engine(engine, audio) -> dict:
    t0 = time.monotonic()
    r = engine.transcribe(audio)
    total = (time.monotonic() - t0) * 1e3
    return {"text": r.text, "total_ms": total, "encoder_ms": r.timings_ms["encoder"],
            "decoder_ms": r.timings_ms["decoder"], "steps": r.decoder_steps, "runaway": r.runaway_windows,
            "windows": r.windows}


def _full_npu(bundle, args):
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.features import MelSpec, log_mel
    from edgeasr.asr.reference_decoder import FullNpuReferenceDecoder
    from edgeasr.asr.tokenizer import Tokenizer

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


def _ct2_files(bundle) -> dict[str, bytes] | None:
    """The CTranslate2 model the bundle was imported from, as faster-whisper's in-memory
    files: model.bin joined from its parts, with the files beside the first part."""
    source = bundle.manifest["source"]
    parts = [Path(f) for f in source.get("files", [])]
    if source.get("kind") != "ctranslate2" or not parts or not all(p.is_file() for p in parts):
        return None
    files = {"model.bin": b"".join(p.read_bytes() for p in parts)}
    for name in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        if (parts[0].parent / name).is_file():
            files[name] = (parts[0].parent / name).read_bytes()
    return files


def _faster_whisper(bundle, args, beam_size: int = 1):
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise ToolMissingError("the faster-whisper row needs the bench extra: pip install 'edgeasr[bench]'") from exc
    files = _ct2_files(bundle)
    if files is None:
        return None
    model = WhisperModel(bundle.name, device="cpu", compute_type="int8", cpu_threads=args.threads, files=files)
    language = _row_config(args, {}).model.language if bundle.multilingual else "en"

    def run(audio) -> dict:
        t0 = time.monotonic()
        segments, _ = model.transcribe(audio, beam_size=beam_size, language=language, vad_filter=False)
        text = "".join(s.text for s in segments)
        return {"text": text, "total_ms": (time.monotonic() - t0) * 1e3, "encoder_ms": None,
                "decoder_ms": None, "steps": None, "runaway": 0, "windows": None}

    return run


def _runner(bundle, args, row: str):
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


def _open_row(args):
    """The child's row runner (or why it is skipped) and a loader of the set's utterances."""
    from edgeasr.asr.engine import single_threaded_blas
    from edgeasr.audio.files import load_audio
    from edgeasr.models.default import open_bundle
    from edgeasr.models.scoring import read_entries

    single_threaded_blas()  # every row, faster-whisper's too (its features use numpy as well)
    bundle = open_bundle(_row_config(args, {}))
    utterances = read_entries(args.set_dirs, args.limit)

    def load(u: Entry):
        return load_audio(u.path, bundle.audio.sample_rate)

    return _runner(bundle, args, args.row), utterances, load


def run_row(args) -> dict:
    """Child process: the row on every utterance of the set."""
    run, utterances, load = _open_row(args)
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
    run, utterances, load = _open_row(args)
    if isinstance(run, str):
        print(json.dumps({"skipped": run}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"total_ms": run(load(utterances[int(line)]))["total_ms"]}), flush=True)


# ---------------------------------------------------------------- the table (parent)


def summarize(data: dict, scorer: Scorer) -> dict:
    if "skipped" in data:
        return {"skipped": data["skipped"]}
    res = data["results"]
    hyps = [r["text"] for r in res]
    totals = sorted(r["total_ms"] for r in res)

    def med(key):
        vals = [r[key] for r in res if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    steps = sum(r["steps"] or 0 for r in res)
    dec = sum(r["decoder_ms"] or 0 for r in res)
    windows = sum(r["windows"] or 0 for r in res)
    per_window = sorted(r["encoder_ms"] / r["windows"] for r in res if r["windows"])
    score = scorer.score(hyps)
    return {
        "utterances": len(res),
        "encoder_ms_median": med("encoder_ms"), "decoder_ms_median": med("decoder_ms"),
        "encoder_ms_per_window": round(statistics.median(per_window), 1) if windows else None,
        "total_ms_median": round(statistics.median(totals), 1),
        "total_ms_p90": round(totals[min(len(totals) - 1, int(0.9 * len(totals)))], 1),
        "cpu_ms_median": med("cpu_ms"),
        "decoder_ms_per_token": round(dec / steps, 2) if steps else None,
        "decoder_ms_per_token_median": round(statistics.median(
            r["decoder_ms"] / r["steps"] for r in res), 2) if steps else None,
        "windows": windows or None, "decoder_steps": steps or None,
        "wer": round(score.wer, 4), "cer": round(score.cer, 4),
        "substitutions": score.substitutions, "deletions": score.deletions, "insertions": score.insertions,
        "empty": score.empty,
        "groups": {name: {"wer": round(g.wer, 4), "cer": round(g.cer, 4), "deletions": g.deletions}
                   for name, g in scorer.per_group(hyps).items()},
        "runaway_windows": sum(r["runaway"] for r in res),
        "peak_rss_mb": round(data["peak_rss_mb"], 1),
    }


def interleaved(args, rows: tuple[str, str], count: int) -> dict:
    """The two rows' processes take turns on every utterance (which one goes first
    alternates), so that a busy spell of the machine slows both alike."""
    procs = {row: subprocess.Popen(_child_cmd(args, row) + ["--serve"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for row in rows}

    def ask(row: str, index: int | None) -> dict:
        proc = procs[row]
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # PIPE
        if index is not None:
            proc.stdin.write(f"{index}\n")
            proc.stdin.flush()
        answer = proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"{row}: {proc.stderr.read().strip()[-300:]}")
        return json.loads(answer)

    try:
        for row in rows:
            hello = ask(row, None)
            if "skipped" in hello:
                return {"skipped": f"{row}: {hello['skipped']}"}
            ask(row, 0)  # warm-up, not counted
        pairs = []
        for i in range(count):
            order = rows if i % 2 == 0 else rows[::-1]
            pairs.append({row: ask(row, i)["total_ms"] for row in order})
    except (RuntimeError, OSError) as exc:
        return {"skipped": f"failed: {exc}"}
    finally:
        for proc in procs.values():
            proc.communicate(timeout=60)  # closes stdin, waits, drains and closes the pipes
    return {"pairs": pairs}


def summarize_interleaved(data: dict) -> dict:
    """Our default ("10s-int8") against faster-whisper, from `interleaved`'s pairs."""
    if "skipped" in data:
        return {"skipped": data["skipped"]}
    ours = [p["10s-int8"] for p in data["pairs"]]
    theirs = [p["faster-whisper"] for p in data["pairs"]]
    return {
        "utterances": len(ours),
        "ours_ms_median": round(statistics.median(ours), 1),
        "faster_whisper_ms_median": round(statistics.median(theirs), 1),
        "ratio_median": round(statistics.median(t / o for o, t in zip(ours, theirs)), 2),
    }


def _child_cmd(args, row: str, preset: str | None = None) -> list[str]:
    config = ["--config", str(args.config)] if args.config else []
    sets = [arg for item in args.set for arg in ("--set", item)]
    cmd = [sys.executable, "-m", "edgeasr", "--log-level", "WARNING", *config, *sets, "bench",
           *(arg for d in args.set_dirs for arg in ("--dataset", str(d))), "--threads", str(args.threads),
           "--limit", str(args.limit),
           "--row", row] + (["--preset", preset] if preset else [])
    return cmd + ["--model", str(args.model)] if args.model else cmd


def _child(args, row: str, preset: str | None = None) -> dict:
    out = subprocess.run(_child_cmd(args, row, preset), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"skipped": f"failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"}
    return json.loads(out.stdout)


def markdown(report: dict) -> str:
    cols = ["encoder_ms_per_window", "encoder_ms_median", "decoder_ms_median", "total_ms_median",
            "total_ms_p90", "cpu_ms_median", "decoder_ms_per_token", "decoder_ms_per_token_median", "wer",
            "cer", "peak_rss_mb"]
    head = ("| row | enc ms/window | enc ms | dec ms | total ms (median) | total ms (p90) | CPU ms (median)"
            " | dec ms/token (all) | dec ms/token (median) | WER | CER | peak RSS MB |")
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for name, row in report["rows"].items():
        if "skipped" in row:
            lines.append(f"| {ROWS.get(name, name)} | {row['skipped']} |" + " |" * (len(cols) - 1))
            continue
        cells = ["n/a" if row[c] is None else (f"{row[c]:.2%}" if c in ("wer", "cer") else f"{row[c]:g}")
                 for c in cols]
        lines.append(f"| {ROWS.get(name, name)} | " + " | ".join(cells) + " |")
    lines += _accuracy_table(report["rows"])
    lines += ["", "| preset | WER | runaway windows | total ms (median) |", "|---|---|---|---|"]
    for name, row in report.get("presets", {}).items():
        if "skipped" in row:
            lines.append(f"| {name} | {row['skipped']} | | |")
        else:
            lines.append(f"| {name} | {row['wer']:.2%} | {row['runaway_windows']} | {row['total_ms_median']:g} |")
    pair = report.get("interleaved", {})
    if "ratio_median" in pair:
        lines.append(f"\ninterleaved, median ms per utterance: ours {pair['ours_ms_median']:g}, "
                     f"faster-whisper {pair['faster_whisper_ms_median']:g}")
    for key, value in report.get("ratios", {}).items():
        lines.append(f"\n{key}: {value}")
    return "\n".join(lines)


def _accuracy_table(rows: dict) -> list[str]:
    """Each row's errors by kind, its empty transcripts, and its WER per group."""
    scored = {name: row for name, row in rows.items() if "groups" in row}
    if not scored:
        return []
    groups = list(next(iter(scored.values()))["groups"])
    lines = ["", "| row | substitutions / deletions / insertions | empty | " + " | ".join(
        f"WER {g}" for g in groups) + " |", "|---|---|---|" + "---|" * len(groups)]
    for name, row in scored.items():
        cells = [f"{row['groups'][g]['wer']:.2%}" for g in groups]
        lines.append(f"| {ROWS.get(name, name)} | {row['substitutions']} / {row['deletions']} / "
                     f"{row['insertions']} | {row['empty']} | " + " | ".join(cells) + " |")
    return lines


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ToolMissingError("--plot needs matplotlib: pip install 'edgeasr[bench]'") from exc
    rows = {k: v for k, v in report["rows"].items() if "skipped" not in v}
    names = [ROWS.get(k, k) for k in rows]
    enc = [v["encoder_ms_median"] or 0 for v in rows.values()]
    dec = [v["decoder_ms_median"] or 0 for v in rows.values()]
    other = [max(0.0, v["total_ms_median"] - e - d) for v, e, d in zip(rows.values(), enc, dec)]
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(names) + 1.5))
    ax.barh(names, enc, label="encoder")
    ax.barh(names, dec, left=enc, label="decoder")
    ax.barh(names, other, left=[e + d for e, d in zip(enc, dec)], label="other / not separable")
    ax.set_xlabel("median ms per utterance")
    ax.set_title(f"edgeasr bench, {report['date']} on {report['machine']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: argparse.Namespace) -> int:
    if args.row and args.serve:
        serve_row(args)
        return 0
    if args.row:
        print(json.dumps(run_row(args)))
        return 0
    from edgeasr.models.default import open_bundle

    bundle = open_bundle(_row_config(args, {}))  # prepares the default bundle once, before the children
    args.model = args.model or bundle.root
    from edgeasr.models.scoring import Scorer, read_entries

    entries = read_entries(args.set_dirs, args.limit)
    scorer = Scorer(entries, bundle.audio.window_s, language=_row_config(args, {}).model.language or "en")
    report = {"date": dt.date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "threads": args.threads, "model": bundle.name, "utterances": len(entries),
              "rows": {}, "presets": {}}
    for row in [r for r in args.rows.split(",") if r]:
        print(f"bench: {ROWS.get(row, row)} ...", file=sys.stderr)
        report["rows"][row] = summarize(_child(args, row), scorer)
    if not args.no_presets:
        for preset in DECODER_PRESETS:
            print(f"bench: preset {preset} ...", file=sys.stderr)
            report["presets"][preset] = summarize(_child(args, "10s-int8", preset), scorer)
    ours, fw = report["rows"].get("10s-int8", {}), report["rows"].get("faster-whisper", {})
    if "total_ms_median" in ours and "total_ms_median" in fw:
        report["ratios"] = {"faster-whisper median / ours": round(fw["total_ms_median"] / ours["total_ms_median"], 2)}
        print("bench: ours and faster-whisper, interleaved ...", file=sys.stderr)
        pair = summarize_interleaved(interleaved(args, ("10s-int8", "faster-whisper"), len(entries)))
        report["interleaved"] = pair
        if "ratio_median" in pair:
            report["ratios"]["faster-whisper median / ours, interleaved"] = round(
                pair["faster_whisper_ms_median"] / pair["ours_ms_median"], 2)
            report["ratios"]["faster-whisper / ours, interleaved, median of per-utterance ratios"] = (
                pair["ratio_median"])
    text = markdown(report)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0
