"""The lab's sub-commands by name, for a command line that has not loaded the lab.

The lab (edgeasr/lab/: the benches, the evaluation behind `edgeasr models calibrate`, `ablate`
and `command-set`, the Hailo compiler's toolchain) is in a checkout's editable install, not in
the wheel or the .deb. The command line first knows its commands by name only (`register`), so
that the daemon and the product's commands never import it; edgeasr/cli.py loads the lab's own
parsers when one of these names is asked for and the lab is there. Without the lab, each name
answers with one line saying where the tool is (LabNotInstalledError, exit 127).
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass

from edgeasr.errors import LabNotInstalledError

LAB = "edgeasr.lab"
# edgeasr/lab/commands/ registers exactly these (tests/test_lab_commands.py)
COMMANDS = ("bench", "bench-wyoming", "bench-decoder", "bench-streams", "bench-commands", "bench-assist")
MODELS_ACTIONS = ("calibrate", "ablate", "lint-hailo", "calib", "compile-hef", "command-set", "fit-shortlist")


def lab_installed() -> bool:
    return importlib.util.find_spec(LAB) is not None


@dataclass(frozen=True)
class LabCommand:
    """The handler a lab command's name has until the lab's own parser replaces it."""

    command: str  # as typed: "edgeasr bench", "edgeasr models calibrate"

    def __call__(self, args: argparse.Namespace) -> int:
        raise LabNotInstalledError(f"`{self.command}` is a developer tool: run it from a checkout, "
                                   "`pip install -e '.[bench]'`")


def register(subparsers, models_actions) -> None:
    """Each lab command and `edgeasr models` action by name, taking any arguments (unread)."""
    for actions, prefix, names in ((subparsers, "edgeasr", COMMANDS),
                                   (models_actions, "edgeasr models", MODELS_ACTIONS)):
        for name in names:
            p = actions.add_parser(name, help="developer tool (the lab, in a checkout)", add_help=False)
            p.set_defaults(func=LabCommand(f"{prefix} {name}"))
