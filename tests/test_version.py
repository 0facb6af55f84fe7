"""The version is defined once, in pyproject.toml, and everything that names it agrees: the
installed package, `edgeasr --version`, CHANGELOG.md, debian/changelog and build-deb.sh."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import edgeasr

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]


def test_pyproject_defines_it_statically():
    assert "version" not in PROJECT.get("dynamic", [])
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


def test_the_installed_package_and_the_command_line_report_it():
    installed = importlib.metadata.version("edgeasr")
    assert installed == VERSION, f"installed metadata says {installed}: pip install -e . again"
    assert edgeasr.__version__ == VERSION
    run = subprocess.run([sys.executable, "-m", "edgeasr", "--version"], capture_output=True, text=True,
                         cwd=REPO)
    assert (run.returncode, run.stdout.strip()) == (0, f"edgeasr {VERSION}")


def test_the_changelog_names_it_as_the_latest_release():
    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(.+?)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert releases[0] == ("Unreleased", ""), "Keep a Changelog: [Unreleased] comes first"
    assert releases[1][0] == VERSION and releases[1][1], releases[1]
    assert releases[-1][0] == "0.1.0" and all(date for _, date in releases[1:])


def test_the_debian_package_is_built_at_it():
    top = (REPO / "packaging" / "debian" / "changelog").read_text().splitlines()[0]
    assert top.startswith(f"edgeasr ({VERSION}) ")
    run = subprocess.run(["bash", "packaging/build-deb.sh", "--print-version"], capture_output=True, text=True,
                         cwd=REPO)
    assert (run.returncode, run.stdout.strip()) == (0, VERSION), run.stderr
