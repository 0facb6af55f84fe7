"""`edgeasr bench-streams --dataset DIR ...`: the microphone pipeline on long-form streams, clean
and noisy, for each speech detector and hangover (evaluation/pipeline_streams.py): the stream
WER per condition and setting."""

from __future__ import annotations

import argparse
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
    from edgeasr.lab.commands import publish
    from edgeasr.lab.evaluation.pipeline_streams import run

    report = run(args)
    publish(report, markdown(report), args.out)
    return 0


def markdown(report: dict) -> str:
    rows = list(next(iter(report["conditions"].values())))
    lines = ["| stream WER | " + " | ".join(report["conditions"]) + " |", "|---|" + "---|" * len(report["conditions"])]
    for row in rows:
        cells = [f"{c[row]:.2%}" for c in report["conditions"].values()]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
