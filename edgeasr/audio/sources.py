"""Finite audio sources: a file and stdin.

Both sources deliver mono int16 at `SAMPLE_RATE` in `AudioChunk`s and implement
`stages.AudioSource`; the microphone lives in capture.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr

from edgeasr.audio.files import check_finite, check_header, check_path, warn_if_truncated
from edgeasr.errors import AudioError, MissingInputError
from edgeasr.stages import SAMPLE_RATE, AudioChunk

log = logging.getLogger(__name__)

INT16_SCALE = 32768.0  # full scale of int16 audio
STDIN_QUEUE_BLOCKS = 32  # read-ahead bound for stdin (blocks of block_ms)


def to_int16(audio: np.ndarray) -> np.ndarray:
    """float audio in [-1, 1) -> int16, rounded and clipped (exact for 16-bit sources)."""
    return np.clip(np.rint(audio * INT16_SCALE), -32768, 32767).astype(np.int16)


class FileSource:
    """A WAV/FLAC/OGG file (any rate, any channels) as mono 16 kHz int16 blocks.

    realtime=True delivers each block no earlier than its place in the stream (like a
    microphone); otherwise blocks come as fast as they are read.
    """

    def __init__(
        self,
        path: Path,
        realtime: bool,
        block_ms: int,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise MissingInputError(f"{self.path}: is a directory, not an audio file")
        check_path(str(self.path))
        if not self.path.is_file():
            raise MissingInputError(f"{self.path}: no such audio file")
        try:
            self._file = sf.SoundFile(str(self.path))
        except (sf.LibsndfileError, RuntimeError) as exc:
            raise AudioError(f"{self.path}: cannot decode audio ({exc})") from None
        try:
            check_header(str(self.path), self._file.samplerate, self._file.frames)
        except AudioError:
            self._file.close()
            raise
        self.native_rate = self._file.samplerate
        self.channels = self._file.channels
        self._block = max(1, self.native_rate * block_ms // 1000)
        self._resampler = (
            None
            if self.native_rate == SAMPLE_RATE
            else soxr.ResampleStream(self.native_rate, SAMPLE_RATE, 1, dtype="float32")
        )
        self._realtime = realtime
        self._monotonic = monotonic
        self._sleep = sleep
        self._t0: float | None = None
        self._produced = 0  # output samples decoded so far
        self._pending: np.ndarray | None = None  # decoded, not yet delivered
        self._eof = False
        self._heard = False  # a sample that is not zero was read

    @property
    def ended(self) -> bool:
        return self._eof and self._pending is None

    def read(self, timeout_s: float) -> AudioChunk | None:
        if self._t0 is None:
            self._t0 = self._monotonic()
        if self._pending is None:
            self._pending = self._decode_next()
            if self._pending is None:
                return None
        start = self._produced - len(self._pending)
        if self._realtime:
            wait = self._t0 + self._produced / SAMPLE_RATE - self._monotonic()
            if wait > timeout_s:
                self._sleep(max(0.0, timeout_s))
                return None
            if wait > 0:
                self._sleep(wait)
        samples, self._pending = self._pending, None
        return AudioChunk(samples=samples, start_sample=start, t_mono=self._monotonic())

    def _decode_next(self) -> np.ndarray | None:
        """The next non-empty block at 16 kHz, or None at the end of the file."""
        while not self._eof:
            try:
                data = self._file.read(self._block, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as exc:
                raise AudioError(f"{self.path}: cannot decode audio ({exc})") from None
            check_finite(data, str(self.path))
            last = len(data) < self._block or self._file.tell() >= self._file.frames
            mono = data.mean(axis=1) if self.channels > 1 else data[:, 0]
            if self._resampler is not None:
                mono = self._resampler.resample_chunk(mono, last=last)
            self._heard = self._heard or bool(np.any(mono))
            if last:
                self._finish()
            if len(mono):
                out = to_int16(mono)
                self._produced += len(out)
                return out
        return None

    def _finish(self) -> None:
        self._eof = True
        warn_if_truncated(self._file, str(self.path))
        self._file.close()
        if not self._heard:
            raise AudioError(f"audio file {self.path} is digital silence: every sample is zero")

    def close(self) -> None:
        self._eof = True
        self._pending = None
        self._file.close()


class StdinSource:
    """Raw s16le, 16 kHz, mono from a binary stream (normally sys.stdin.buffer).

    A reader thread blocks on the stream so that `read(timeout_s)` can time out; its
    queue is bounded, so a slow pipeline slows the writer instead of growing memory.
    """

    _END = object()

    def __init__(self, stream: BinaryIO, block_ms: int, *, name: str = "stdin") -> None:
        self.name = name
        self._stream = stream
        self._block_bytes = 2 * max(1, SAMPLE_RATE * block_ms // 1000)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=STDIN_QUEUE_BLOCKS)
        self._produced = 0
        self._ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="edgeasr-stdin", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self._ended

    def _pump(self) -> None:
        carry = b""  # an odd byte left by a short read of a raw stream
        try:
            while not self._stop.is_set():
                data = self._stream.read(self._block_bytes)
                if not data:
                    break
                data, carry = carry + data, b""
                if len(data) % 2:
                    data, carry = data[:-1], data[-1:]
                if data:
                    self._put((np.frombuffer(data, dtype="<i2").astype(np.int16), time.monotonic()))
            if carry:
                log.warning(
                    "%s: odd byte count at the end of the stream, last byte ignored", self.name
                )
        except (OSError, ValueError) as exc:
            self._put(AudioError(f"{self.name}: cannot read audio ({exc})"))
        self._put(self._END)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, timeout_s: float) -> AudioChunk | None:
        if self._ended:
            return None
        try:
            item = self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if item is self._END:
            self._ended = True
            return None
        if isinstance(item, AudioError):
            self._ended = True
            raise item
        samples, t_mono = typing.cast(tuple[np.ndarray, float], item)
        chunk = AudioChunk(samples=samples, start_sample=self._produced, t_mono=t_mono)
        self._produced += len(samples)
        return chunk

    def close(self) -> None:
        self._stop.set()
        self._ended = True
