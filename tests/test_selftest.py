"""`edgeasr self-test`: what the daemon runs is imported in a child interpreter, so a package that
is missing, raises or crashes the process is named in one line with exit 70; the weights are
checked against their RECORD; the graphs are opened with onnxruntime."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from base64 import urlsafe_b64encode
from hashlib import sha256
from pathlib import Path

import pytest

from edgeasr.commands.selftest import RUNTIME_MODULES, check_graphs, check_imports, check_weights
from edgeasr.errors import PackageLoadError

REPO = Path(__file__).resolve().parents[1]


def child_env(*paths: Path) -> dict[str, str]:
    """Our environment, with `paths` where the child looks for modules first."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])}


def test_a_missing_module_is_named_with_exit_70():
    with pytest.raises(PackageLoadError) as caught:
        check_imports(["json", "edgeasr_no_such_module"])
    assert caught.value.exit_code == 70
    assert str(caught.value) == ("self-test: cannot load edgeasr_no_such_module (import edgeasr_no_such_module: "
                                 "ModuleNotFoundError: No module named 'edgeasr_no_such_module')")


def test_a_module_that_crashes_the_interpreter_is_named_with_its_signal(tmp_path):
    (tmp_path / "crashes_on_import.py").write_text("import ctypes\nctypes.string_at(0)\n")  # reads address 0
    with pytest.raises(PackageLoadError, match=r"cannot load crashes_on_import \(import crashes_on_import: "
                                               r"crashed with SIGSEGV\)$"):
        check_imports(["json", "crashes_on_import", "yaml"], env=child_env(tmp_path))


def test_a_module_that_raises_is_named_with_its_error_and_the_others_still_load(tmp_path):
    (tmp_path / "broken_extension.py").write_text("raise ImportError('libfoo.so.1: cannot open shared object file')\n")
    with pytest.raises(PackageLoadError) as caught:
        check_imports(["broken_extension", "json"], env=child_env(tmp_path))
    assert str(caught.value) == ("self-test: cannot load broken_extension (import broken_extension: ImportError: "
                                 "libfoo.so.1: cannot open shared object file)")


def test_imports_name_each_package_with_its_version():
    report = check_imports(["numpy", "yaml", "webrtcvad"])
    assert report.startswith("ok (3 modules: ")
    for dist in ("numpy", "PyYAML", "webrtcvad-wheels"):
        assert f"{dist} {importlib.metadata.version(dist)}" in report


def test_runtime_modules_cover_every_distribution_edgeasr_requires():
    owners = importlib.metadata.packages_distributions()
    imported = {dist.lower() for module in RUNTIME_MODULES for dist in owners.get(module.split(".")[0], [])}
    required = {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower()
                for r in importlib.metadata.requires("edgeasr") or [] if "extra ==" not in r}
    assert required and required <= imported, required - imported


def fake_distribution(tmp_path: Path, content: bytes, recorded: bytes) -> importlib.metadata.Distribution:
    """A weights package whose one file holds `content` and whose RECORD has `recorded`'s sum."""
    (tmp_path / "weights_pkg").mkdir()
    (tmp_path / "weights_pkg" / "model.bin").write_bytes(content)
    info = tmp_path / "weights_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: weights-pkg\nVersion: 1.0\n")
    digest = urlsafe_b64encode(sha256(recorded).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"weights_pkg/model.bin,sha256={digest},{len(recorded)}\n"
                                 "weights_pkg-1.0.dist-info/RECORD,,\n")
    return importlib.metadata.PathDistribution(info)


def test_weights_are_checked_against_their_record(tmp_path):
    assert check_weights(fake_distribution(tmp_path, b"weights", b"weights")) == (
        "ok (weights-pkg 1.0: 1 files, 0.0 MB, sha256 as recorded)")


def test_corrupt_weights_are_named(tmp_path):
    with pytest.raises(PackageLoadError, match=r"cannot load weights-pkg 1\.0: .*model\.bin does not match its "
                                               r"sha256 in RECORD \(corrupt\)") as caught:
        check_weights(fake_distribution(tmp_path, b"weightz", b"weights"))
    assert caught.value.exit_code == 70


def test_without_a_bundle_a_graph_built_in_memory_runs():
    assert check_graphs(None).startswith("ok (no bundle prepared: a graph built in memory runs on onnxruntime ")


def test_a_bundles_graphs_are_opened(tiny_bundle):
    report = check_graphs(tiny_bundle)
    files = json.loads((tiny_bundle / "manifest.json").read_text())["files"].values()
    count = sum(1 for entry in files if entry["path"].endswith(".onnx"))
    assert report.startswith(f"ok ({count} graphs of {tiny_bundle} opened with onnxruntime ")


@pytest.mark.parametrize("form", [["-m", "edgeasr", "self-test"], ["-m", "edgeasr.commands.selftest"]])
def test_the_command_passes_here(form, tmp_path):
    """Both forms, on this environment, with nothing prepared in the state directory."""
    done = subprocess.run([sys.executable, *form], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "STATE_DIRECTORY": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["imports", "weights", "graphs"]
