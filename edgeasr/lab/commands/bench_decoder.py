"""`edgeasr bench-decoder --dataset DIR`: greedy against the beam, the cost of word timestamps and
the two-stage projection (evaluation/decoder_variants.py), one row per variant."""

from __future__ import annotations

import json
from pathlib import Path

from edgeasr.config import DecoderConfig
from edgeasr.lab.evaluation.load import LOADS


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-decoder", help="greedy vs beam sizes, and word timestamps' cost, interleaved")
    p.add_argument("--dataset", dest="set_dir", type=Path, required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, duration_s, reference)")
    p.add_argument("--model", type=Path, default=None, help="bundle (imported --with beam for beams)")
    p.add_argument("--beams", default="2,3,5", help="comma-separated beam sizes (empty: none)")
    p.add_argument("--shortlist", action="store_true",
                   help="also greedy on the two-stage projection (a bundle imported --with shortlist)")
    p.add_argument("--load", default="idle", metavar="LOAD",
                   help=f"run beside this load's neighbours ({', '.join(LOADS)})")
    p.add_argument("--threads", type=int, default=DecoderConfig().threads)
    p.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.set_defaults(func=main)


def main(args) -> int:
    from edgeasr.lab.evaluation.decoder_variants import run

    report = run(args)
    print(f"{report['utterances']} utterances, interleaved; ratio: median of per-utterance decoder ms per window / greedy's")
    print(f"{'variant':17} {'WER':>7} {'CER':>7} {'dec ms/win':>11} {'ratio':>6} {'words ms/win':>13} "
          f"{'dec ms/token':>12} {'token ratio':>11} {'texts not greedy':>16}")
    for name, row in report["rows"].items():
        print(f"{name:17} {row['wer']:7.2%} {row['cer']:7.2%} {row['decoder_ms_per_window']:11.1f} "
              f"{row['decoder_ratio']:6.2f} {row['words_ms_per_window']:13.1f} {row['decoder_ms_per_token']:12.3f} "
              f"{row['token_ratio']:11.3f} {row['texts_unlike_greedy']:16d}")
    if "shortlist" in report:
        counts = report["shortlist"]
        print(f"two-stage projection: {counts['steps']} steps on a shortlist in {counts['windows']} windows, "
              f"{counts['rollbacks']} taken again from the full row ({counts['redone']} picks redone)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0
