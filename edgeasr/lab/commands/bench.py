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
import json
from pathlib import Path

from edgeasr.config import DecoderConfig
from edgeasr.errors import ToolMissingError
from edgeasr.lab.evaluation.bench_rows import ROWS
from edgeasr.lab.evaluation.load import LOADS


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark the engine variants on an audio set")
    p.add_argument("--dataset", dest="set_dirs", type=Path, action="append", required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, duration_s, reference); repeat it to pool "
                   "several sets, scored as one")
    p.add_argument("--model", type=Path, default=None, help="bundle (default: the embedded default)")
    p.add_argument("--threads", type=int, default=DecoderConfig().threads, help="onnxruntime threads of every row")
    p.add_argument("--limit", type=int, default=0, help="only the first N utterances of each set")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run")
    p.add_argument("--no-presets", action="store_true", help="skip the per-preset rows")
    p.add_argument("--load", default=None, metavar="LOADS",
                   help="run ours and faster-whisper interleaved under each of these loads in turn "
                   f"({', '.join(LOADS)}; the first is the one slowdowns are against), e.g. idle,busy1,busy2,wakeful")
    p.add_argument("--cpu-weight", default=None, metavar="N",
                   help="with ours and faster-whisper interleaved: ours, faster-whisper's row and the "
                   "neighbours each in a cpu cgroup of its own, as separate services are, ours at weight N "
                   "(systemd's CPUWeight=; the unit's is 1000), the others at 100. Needs root")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # child process: run one row
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # child: take turns
    p.set_defaults(func=main)


def markdown(report: dict) -> str:
    cols = ["encoder_ms_per_window", "encoder_ms_median", "decoder_ms_median", "total_ms_median",
            "total_ms_p90", "cpu_ms_median", "decoder_ms_per_token", "decoder_ms_per_token_median", "wer",
            "cer", "peak_rss_mb"]
    head = ("| row | enc ms/window | enc ms | dec ms | total ms (median) | total ms (p90) | CPU ms (median)"
            " | dec ms/token (all) | dec ms/token (median) | WER | CER | peak RSS MB | MB/token (weights + cross"
            " K/V + self K/V) |")
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for name, row in report["rows"].items():
        if "skipped" in row:
            lines.append(f"| {ROWS.get(name, name)} | {row['skipped']} |" + " |" * len(cols))
            continue
        cells = ["n/a" if row[c] is None else (f"{row[c]:.2%}" if c in ("wer", "cer") else f"{row[c]:g}")
                 for c in cols]
        lines.append(f"| {ROWS.get(name, name)} | " + " | ".join(cells) + f" | {_bytes_cell(row.get('bytes_per_token'))} |")
    lines += [f"\n{ROWS.get(name, name)}, two-stage projection: {row['shortlist_steps']} steps on a shortlist, "
              f"{row['shortlist_rollbacks']} taken again from the full row" for name, row in report["rows"].items()
              if "shortlist_steps" in row]
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
    lines += _load_table(report.get("load", {}))
    if "cpu_weight" in report:
        lines.append("\ncpu cgroup weights: " + ", ".join(f"{who} {w}" for who, w in report["cpu_weight"].items()))
    return "\n".join(lines)


def _bytes_cell(b: dict | None) -> str:
    """What a row's decoder step reads per token: total (weights + cross K/V + self K/V), MB."""
    if not b:
        return "n/a"
    return f"{b['total_mb']:g} ({b['weights_mb']:g} + {b['cross_kv_mb']:g} + {b['self_kv_mb']:g})"


def _load_table(loads: dict) -> list[str]:
    """Per load: both engines' medians, their slowdowns against the first load, the ratio."""
    if not loads:
        return []
    if "skipped" in loads:
        return [f"\nunder load: {loads['skipped']}"]
    lines = ["", "| load | ours ms (median) | slowdown | faster-whisper ms (median) | slowdown | ratio of medians "
             "| median of ratios |", "|---|---|---|---|---|---|---|"]
    for name, s in loads.items():
        lines.append(f"| {name} | {s['ours_ms_median']:g} | {s['ours_slowdown']:g}× | {s['faster_whisper_ms_median']:g} "
                     f"| {s['faster_whisper_slowdown']:g}× | {s['ratio_of_medians']:g}× | {s['ratio_median']:g}× |")
    return lines


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
    from edgeasr.lab.evaluation.bench_report import run
    from edgeasr.lab.evaluation.bench_rows import run_row, serve_row

    if args.row and args.serve:
        serve_row(args)
        return 0
    if args.row:
        print(json.dumps(run_row(args)))
        return 0
    report = run(args)
    from edgeasr.lab.commands import publish

    publish(report, markdown(report), args.out)
    if args.plot:
        plot(report, args.plot)
    return 0
