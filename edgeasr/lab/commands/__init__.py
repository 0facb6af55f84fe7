"""The lab's sub-commands: the benches (`edgeasr bench`, `bench-*`), and its actions of `edgeasr
models` (models.py). edgeasr/cli.py registers them when one of them is asked for in a checkout;
until then the command line knows them by name only (edgeasr/commands/developer_tools.py)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from edgeasr.lab.commands import models

# Each module exposes `register(subparsers)`, as edgeasr/commands/ does.
COMMAND_MODULES = (
    "edgeasr.lab.commands.bench",
    "edgeasr.lab.commands.bench_wyoming",
    "edgeasr.lab.commands.bench_decoder",
    "edgeasr.lab.commands.bench_streams",
    "edgeasr.lab.commands.bench_commands",
    "edgeasr.lab.commands.bench_assist",
)


def register(subparsers, models_actions) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    models.register(models_actions)


def publish(report: dict, text: str, out: Path | None) -> None:
    """A bench's report: its table on stdout, the whole report as JSON in `out` when asked."""
    print(text)
    if out:
        out.write_text(json.dumps(report, indent=2) + "\n")
