"""Faults injected into the HailoRT stand-in while it runs: a control file.

HAILO_STANDIN_CONTROL names a JSON file that the stand-in reads afresh at every device scan,
device open and inference, so a test changes the simulated chip while code runs against it,
also in a child process (the daemon tests run `python -m edgeasr`). No file, or `{}`: a
healthy chip. Keys:

  latency_ms   time one frame takes on the chip (overrides HAILO_STANDIN_LATENCY_MS); longer
               than the caller's timeout, HailoRT raises HAILO_TIMEOUT and the late job
               finishes in the background, as on the chip
  for_frames   with latency_ms: only the next N frames are that slow; the stand-in counts
               down in the file (under flock, so several processes share one count)
  lost         true: the PCIe device has vanished. What HailoRT 4.23 does then (read in
               hailort and hailort-drivers v4.23.0): the driver deletes /dev/hailoN and the
               /sys/class/hailo_chardev entry, so Device.scan() lists nothing and a new VDevice
               fails with HAILO_OUT_OF_PHYSICAL_DEVICES (74, vdevice.cpp "not enough free
               devices"); every ioctl on a VDevice opened before answers ENODEV, which
               libhailort reports as HAILO_DRIVER_OPERATION_FAILED (36), pyhailort's
               HailoRTDriverOperationFailedException. Such a VDevice stays dead when the
               device comes back (a re-probed device is a new board): only a new VDevice works.

Writers replace the file atomically (`write_control`), so a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

ENV = "HAILO_STANDIN_CONTROL"
KEYS = {"latency_ms", "for_frames", "lost"}


def _path() -> Path | None:
    name = os.environ.get(ENV)
    return Path(name) if name else None


def write_control(path: Path, **settings: object) -> None:
    """Replace the control file with `settings` (none: a healthy chip)."""
    unknown = set(settings) - KEYS
    if unknown:
        raise ValueError(f"unknown stand-in control keys: {sorted(unknown)}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(settings))
    os.replace(tmp, path)


def read() -> dict:
    path = _path()
    if path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text() or "{}")
    if not isinstance(data, dict) or set(data) - KEYS:
        raise ValueError(f"{path}: a stand-in control file holds an object with keys {sorted(KEYS)}")
    return data


def device_lost() -> bool:
    return bool(read().get("lost"))


@contextmanager
def _locked(path: Path):
    with open(path.with_name(f".{path.name}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def take_latency_ms(default_ms: float) -> float:
    """The latency of the frame about to run; counts a `for_frames` budget down."""
    path = _path()
    if path is None or not path.is_file():
        return default_ms
    with _locked(path):
        data = read()
        if "latency_ms" not in data:
            return default_ms
        left = data.get("for_frames")
        if left is None:
            return float(data["latency_ms"])
        if left <= 0:
            return default_ms
        write_control(path, **{**data, "for_frames": left - 1})
        return float(data["latency_ms"])
