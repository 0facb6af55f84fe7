"""The lab's commands in a checkout: one command away (`edgeasr bench`, `edgeasr models
calibrate`, ... read by the lab's own parsers), every one of them known by name to the product's
command line (which answers for them when the lab is not installed: tests/test_install.py), and
never imported by the daemon's command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from edgeasr import cli
from edgeasr.commands import developer_tools
from edgeasr.lab import commands as lab_commands

REPO = Path(__file__).resolve().parents[1]


def test_the_command_line_names_every_lab_command():
    parser = argparse.ArgumentParser(prog="edgeasr")
    commands = parser.add_subparsers()
    models = commands.add_parser("models").add_subparsers()
    lab_commands.register(commands, models)
    assert set(commands.choices) - {"models"} == set(developer_tools.COMMANDS)
    assert set(models.choices) == set(developer_tools.MODELS_ACTIONS)


def test_a_lab_command_is_read_by_the_labs_parser():
    from edgeasr.lab.commands import bench
    from edgeasr.lab.commands import models as lab_models

    args = cli.parse(["--set", "a=1", "bench", "--dataset", "set", "--rows", "10s-int8", "--set", "b=2"])
    assert args.func is bench.main
    assert (args.set_dirs, args.rows, args.set) == ([Path("set")], "10s-int8", ["a=1", "b=2"])
    args = cli.parse(["models", "calibrate", "bundle", "--dataset", "set", "--dry-run"])
    assert args.func.__module__ == lab_models.__name__
    assert (args.bundle, args.dataset, args.dry_run) == (Path("bundle"), [Path("set")], True)


@pytest.mark.parametrize(("argv", "error"), [
    (["bench"], "edgeasr bench: error: the following arguments are required: --dataset"),
    (["bench", "--dataset", "set", "--bogus"], "edgeasr: error: unrecognized arguments: --bogus"),
    (["models", "calibrate"], "edgeasr models calibrate: error: the following arguments are required: BUNDLE, --dataset"),
])
def test_a_lab_command_with_bad_arguments_is_refused_by_its_parser(argv, error, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parse(argv)
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == error


def test_the_daemon_and_the_products_commands_never_import_the_lab():
    code = """
import sys
from edgeasr import cli
for argv in ([], ["--input", "a.wav"], ["check"], ["transcribe", "a.wav"], ["models", "import", "src", "--out", "b"]):
    cli.parse(argv)
import edgeasr.commands.run, edgeasr.daemon
print(" ".join(sorted(m for m in sys.modules if m.startswith("edgeasr.lab"))))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
