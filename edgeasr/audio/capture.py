"""Microphone capture through PortAudio: the only module that imports sounddevice.

The PortAudio callback copies each block into a bounded ring (oldest dropped and
counted); the consumer resamples the device's native rate to 16 kHz with a streaming
soxr resampler. A device that vanishes (the stream stops, PortAudio errors) is reopened
with exponential backoff while `status` says "microphone lost". Sample indices keep
wall-clock spacing across dropped audio and reopens, so the segmenter sees the gaps.
Also `edgeasr devices`, which lists the input devices PortAudio can see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import soxr

from edgeasr.errors import DeviceError, ToolMissingError
from edgeasr.stages import SAMPLE_RATE, AudioChunk

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5  # first reopen attempt after the device is lost; doubles each failure
RETRY_MAX_S = 30.0  # cap of the reopen backoff


def import_sounddevice() -> ModuleType:
    try:
        import sounddevice
    except ImportError:
        raise ToolMissingError("sounddevice is not installed (pip install sounddevice)") from None
    except OSError as exc:  # sounddevice raises this when libportaudio is missing
        raise ToolMissingError(
            f"PortAudio is not installed ({exc}); install libportaudio2"
        ) from None
    return sounddevice


@dataclass(frozen=True)
class InputDevice:
    index: int
    name: str
    channels: int
    default_samplerate: float
    hostapi: str
    is_default: bool


def list_input_devices(sd: ModuleType | None = None) -> list[InputDevice]:
    sd = sd or import_sounddevice()
    default = sd.default.device[0]
    return [
        InputDevice(
            index=i,
            name=info["name"],
            channels=info["max_input_channels"],
            default_samplerate=info["default_samplerate"],
            hostapi=sd.query_hostapis(info["hostapi"])["name"],
            is_default=i == default,
        )
        for i, info in enumerate(sd.query_devices())
        if info["max_input_channels"] > 0
    ]


def resolve_device(sd: ModuleType, device: int | str | None) -> InputDevice:
    """input.device (index, name substring or None) -> the PortAudio input device."""
    devices = list_input_devices(sd)
    if not devices:
        raise DeviceError(
            "input.source: mic, but PortAudio finds no audio input device on this machine: plug "
            "one in (user in group 'audio'?), or set input.source: file with input.path (--input "
            "FILE), or input.source: stdin")
    names = ", ".join(d.name for d in devices)
    if device is None:
        found = [d for d in devices if d.is_default]
        if not found:
            raise DeviceError(f"input.device: no default input device (available: {names})")
        return found[0]
    if isinstance(device, int):
        found = [d for d in devices if d.index == device]
        if not found:
            raise DeviceError(f"input.device: {device} is not an input device (available: {names})")
        return found[0]
    wanted = device.lower()
    exact = [d for d in devices if d.name.lower() == wanted]
    found = exact or [d for d in devices if wanted in d.name.lower()]
    if not found:
        raise DeviceError(f"input.device: no input device matches {device!r} (available: {names})")
    if len(found) > 1:
        matches = ", ".join(d.name for d in found)
        raise DeviceError(f"input.device: {device!r} is ambiguous (matches: {matches})")
    return found[0]


@dataclass
class CaptureCounters:
    frames: int = 0  # native-rate frames PortAudio delivered
    overflows: int = 0  # callbacks PortAudio flagged input_overflow (audio lost upstream)
    ring_drops: int = 0  # blocks dropped from the full ring (the pipeline fell behind)
    reopen_count: int = 0  # successful reopens after the device was lost


class _Ring:
    """Blocks between the PortAudio callback thread and the consumer, bounded in frames."""

    def __init__(self, max_frames: int) -> None:
        self._blocks: deque[tuple[np.ndarray, int, float]] = deque()
        self._frames = 0
        self._max = max_frames
        self._cond = threading.Condition()
        self.drops = 0

    def put(self, block: np.ndarray, index: int, t_mono: float) -> None:
        with self._cond:
            self._blocks.append((block, index, t_mono))
            self._frames += len(block)
            while self._frames > self._max and len(self._blocks) > 1:
                self._frames -= len(self._blocks.popleft()[0])
                self.drops += 1
            self._cond.notify()

    def get(self, timeout_s: float) -> tuple[np.ndarray, int, float] | None:
        with self._cond:
            if not self._blocks:
                self._cond.wait(max(0.0, timeout_s))
            if not self._blocks:
                return None
            item = self._blocks.popleft()
            self._frames -= len(item[0])
            return item


class MicSource:
    """A PortAudio input device as an `AudioSource` of mono 16 kHz int16 chunks."""

    def __init__(
        self,
        device: int | str | None,
        samplerate: int | None,
        block_ms: int,
        ring_s: float,
        *,
        retry_min_s: float = RETRY_MIN_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._sd = import_sounddevice()
        self._query = device
        self._requested_rate = samplerate
        self._block_ms = block_ms
        self._ring_s = ring_s
        self._retry_min_s, self._retry_max_s = retry_min_s, retry_max_s
        self._counters = CaptureCounters()
        self._drops_before = 0  # ring drops of rings replaced by a reopen
        self._produced = 0  # 16 kHz samples accounted for (delivered + gaps)
        self._last_t_mono: float | None = None
        self._stream: Any = None
        self._ring = _Ring(1)  # replaced by _open, before the first callback
        self._lost_reason: str | None = None
        self._retry_at = 0.0
        self._retry_delay = retry_min_s
        self._open()

    # --- AudioSource ----------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return False  # a microphone never runs out

    @property
    def status(self) -> str:
        if self._lost_reason is not None:
            return f"microphone lost ({self._lost_reason}); retrying"
        return f"capturing from {self.device.name} at {self.samplerate} Hz"

    @property
    def counters(self) -> CaptureCounters:
        return CaptureCounters(
            frames=self._counters.frames,
            overflows=self._counters.overflows,
            ring_drops=self._drops_before + self._ring.drops,
            reopen_count=self._counters.reopen_count,
        )

    def read(self, timeout_s: float) -> AudioChunk | None:
        deadline = time.monotonic() + timeout_s
        if self._stream is None and not self._try_reopen():
            time.sleep(max(0.0, min(deadline, self._retry_at) - time.monotonic()))
            return None
        while True:
            item = self._ring.get(deadline - time.monotonic())
            if item is None:
                if self._failed():
                    self._lose("the input stream stopped")
                return None
            chunk = self._convert(*item)
            if chunk is not None:
                return chunk

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close(ignore_errors=True)

    # --- opening and losing the device --------------------------------------------

    def _open(self) -> None:
        sd = self._sd
        self.device = resolve_device(sd, self._query)
        rate = self._requested_rate or int(self.device.default_samplerate)
        self._finished = threading.Event()
        self._native_index = 0  # frames produced by this stream (callback side)
        self._expect = 0  # next native index the consumer expects
        self._drops_before += self._ring.drops
        self.samplerate = rate
        self._ring = _Ring(max(1, int(self._ring_s * rate)))  # before the callback can run
        self._resampler = (
            None
            if rate == SAMPLE_RATE
            else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="int16")
        )
        try:
            stream = sd.InputStream(
                device=self.device.index,
                samplerate=rate,
                channels=1,
                dtype="int16",
                blocksize=rate * self._block_ms // 1000,
                callback=self._callback,
                finished_callback=self._finished.set,
            )
            stream.start()
        except (sd.PortAudioError, ValueError) as exc:
            raise DeviceError(
                f"input.device: cannot capture from {self.device.name!r} at {rate} Hz ({exc})"
            ) from None
        self._stream = stream
        log.info("capturing from %r (index %d) at %d Hz", self.device.name, self.device.index, rate)

    def _failed(self) -> bool:
        try:
            return self._finished.is_set() or not self._stream.active
        except self._sd.PortAudioError:
            return True

    def _lose(self, reason: str) -> None:
        log.warning("microphone lost: %s; reopening with backoff", reason)
        stream, self._stream = self._stream, None
        stream.close(ignore_errors=True)
        self._lost_reason = reason
        self._retry_delay = self._retry_min_s
        self._retry_at = time.monotonic() + self._retry_delay

    def _try_reopen(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._rescan()
            self._open()
        except (DeviceError, self._sd.PortAudioError) as exc:
            self._retry_delay = min(2 * self._retry_delay, self._retry_max_s)
            self._retry_at = time.monotonic() + self._retry_delay
            log.debug("reopen failed (%s); next try in %.1f s", exc, self._retry_delay)
            return False
        if self._last_t_mono is not None:  # keep wall-clock spacing across the outage
            self._produced += round(max(0.0, time.monotonic() - self._last_t_mono) * SAMPLE_RATE)
        self._counters.reopen_count += 1
        self._lost_reason = None
        log.info("microphone back after %d reopen(s)", self._counters.reopen_count)
        return True

    def _rescan(self) -> None:
        """PortAudio lists devices only when it initialises: re-initialise it so that a
        re-plugged USB microphone is found again (sounddevice has no public call)."""
        terminate = getattr(self._sd, "_terminate", None)
        initialize = getattr(self._sd, "_initialize", None)
        if terminate is not None and initialize is not None:
            terminate()
            initialize()

    # --- the two sides of the ring --------------------------------------------------

    def _callback(self, indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        if status.input_overflow:
            self._counters.overflows += 1
        self._counters.frames += frames
        self._ring.put(indata[:, 0].copy(), self._native_index, time.monotonic())
        self._native_index += frames

    def _convert(self, block: np.ndarray, index: int, t_mono: float) -> AudioChunk | None:
        if index > self._expect:  # blocks were dropped: leave a gap of the same length
            self._produced += round((index - self._expect) * SAMPLE_RATE / self.samplerate)
            if self._resampler is not None:
                self._resampler = soxr.ResampleStream(
                    self.samplerate, SAMPLE_RATE, 1, dtype="int16"
                )
        self._expect = index + len(block)
        samples = block if self._resampler is None else self._resampler.resample_chunk(block)
        self._last_t_mono = t_mono
        if not len(samples):
            return None
        chunk = AudioChunk(samples=samples, start_sample=self._produced, t_mono=t_mono)
        self._produced += len(samples)
        return chunk


# --- `edgeasr devices` ------------------------------------------------------------------
