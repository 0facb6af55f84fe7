"""The stream clock: which wall-clock moment a sample of the audio stream was captured at."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from edgeasr.stages import SAMPLE_RATE, AudioChunk


class StreamClock:
    """Maps a stream sample index to wall-clock UTC.

    Anchored on the first chunk observed: sample 0 is placed at "now, minus the audio
    already delivered, minus how long that chunk waited since capture". Later chunks do
    not move the anchor, so times stay monotonic in the sample index.
    """

    def __init__(
        self,
        sample_rate: int = SAMPLE_RATE,
        now_utc: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = sample_rate
        self._now_utc = now_utc
        self._monotonic = monotonic
        self._start: dt.datetime | None = None

    def observe(self, chunk: AudioChunk) -> None:
        if self._start is None:
            waited = max(0.0, self._monotonic() - chunk.t_mono)
            delivered = (chunk.start_sample + len(chunk.samples)) / self._rate
            self._start = self._now_utc() - dt.timedelta(seconds=delivered + waited)

    def utc(self, sample: int) -> dt.datetime:
        if self._start is None:
            self._start = self._now_utc() - dt.timedelta(seconds=sample / self._rate)
        return self._start + dt.timedelta(seconds=sample / self._rate)
