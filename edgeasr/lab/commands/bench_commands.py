"""`edgeasr bench-commands --dataset DIR --home FILE`: spoken commands, heard with and without
the home's names, judged by Home Assistant's own matcher (evaluation/voice_commands.py); one
table per measure."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeasr.asr.commands.vocabulary import MEANS
from edgeasr.config import DecoderConfig
from edgeasr.lab.evaluation.command_split import PARTS
from edgeasr.lab.evaluation.voice_commands import DEFAULT_ROWS, MEANS_ROW, ROWS, row_title


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-commands", help="sentence and intent accuracy of spoken commands, with and "
                              "without the home's names, against faster-whisper")
    p.add_argument("--dataset", dest="set_dirs", type=Path, action="append", required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, duration_s, reference; optionally group and "
                   "intent); repeat it for several sets")
    p.add_argument("--home", dest="homes", type=Path, action="append", default=[], metavar="FILE",
                   help="the home file the set speaks of: once for every set, or once per --dataset in "
                   "their order (default: the set's own home.yaml, which models command-set writes)")
    p.add_argument("--split", type=Path, default=None, metavar="FILE",
                   help="the clips' parts (id, language, part: choose or report; lab/evaluation/command_split.py): "
                   "each group is reported per part")
    p.add_argument("--part", choices=PARTS, default=None,
                   help="with --split: only the clips of this part (choose values on one, report on both)")
    p.add_argument("--model", type=Path, default=None, help="bundle (default: the embedded default)")
    p.add_argument("--threads", type=int, default=DecoderConfig().threads, help="onnxruntime threads of every row")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma-separated rows to run, of {', '.join(ROWS)} (also {MEANS_ROW}MEANS, MEANS one or more of "
                   f"{'+'.join(MEANS)} joined by '+': the vocabulary heard by those means only)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.set_defaults(func=main)


def markdown(report: dict) -> str:
    """One table per measure: the groups down, the rows across."""
    rows = report["rows"]
    names = list(rows)
    groups = list(next(iter(rows.values())))
    measures = (("sentence accuracy", lambda g: f"{g['sentence_accuracy']:.0%}"),
                ("intent accuracy (Home Assistant's matcher, strict)", lambda g: f"{g['intent_accuracy']:.0%}"),
                ("wrong actions (another command than the one said, or one where none was)",
                 lambda g: str(g["wrong_actions"])),
                ("not a command, turned into one", lambda g: f"{g['not_commands_as_command']} of {g['not_commands']}"),
                ("empty transcripts", lambda g: str(g["empty"])),
                ("latency median, ms", lambda g: f"{g['latency_ms_median']:g}"))
    lines = [f"{report['model']}, {report['utterances']} utterances, {report['machine']}, "
             f"{report['threads']} threads, {report['date']}"]
    for title, cell in measures:
        lines += ["", f"**{title}**", "", "| group | n | " + " | ".join(row_title(n) for n in names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for g in groups:
            lines.append(f"| {g} | {rows[names[0]][g]['utterances']} | "
                         + " | ".join(cell(rows[n][g]) for n in names) + " |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from edgeasr.lab.commands import publish
    from edgeasr.lab.evaluation.voice_commands import run

    report = run(args)
    publish(report, markdown(report), args.out)
    return 0
