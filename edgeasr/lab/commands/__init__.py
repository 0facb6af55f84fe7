"""The lab's sub-commands: the benches (`edgeasr bench`, `bench-*`), and its actions of `edgeasr
models` (models.py). edgeasr/cli.py registers them when one of them is asked for in a checkout;
until then the command line knows them by name only (edgeasr/commands/developer_tools.py)."""

from __future__ import annotations

import importlib

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
