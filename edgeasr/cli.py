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
    "edgeasr.commands.check",
    "edgeasr.commands.devices",
    "edgeasr.commands.selftest",
    "edgeasr.commands.addon",
)


def build_parser(lab: bool = False) -> argparse.ArgumentParser:
    """The command line. The lab's sub-commands (the benches, some `edgeasr models` actions) are
    there by name only (developer_tools.py); with `lab`, the lab's own parsers take their place."""
    from edgeasr.commands import developer_tools, models, run

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
    models_actions = models.register(subparsers)
    if lab:
        from edgeasr.lab.commands import register

        register(subparsers, models_actions)
    else:
        developer_tools.register(subparsers, models_actions)
    for sub in subparsers.choices.values():
        common.add_arguments(sub, after_command=True)
    parser.set_defaults(func=run.main)
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, read without the lab unless a lab command is asked for in a checkout: the
    daemon and the product's commands never import it."""
    from edgeasr.commands.developer_tools import LabCommand, lab_installed

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if isinstance(args.func, LabCommand):
        if lab_installed():
            args = build_parser(lab=True).parse_args(argv)
        # else its handler says where the tool is, whatever the arguments
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return common.merge(args)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
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
