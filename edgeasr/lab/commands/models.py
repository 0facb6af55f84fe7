"""The lab's actions of `edgeasr models`: the decoding calibrated and the text rules ablated on
labelled sets, spoken command sets made, the two-stage projection's first pass fitted
(fit-shortlist), and the Hailo compiler's steps (lint-hailo, calib, compile-hef). The product's own actions (import, weights) are in edgeasr/commands/models.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgeasr.config import DecoderConfig
from edgeasr.lab.hailo import ARCHES


def register(sub) -> None:
    """Add the lab's actions to `edgeasr models`' (`sub`)."""
    calibrate = sub.add_parser("calibrate", help="measure the decoding settings for a bundle's weights on "
                               "a labelled set and store them in its manifest")
    _bundle_and_sets(calibrate, "a directory with manifest.tsv (id, file, duration_s, reference, and optionally "
                     "speaker)")
    calibrate.add_argument("--language", default=None,
                           help="the sets' language (multilingual bundles; default: English)")
    calibrate.add_argument("--threads", type=int, default=DecoderConfig().threads)
    calibrate.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    calibrate.set_defaults(func=_calibrate)

    ablate = sub.add_parser("ablate", help="count the real and the made-up words each text-removing rule "
                            "removes on labelled sets")
    ablate.add_argument("--model", type=Path, default=None, metavar="BUNDLE",
                        help="the bundle (default: the embedded default); the engine is built from the "
                        "configuration (--config, --set) with the CPU encoder")
    ablate.add_argument("--dataset", type=Path, action="append", required=True, metavar="DIR",
                        help="a directory with manifest.tsv; repeat it to pool several sets")
    ablate.set_defaults(func=_ablate)

    lint = sub.add_parser("lint-hailo", help="check an encoder against the Hailo DFC's ONNX parser")
    lint.add_argument("target", type=Path, metavar="BUNDLE", help="a bundle directory or an .onnx file")
    lint.set_defaults(func=_lint)

    cal = sub.add_parser("calib", help="calibration set (NHWC mel frames of real speech) for the DFC")
    cal.add_argument("--audio", type=Path, required=True, metavar="DIR")
    cal.add_argument("--count", type=int, required=True, metavar="N")
    cal.add_argument("--out", type=Path, required=True, metavar="FILE")
    cal.add_argument("--model", type=Path, default=None, metavar="BUNDLE",
                     help="bundle whose window and mel bins to use (default: the embedded default)")
    cal.set_defaults(func=_calib)

    hef = sub.add_parser("compile-hef", help="parse, optimize and compile the encoder with the Hailo DFC")
    hef.add_argument("bundle", type=Path, metavar="BUNDLE")
    hef.add_argument("--arch", choices=ARCHES, required=True)
    hef.add_argument("--calib", type=Path, default=None, metavar="FILE")
    hef.add_argument("--out", type=Path, default=None, metavar="HEF")
    hef.add_argument("--dry-run", action="store_true", help="print the exact commands only")
    hef.set_defaults(func=_compile_hef)

    cs = sub.add_parser("command-set", help="spoken commands from Home Assistant's sentences with a home's names "
                        "(piper and espeak-ng voices, clean and noisy), for `edgeasr bench-commands`")
    cs.add_argument("--home", type=Path, required=True, metavar="FILE", help="the home file (areas, floors, entities)")
    cs.add_argument("--out", type=Path, required=True, metavar="DIR")
    cs.add_argument("--count", type=int, default=150, metavar="N", help="utterances in all (default: 150)")
    cs.add_argument("--seed", type=int, default=0, metavar="S", help="the same seed gives the same set")
    cs.add_argument("--noise-dir", type=Path, default=None, metavar="DIR",
                    help="the dev set's longform/ (its noisy stream minus the clean one is the noise)")
    cs.add_argument("--everyday", action="store_true",
                    help="only commands as people most often say them, by piper, clean (English)")
    cs.set_defaults(func=_command_set)

    fit = sub.add_parser("fit-shortlist", help="fit the two-stage projection's first pass of a bundle imported "
                         "--with shortlist on real decodes of labelled speech, in every language it is to serve")
    _bundle_and_sets(fit, "a directory with manifest.tsv (id, file, and optionally language), or such a .tsv")
    fit.add_argument("--threads", type=int, default=DecoderConfig().threads)
    fit.add_argument("--known", action="store_true", help="also keep the basis for these weights in "
                     "edgeasr/models/shortlist/ (what `edgeasr models import` gives them)")
    fit.set_defaults(func=_fit_shortlist)


def _bundle_and_sets(parser, what: str) -> None:
    """The BUNDLE an action works on and the labelled sets it reads (`what`: one set's form)."""
    parser.add_argument("bundle", type=Path, metavar="BUNDLE")
    parser.add_argument("--dataset", type=Path, action="append", required=True, metavar="DIR",
                        help=f"{what}; repeat it to pool several sets")


def _calibrate(args: argparse.Namespace) -> int:
    from edgeasr.bundle import load_bundle
    from edgeasr.lab.evaluation.calibration import calibrate
    from edgeasr.lab.evaluation.scoring import read_pool
    from edgeasr.models.known_decoding import write_decoding

    bundle = load_bundle(args.bundle)
    pool = read_pool(args.dataset, bundle.audio.sample_rate)
    decoding = calibrate(bundle, pool, args.threads, args.dataset, args.language)
    print(json.dumps(decoding, indent=2))
    if not args.dry_run:
        write_decoding(args.bundle, decoding)
    return 0


def _ablate(args: argparse.Namespace) -> int:
    from edgeasr.commands.common import load
    from edgeasr.lab.evaluation.ablation import run

    keys = {"encoder.backend": "onnx", **({"model.path": args.model} if args.model else {})}
    print(run(load(args, keys), args.dataset))
    return 0


def _lint(args: argparse.Namespace) -> int:
    from edgeasr.bundle import load_bundle
    from edgeasr.lab.hailo.lint import lint

    path = args.target
    if path.is_dir():
        path = load_bundle(path).path("encoder")
    violations = lint(path)
    for v in violations:
        print(v)
    print(f"{path}: {len(violations)} violation(s)")
    return 1 if violations else 0


def _calib(args: argparse.Namespace) -> int:
    from edgeasr.commands.common import load
    from edgeasr.lab.hailo.calibration_set import build_calibration_set
    from edgeasr.models.default import open_bundle

    bundle = open_bundle(load(args, {"model.path": args.model} if args.model else {}))
    out = build_calibration_set(args.audio, args.count, args.out, bundle.audio)
    print(out)
    return 0


def _compile_hef(args: argparse.Namespace) -> int:
    from edgeasr.lab.hailo.compile_hef import compile_hef

    for command in compile_hef(args.bundle, args.arch, args.calib, args.out, args.dry_run):
        if args.dry_run:
            print(command)
    return 0


def _fit_shortlist(args: argparse.Namespace) -> int:
    from edgeasr.lab.evaluation.shortlist_fit import fit

    print(json.dumps(fit(args.bundle, args.dataset, args.threads, args.known), indent=2))
    return 0


def _command_set(args: argparse.Namespace) -> int:
    from edgeasr.lab.evaluation.command_set import NOISE_DIR, write_set

    rows = write_set(args.home, args.out, args.count, args.seed, args.noise_dir or NOISE_DIR, args.everyday)
    print(f"{len(rows)} utterances in {args.out / 'manifest.tsv'}")
    return 0
