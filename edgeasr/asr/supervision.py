"""Keep the encoder's device in service: reopen it after a failure, count, give up for good.

An NPU timeout closes the Hailo encoder (its late job may still write into the buffers), and
nothing used to open it again: one stall left the daemon deaf while the watchdog kept it
alive. `SupervisedEncoder` wraps an encoder factory and owns that decision:

- A window whose encode raises a DeviceError is a failure. The device is closed, reopened
  after a backoff, and the same window runs once more: a transient stall loses nothing.
- A window that fails again raises EncoderFailedError: the caller counts a failed segment
  and goes on; the next window reopens the device first.
- `max_failures` failures in a row, or a device that cannot be reopened within
  `reopen_timeout_s` (or not at all: a bad HEF, a missing SDK), make the state `failed`, for
  good: every later encode raises EncoderFailedError at once, and the daemon withholds
  systemd's watchdog pings so that systemd restarts the service (Restart=on-failure).

A reopen starts after FIRST_BACKOFF_S, doubling with each failure in a row up to
MAX_BACKOFF_S. Any other error (a wrong input shape: a bug) passes through uncounted. The
ONNX encoder goes through the same wrapper (it raises no DeviceError, so it stays `ok`):
the daemon sees one interface whatever the backend.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from edgeasr.config import EncoderConfig
from edgeasr.errors import DeviceError, EdgeAsrError

if TYPE_CHECKING:
    from edgeasr.asr.encoder import Encoder

log = logging.getLogger(__name__)

OK, RECOVERING, FAILED = "ok", "recovering", "failed"
FIRST_BACKOFF_S = 0.5  # lets a chip that just timed out finish or drop its late job
MAX_BACKOFF_S = 4.0  # a window's recovery must stay well inside the watchdog's 15 s ping period


class EncoderFailedError(DeviceError):
    """A window the encoder could not encode, even on a reopened device; or any window once
    the encoder has failed for good (`SupervisedEncoder.health().state == "failed"`)."""


@dataclass(frozen=True)
class DeviceHealth:
    """The encoder device's state, as the daemon reads it (a snapshot: replaced, never changed)."""

    state: str = OK  # ok | recovering (failed lately, being reopened) | failed (for good)
    consecutive_failures: int = 0  # failed encodes since the last one that worked
    failures: int = 0  # failed encodes in all (a retried window can count twice)
    reopens: int = 0  # times the device was opened again
    reopen_failures: int = 0  # attempts to open it again that failed
    last_error: str | None = None

    @property
    def failed(self) -> bool:
        return self.state == FAILED


def encoder_health(encoder: object) -> DeviceHealth:
    """The health of any encoder: a SupervisedEncoder's own, `ok` for one without supervision
    (what the daemon's watchdog asks, whatever build_engine gave it)."""
    health = getattr(encoder, "health", None)
    return health() if callable(health) else DeviceHealth()


class SupervisedEncoder:
    """An Encoder (backend, encode, close) that reopens its device after failures; health()
    says how it goes. `open_encoder` builds the real encoder (opening the device); it is
    called once here, so a device that is absent at start-up fails the start as before."""

    def __init__(
        self,
        open_encoder: Callable[[], Encoder],
        *,
        max_failures: int = EncoderConfig.max_failures,
        reopen_timeout_s: float = EncoderConfig.reopen_timeout_s,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        # their ranges are the encoder section's, checked when the config is loaded
        self.max_failures, self.reopen_timeout_s = max_failures, reopen_timeout_s
        self._open, self._clock, self._sleep = open_encoder, clock, sleep
        self._encoder: Encoder | None = open_encoder()
        self.backend = self._encoder.backend
        self._health = DeviceHealth()
        self._lock = threading.Lock()  # one encode (and its recovery) at a time
        self._closed = False

    def health(self) -> DeviceHealth:
        return self._health  # a frozen snapshot, safe to read from any thread

    def encode(self, mel: np.ndarray) -> np.ndarray:
        with self._lock:
            if self._closed:
                raise DeviceError(f"the {self.backend} encoder is closed")
            if self._health.failed:
                raise EncoderFailedError(
                    f"the {self.backend} encoder has failed for good ({self._health.last_error}); "
                    "waiting for systemd to restart the service"
                )
            for _attempt in range(2):  # the window, then once more on a reopened device
                encoder = self._encoder or self._reopen()
                try:
                    features = encoder.encode(mel)
                except DeviceError as exc:
                    self._record_failure(exc)
                    continue
                self._record_success()
                return features
            raise EncoderFailedError(
                f"the {self.backend} encoder lost this window: it failed again on the reopened "
                f"device ({self._health.last_error})"
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_device()

    # -- bookkeeping ----------------------------------------------------------------------
    def _update(self, **changes: object) -> DeviceHealth:
        self._health = dataclasses.replace(self._health, **changes)  # type: ignore[arg-type]
        return self._health

    def _record_success(self) -> None:
        if self._health.state != OK:
            log.info("%s encoder works again (%d failure(s) in all, %d reopen(s))",
                     self.backend, self._health.failures, self._health.reopens)
            self._update(state=OK, consecutive_failures=0)

    def _record_failure(self, exc: DeviceError) -> None:
        """Count a failed encode and let go of the device; raises once it is for good."""
        self._close_device()  # a timed-out job may still write into the old buffers
        h = self._health
        h = self._update(state=RECOVERING, consecutive_failures=h.consecutive_failures + 1,
                         failures=h.failures + 1, last_error=str(exc))
        if h.consecutive_failures >= self.max_failures:
            self._give_up(f"{h.consecutive_failures} failure(s) in a row (encoder.max_failures), "
                          f"the last: {exc}", exc)
        log.warning("%s encoder failed (%d in a row, %d in all): %s; reopening the device",
                    self.backend, h.consecutive_failures, h.failures, exc)

    def _give_up(self, reason: str, cause: BaseException) -> NoReturn:
        self._update(state=FAILED, last_error=reason)
        log.error("the %s encoder has failed for good: %s", self.backend, reason)
        raise EncoderFailedError(f"the {self.backend} encoder has failed for good: {reason}") from cause

    def _close_device(self) -> None:
        encoder, self._encoder = self._encoder, None
        if encoder is None:
            return
        try:
            encoder.close()
        except Exception as exc:  # noqa: BLE001 - a device that just failed may fail to close too
            log.debug("closing the failed %s encoder: %s", self.backend, exc)

    # -- reopening ------------------------------------------------------------------------
    def _first_delay(self) -> float:
        doublings = max(0, self._health.consecutive_failures - 1)
        return min(FIRST_BACKOFF_S * 2**doublings, MAX_BACKOFF_S)

    def _reopen(self) -> Encoder:
        """Open the device again, backing off between attempts for at most reopen_timeout_s."""
        deadline = self._clock() + self.reopen_timeout_s
        delay = self._first_delay()
        while True:
            self._sleep(delay)
            try:
                encoder = self._open()
            except DeviceError as exc:  # absent, busy, driver trouble: it may come back
                self._update(reopen_failures=self._health.reopen_failures + 1, last_error=str(exc))
                delay = min(delay * 2, MAX_BACKOFF_S)
                if self._clock() + delay > deadline:
                    self._give_up(f"the device could not be reopened within encoder.reopen_timeout_s "
                                  f"= {self.reopen_timeout_s:g} s: {exc}", exc)
                log.warning("reopening the %s encoder failed: %s; next attempt in %.1f s",
                            self.backend, exc, delay)
                continue
            except EdgeAsrError as exc:  # a bad HEF, a missing SDK: no later attempt can help
                self._update(reopen_failures=self._health.reopen_failures + 1)
                self._give_up(f"the device cannot be reopened: {exc}", exc)
            self._encoder = encoder
            self._update(reopens=self._health.reopens + 1)
            log.info("%s encoder reopened", self.backend)
            return encoder
