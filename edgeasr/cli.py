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
from edgeasr.errors import EdgeAsrError

# Each module exposes `register(subparsers)`, which adds its sub-command(s) and sets
# `func=handler(args) -> int` on them. Heavy imports stay inside the handlers.
COMMAND_MODULES = (
    "edgeasr.transcribe",
    "edgeasr.bench",
    "edgeasr.models.commands",
    "edgeasr.check",
    "edgeasr.capture",
)

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    from edgeasr import daemon

    parser = argparse.ArgumentParser(
        prog="edgeasr",
        description="On-device speech-to-text: microphone -> VAD -> Whisper -> MQTT. "
        "Without a sub-command, runs the daemon.",
    )
    parser.add_argument("--version", action="version", version=f"edgeasr {__version__}")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: the config's log.level, else INFO)",
    )
    daemon.add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    parser.set_defaults(func=daemon.main)
    return parser


def setup_logging(level: str | None) -> None:
    logging.basicConfig(
        level=level or "INFO",
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None or not getattr(args, "manages_logging", False):
        setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except EdgeAsrError as exc:
        print(f"edgeasr: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
