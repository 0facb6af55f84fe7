"""A virtual microphone for capture tests: ALSA `type file` devices reading named FIFOs.

PortAudio reads its ALSA configuration once, at `import sounddevice`, and opens every
device while enumerating; so the configuration lives in a private HOME/XDG_CONFIG_HOME
given to a child process, and each FIFO is held open read-write here (never blocks, the
reader never sees EOF) before that child starts. A feeder thread writes audio into a
FIFO at real time, in blocks of the capture block size (the file plugin copies whatever
one read() returns, so whole blocks keep the capture bit-exact), then silence until it
is stopped, like a microphone that never runs dry.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import numpy as np

DEVICE_TEMPLATE = (
    'pcm.{name} {{ type file; slave.pcm "null"; file "/dev/null"; '
    'infile "{infile}"; format "raw" }}\n'
)


class FifoFeeder(threading.Thread):
    def __init__(self, fd: int, samples: np.ndarray, rate: int, block: int) -> None:
        super().__init__(daemon=True)
        self._fd, self._samples, self._rate, self._block = fd, samples, rate, block
        self._halt = threading.Event()

    def run(self) -> None:
        silence = np.zeros(self._block, dtype=np.int16)
        t0, i = time.monotonic(), 0
        while not self._halt.is_set():
            block = self._samples[i : i + self._block]
            if len(block) < self._block:
                block = np.concatenate([block, silence[: self._block - len(block)]])
            os.write(self._fd, block.astype("<i2").tobytes())
            i += self._block
            delay = t0 + i / self._rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class VirtualMics:
    """FIFO-backed ALSA capture devices named `names`, for a child process."""

    def __init__(self, root: Path, names: list[str]) -> None:
        (root / "home").mkdir(parents=True)
        (root / "xdg" / "alsa").mkdir(parents=True)
        self.fds: dict[str, int] = {}
        config = []
        for name in names:
            fifo = root / f"{name}.fifo"
            os.mkfifo(fifo)
            self.fds[name] = os.open(fifo, os.O_RDWR)
            config.append(DEVICE_TEMPLATE.format(name=name, infile=fifo))
        (root / "xdg" / "alsa" / "asoundrc").write_text("".join(config))
        self.env = {**os.environ, "HOME": str(root / "home"), "XDG_CONFIG_HOME": str(root / "xdg")}
        self._feeders: list[FifoFeeder] = []

    def feed(self, name: str, samples: np.ndarray, rate: int, block: int) -> FifoFeeder:
        feeder = FifoFeeder(self.fds[name], samples, rate, block)
        feeder.start()
        self._feeders.append(feeder)
        return feeder

    def close(self) -> None:
        for feeder in self._feeders:
            feeder._halt.set()
        for fd in self.fds.values():  # room for a feeder blocked on a full FIFO nobody reads any more
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while os.read(fd, 1 << 16):
                    pass
        for feeder in self._feeders:
            feeder.stop()
        for fd in self.fds.values():
            os.close(fd)
