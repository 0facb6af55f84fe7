"""Fixtures for the Hailo tests: the HailoRT stand-in on sys.path, and writable bundle copies.

`standin` puts tests/hailo_standin first on sys.path for one test, points its device locks and
its control file (faults injected while running: `standin.control(...)`) at the test's
tmp_path, and forgets every hailo_platform module afterwards (and whenever the simulated
HailoRT version changes), so the next import sees the environment afresh.
`FakeTime` is a clock for SupervisedEncoder's backoff that moves only when slept on.
`hailo_bundle` is the session's tiny.en bundle as a private directory: symlinks to its graphs,
its own manifest.json (compile-hef and the stand-in HEF writer edit it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STANDIN_DIR = Path(__file__).resolve().parents[1] / "hailo_standin"
ENV_KNOBS = (
    "HAILO_STANDIN_DEVICES",
    "HAILO_STANDIN_LOCK_DIR",
    "HAILO_STANDIN_SERVICE",
    "HAILO_STANDIN_LATENCY_MS",
    "HAILO_STANDIN_DRIVER_VERSION",
    "HAILO_STANDIN_VERSION",
    "HAILO_STANDIN_LIB_VERSION",
    "HAILO_STANDIN_CONTROL",
)
STANDIN_MODULES = ("standin_hef", "standin_control")


def forget_standin() -> None:
    for name in [
        m
        for m in sys.modules
        if m == "hailo_platform" or m.startswith("hailo_platform.") or m in STANDIN_MODULES
    ]:
        del sys.modules[name]


class Standin:
    """The simulated system; set() changes it (takes effect at the next hailo_platform import)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, lock_dir: Path, control_file: Path) -> None:
        self.monkeypatch, self.lock_dir, self.control_file = monkeypatch, lock_dir, control_file

    def set(self, **knobs: str | None) -> None:
        for key, value in knobs.items():
            name = f"HAILO_STANDIN_{key.upper()}"
            assert name in ENV_KNOBS, name
            if value is None:
                self.monkeypatch.delenv(name, raising=False)
            else:
                self.monkeypatch.setenv(name, value)
        forget_standin()

    def control(self, **settings: object) -> None:
        """Change the running chip (every process sharing this stand-in sees it at its next
        scan, open or inference): latency_ms, for_frames, lost; nothing = healthy."""
        from standin_control import write_control

        write_control(self.control_file, **settings)

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that shares this simulated system."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(STANDIN_DIR)
        return env

    def write_hef(self, bundle: Path, **kwargs) -> Path:
        from standin_hef import write_standin_hef

        return write_standin_hef(bundle, **kwargs)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Standin]:
    for name in ENV_KNOBS:
        monkeypatch.delenv(name, raising=False)
    lock_dir = tmp_path / "hailo-locks"
    monkeypatch.setenv("HAILO_STANDIN_LOCK_DIR", str(lock_dir))
    control_file = tmp_path / "hailo-control.json"
    monkeypatch.setenv("HAILO_STANDIN_CONTROL", str(control_file))
    monkeypatch.setenv("HAILO_STANDIN_DEVICES", "hailo8")
    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    forget_standin()
    yield Standin(monkeypatch, lock_dir, control_file)
    forget_standin()


@pytest.fixture
def hailo_bundle(tiny_bundle: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny.en bundle (graphs symlinked, manifest copied)."""
    out = tmp_path / "bundle"
    out.mkdir()
    for f in Path(tiny_bundle).iterdir():
        if f.name == "manifest.json":
            shutil.copyfile(f, out / f.name)
        elif f.is_file():
            (out / f.name).symlink_to(f.resolve())
    return out


class FakeTime:
    """A clock that only moves when slept on; hooks run after the n-th sleep (1-based)."""

    def __init__(self) -> None:
        self.now, self.sleeps, self.hooks = 0.0, [], {}

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        hook = self.hooks.get(len(self.sleeps))
        if hook is not None:
            hook()
