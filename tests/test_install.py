"""What pip installs from this tree. The wheel (packaging/wheelhouse.sh builds the same for the
.deb and the Home Assistant add-on's image) holds the product's modules and no lab module
(edgeasr/lab/); installed alone in a virtualenv, the daemon runs from it and a lab command
answers with the one line that says where it is. A developer's editable install (`pip install
-e`, as packaging/setup-dev.sh does) has the lab."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers.import_graph import MODULES, RUNTIME, part, reached

REPO = Path(__file__).resolve().parents[1]
WHERE = "is a developer tool: run it from a checkout, `pip install -e '.[bench]'`"


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, **kwargs)


def copy_tree(dest: Path) -> Path:
    """What pip builds from, copied as wheelhouse.sh copies it, so that build/ and *.egg-info stay
    out of the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest)
    shutil.copytree(REPO / "edgeasr", dest / "edgeasr", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def virtualenv(venv: Path, *install: str) -> Path:
    """A virtualenv with `pip install --no-deps *install` in it; its dependencies are this
    environment's, named by a .pth file written after the install (so pip sees no other edgeasr).
    Returns its `edgeasr` script."""
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", *install])
    assert installed.returncode == 0, installed.stderr
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return venv / "bin" / "edgeasr"


def edgeasr(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """An installed `edgeasr`, away from the checkout (no PYTHONPATH, another directory)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run([str(script), *args], cwd=cwd, env=env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = copy_tree(tmp_path_factory.mktemp("wheel-source") / "edgeasr")
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)])
    assert built.returncode == 0, built.stderr
    [path] = out.glob("edgeasr-*.whl")
    return path


@pytest.fixture(scope="module")
def product(wheel, tmp_path_factory) -> Path:
    """`edgeasr` as the wheel installs it, alone."""
    return virtualenv(tmp_path_factory.mktemp("product") / "venv", "--no-index", str(wheel))


def test_the_wheel_ships_the_product_and_no_lab_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("edgeasr/lab/")]
    shipped = {".".join(Path(n).with_suffix("").parts).removesuffix(".__init__")
               for n in names if n.startswith("edgeasr/") and n.endswith(".py")}
    runtime = {m for name in RUNTIME for m in {name, *reached(name)}}
    assert not runtime - shipped, f"the runtime imports {sorted(runtime - shipped)}, not in the wheel"
    assert shipped == {n for n in MODULES if part(n) != "lab"}  # the lab left out, and nothing else
    # the package's data: known weights' calibrations and tail maps, the tail fit's prose
    data = {str(p.relative_to(REPO)) for p in (REPO / "edgeasr" / "models").glob("tail_maps/*.npz")}
    assert data and data | {"edgeasr/models/known.json", "edgeasr/models/tail_speech.txt"} <= set(names)


@pytest.mark.parametrize("argv", [
    ("bench", "--dataset", "set", "--rows", "10s-int8"),
    ("bench-assist", "--help"),
    ("models", "calibrate", "bundle", "--dataset", "set"),
    ("models", "compile-hef", "bundle", "--arch", "hailo8", "--dry-run"),
])
def test_a_lab_command_of_the_installed_product_says_where_it_is(product, argv, tmp_path):
    proc = edgeasr(product, *argv, cwd=tmp_path)
    command = " ".join(argv[:2] if argv[0] == "models" else argv[:1])
    assert (proc.returncode, proc.stdout) == (127, "")
    assert proc.stderr.splitlines() == [f"edgeasr: `edgeasr {command}` {WHERE}"]


def test_the_installed_product_runs_the_daemon_without_the_lab(product, tiny_bundle, dev_dir, tmp_path):
    from edgeasr import __version__

    assert edgeasr(product, "--version", cwd=tmp_path).stdout.strip() == f"edgeasr {__version__}"
    proc = edgeasr(product, "--input", str(dev_dir / "audio" / "alsa_front-center.wav"),
                   "--set", f"model.path={tiny_bundle}", "--set", f"state_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [message] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert message["text"] == "Front Center."


def test_an_editable_install_has_the_lab(tmp_path):
    """setuptools' editable finder maps the whole edgeasr directory, the lab's too."""
    script = virtualenv(tmp_path / "venv", "--editable", str(copy_tree(tmp_path / "edgeasr")))
    bench = edgeasr(script, "bench", "--help", cwd=tmp_path)
    calibrate = edgeasr(script, "models", "calibrate", "--help", cwd=tmp_path)
    assert bench.returncode == 0 and bench.stdout.startswith("usage: edgeasr bench "), bench.stderr
    assert calibrate.returncode == 0 and calibrate.stdout.startswith("usage: edgeasr models calibrate "), calibrate.stderr
