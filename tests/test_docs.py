"""The README cannot drift from the config file, the CLI or .ci/run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_config_reference_is_the_config_file():
    block = re.search(r"<!-- config-reference -->\n```yaml\n(.*?)```\n<!-- /config-reference -->", README, re.S)
    assert block, "README lost its config reference block"
    assert block.group(1) == (REPO / "config" / "edgeasr.yaml").read_text()


def test_ci_runs_the_readme_test_command():
    marker = README.index("<!-- test-command -->")
    command = re.search(r"```bash\n(.+?)\n```", README[marker:]).group(1)
    ci = subprocess.run(["bash", ".ci/run", "--print-command"], capture_output=True, text=True, cwd=REPO)
    assert ci.returncode == 0 and ci.stdout.strip() == command


def test_first_command_uses_real_cli_options():
    first = re.search(r"```bash\n(bash packaging/setup-dev.sh && .+?)\n```", README).group(1)
    args = first.split("&& ", 1)[1].split()
    assert args[0] == ".venv/bin/edgeasr" and "--input" in args
    help_text = subprocess.run([sys.executable, "-m", "edgeasr", "--help"], capture_output=True,
                               text=True, cwd=REPO).stdout
    assert "--input" in help_text and "--config" in help_text
