"""The options every command shares: which configuration, and overrides of its keys.

`--config`, `--set`, `--input` and `--log-level` may stand before the command or after it
(`edgeasr --config F check` and `edgeasr check --config F` are the same). Each is a way to
set config keys, so the config dataclasses stay the one declaration of every setting.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edgeasr.config import LOG_LEVELS, Config, load_config
from edgeasr.errors import UsageError

# given after the command, an option lands in "sub_<dest>" and is merged with the one before it
_SUB = "sub_"


def add_arguments(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """The shared options; `after_command` for a sub-command's parser (nothing by default, so
    a value given before the command is kept)."""
    prefix = _SUB if after_command else ""
    blank: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    parser.add_argument("--config", type=Path, dest=prefix + "config", metavar="FILE",
                        help="YAML configuration (default: built-in defaults)",
                        **(blank or {"default": None}))
    parser.add_argument("--set", action="append", dest=prefix + "set", metavar="KEY=VALUE",
                        help="override a config key, e.g. --set vad.aggressiveness=3 (repeatable)",
                        **(blank or {"default": []}))
    parser.add_argument("--input", dest=prefix + "input", metavar="FILE",
                        help="audio file instead of the microphone ('-': raw s16le 16 kHz on stdin); "
                        "the same as --set input.source=file --set input.path=FILE",
                        **(blank or {"default": None}))
    parser.add_argument("--log-level", dest=prefix + "log_level",
                        choices=LOG_LEVELS,
                        help="the same as --set log.level=LEVEL", **(blank or {"default": None}))


def merge(args: argparse.Namespace) -> argparse.Namespace:
    """Fold the options given after the command into those given before it."""
    for name in ("config", "input", "log_level"):
        value = getattr(args, _SUB + name, None)
        if value is not None:
            setattr(args, name, value)
    args.set = list(args.set) + list(getattr(args, _SUB + "set", []))
    return args


def overrides(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted config keys from the command line: --input, --log-level, then --set (last wins)."""
    import yaml

    out: dict[str, Any] = dict(extra or {})
    if args.input == "-":
        out["input.source"] = "stdin"
    elif args.input:
        out.update({"input.source": "file", "input.path": args.input})
    if args.log_level:
        out["log.level"] = args.log_level
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def load(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Config:
    """The configuration the command line asks for; `extra` are the command's own keys."""
    return load_config(args.config, overrides(args, extra))
