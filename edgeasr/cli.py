"""`edgeasr` command line: the daemon (no sub-command) and the tools around it.

This is the one supervision point for user errors: anything derived from
`EdgeAsrError` becomes one line on stderr and that error's exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from edgeasr import __version__
from edgeasr.commands import common
from edgeasr.errors import EdgeAsrError

# Each module exposes `register(subparsers)`, which adds its sub-command(s) and sets
# `func=handler(args) -> int` on them. Heavy imports stay inside the handlers.
COMMAND_MODULES = (
    "edgeasr.commands.transcribe",
    "edgeasr.commands.bench",
    "edgeasr.commands.models",
    "edgeasr.commands.check",
    "edgeasr.commands.devices",
    "edgeasr.commands.bench_wyoming",
    "edgeasr.commands.bench_decoder",
    "edgeasr.commands.bench_streams",
    "edgeasr.commands.bench_commands",
    "edgeasr.commands.bench_assist",
    "edgeasr.commands.selftest",
    "edgeasr.commands.addon",
)


def build_parser() -> argparse.ArgumentParser:
    from edgeasr.commands import run

    parser = argparse.ArgumentParser(
        prog="edgeasr",
        description="On-device speech-to-text: microphone -> VAD -> Whisper -> MQTT. "
        "Without a sub-command, runs the daemon.",
    )
    parser.add_argument("--version", action="version", version=f"edgeasr {__version__}")
    common.add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for sub in subparsers.choices.values():
        common.add_arguments(sub, after_command=True)
    parser.set_defaults(func=run.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = common.merge(parser.parse_args(argv))
    if args.command is not None:  # the daemon sets up its own logging from the config
        logging.basicConfig(level=args.log_level or "INFO", stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except EdgeAsrError as exc:
        print(f"edgeasr: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
