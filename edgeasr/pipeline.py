"""The running pipeline: capture -> segmenter -> bounded queue -> one inference worker -> publishers.

Threads: the capture loop (the caller's thread) reads the source and feeds the segmenter;
one worker owns the engine (and so the encoder device) and publishes. They meet at a
queue bounded in seconds of audio. When inference falls behind a live source, the
OLDEST queued segment is dropped (counted, reported in metrics and on the error topic):
fresh speech matters more than a backlog. A file or stdin source is never dropped from:
capture waits instead (backpressure), so nothing read is lost.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeasr.config import PipelineConfig
from edgeasr.stages import SAMPLE_RATE, AudioSource, Engine, Publisher, SpeechSegment, Transcript

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5  # longest wait of either loop, so stop requests and watchdog marks stay prompt
LATENCY_WINDOW = 200  # transcripts the latency percentiles are taken over


class SegmentQueue:
    """FIFO of speech segments bounded by their total duration."""

    def __init__(self, max_seconds: float) -> None:
        self.max_seconds = max_seconds
        self._items: collections.deque[SpeechSegment] = collections.deque()
        self._seconds = 0.0
        self._cond = threading.Condition()
        self.dropped = 0
        self.dropped_seconds = 0.0

    def put(self, segment: SpeechSegment, *, block: bool, stop: threading.Event) -> list[SpeechSegment]:
        """Queue a segment; returns the segments dropped to make room (never when block)."""
        dropped = []
        with self._cond:
            while self._items and self._seconds + segment.duration_s > self.max_seconds:
                if block:  # backpressure: the worker frees room as it goes
                    self._cond.wait(IDLE_POLL_S)
                    continue
                old = self._items.popleft()
                self._seconds -= old.duration_s
                self.dropped += 1
                self.dropped_seconds += old.duration_s
                dropped.append(old)
            self._items.append(segment)
            self._seconds += segment.duration_s
            self._cond.notify_all()
        return dropped

    def get(self, timeout_s: float) -> SpeechSegment | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            segment = self._items.popleft()
            self._seconds -= segment.duration_s
            self._cond.notify_all()
            return segment

    @property
    def depth(self) -> int:
        return len(self._items)

    @property
    def seconds(self) -> float:
        return self._seconds


@dataclass
class Stats:
    transcripts: int = 0
    segments: int = 0
    empty: int = 0  # segments that gave no text (noise, gates)
    failures: int = 0  # segments the engine raised on
    audio_s: float = 0.0
    busy_s: float = 0.0
    latencies_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


class Pipeline:
    def __init__(self, source: AudioSource, segmenter, engine: Engine, publishers: list[Publisher],
                 options: PipelineConfig, *, live: bool, log_transcripts: bool = False,
                 progress: Callable[[str], None] = lambda stage: None,
                 status: Callable[[str], None] = lambda text: None,
                 report_error: Callable[[str, str], None] = lambda error, context: None) -> None:
        """live: a microphone (or a file read at real time): when inference falls behind, the
        oldest queued speech is dropped; otherwise capture waits."""
        self.source, self.segmenter, self.engine = source, segmenter, engine
        self.publishers, self.options = publishers, options
        self.live, self.log_transcripts = live, log_transcripts
        self.progress, self.status, self.report_error = progress, status, report_error
        self.queue = SegmentQueue(options.queue_s)
        self.stats = Stats()
        self.stop_event = threading.Event()
        self._captured = threading.Event()  # capture has ended (stop or end of input)
        self._first_audio = threading.Event()
        self._worker = threading.Thread(target=self._work, name="edgeasr-inference", daemon=True)
        self._carry: tuple[np.ndarray, SpeechSegment] | None = None

    # ------------------------------------------------------------------ lifecycle
    def request_stop(self) -> None:
        self.stop_event.set()

    def wait_for_audio(self, timeout_s: float) -> bool:
        return self._first_audio.wait(timeout_s)

    def run(self) -> None:
        """Capture until stopped or the input ends, then drain the queue within the deadline."""
        self._worker.start()
        try:
            self._capture()
        finally:
            self._captured.set()
            self._worker.join(self.options.stop_deadline_s if self.stop_event.is_set() else None)
            if self._worker.is_alive():
                log.warning("stop deadline (%.0f s) passed with %d segment(s) still queued",
                            self.options.stop_deadline_s, self.queue.depth)

    def _capture(self) -> None:
        live = self.live
        while not self.stop_event.is_set():
            chunk = self.source.read(IDLE_POLL_S)
            self.progress("capture")
            if chunk is None:
                if self.source.ended:
                    break
                continue
            self._first_audio.set()
            for segment in self.segmenter.push(chunk):
                self._enqueue(segment, block=not live)
        for segment in self.segmenter.flush():  # the segment in progress is finished, not lost
            self._enqueue(segment, block=True)

    def _enqueue(self, segment: SpeechSegment, block: bool) -> None:
        for old in self.queue.put(segment, block=block, stop=self.stop_event):
            log.warning("inference is behind: dropped %.1f s of queued speech (%d dropped so far)",
                        old.duration_s, self.queue.dropped)
            self.report_error("inference behind: queued speech dropped",
                              f"{old.duration_s:.1f} s from {old.start_utc.isoformat()}")

    # ------------------------------------------------------------------ inference
    def _work(self) -> None:
        while True:
            self.progress("worker")
            segment = self.queue.get(IDLE_POLL_S)
            if segment is None:
                if self._captured.is_set() and self.queue.depth == 0:
                    return
                continue
            self.status("transcribing")
            try:
                self._transcribe(segment)
            except Exception as exc:  # the one supervision point of the worker: keep listening
                self.stats.failures += 1
                log.exception("transcribing a %.1f s segment failed", segment.duration_s)
                self.report_error(f"transcription failed: {exc}", segment.start_utc.isoformat())
            self.status("listening")

    def _transcribe(self, segment: SpeechSegment) -> None:
        audio = segment.samples.astype(np.float32) / 32768.0
        carry = self._carry
        self._carry = None
        if carry is not None and carry[1].end_sample == segment.start_sample:
            audio = np.concatenate([carry[0], audio])
            segment = dataclasses.replace(segment, start_sample=carry[1].start_sample,
                                          start_utc=carry[1].start_utc)
        t0 = time.monotonic()
        # a cut in a pause ends the segment's words: decode it as complete (no tail carried)
        result = self.engine.transcribe(audio, final=not segment.cut or segment.cut_in_pause)
        busy = time.monotonic() - t0
        self.stats.segments += 1
        self.stats.audio_s += len(audio) / SAMPLE_RATE
        self.stats.busy_s += busy
        if segment.cut and result.consumed_samples < len(audio):
            # the unfinished tail goes in front of the next (contiguous) segment
            start = segment.start_sample + result.consumed_samples
            tail = dataclasses.replace(
                segment, start_sample=start,
                start_utc=segment.start_utc + _seconds(result.consumed_samples))
            self._carry = (audio[result.consumed_samples:], tail)
            segment = dataclasses.replace(segment, end_sample=start, end_utc=tail.start_utc)
        if not result.text:
            self.stats.empty += 1
            return
        transcript = Transcript(str(uuid.uuid4()), segment, result, busy * 1e3)
        for publisher in self.publishers:
            publisher.publish(transcript)
        latency = (time.monotonic() - segment.speech_end_mono) * 1e3
        self.stats.transcripts += 1
        self.stats.latencies_ms.append(latency)
        log.info("transcript: %.1f s of speech, %d tokens, %.0f ms after speech ended",
                 segment.duration_s, result.tokens, latency)
        (log.info if self.log_transcripts else log.debug)("text: %s", result.text)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict:
        lat = sorted(self.stats.latencies_ms)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1) if lat else None

        gate = getattr(self.engine, "gate_failures", {})
        return {
            "latency_ms_p50": pct(0.5), "latency_ms_p95": pct(0.95),
            "real_time_factor": round(self.stats.busy_s / self.stats.audio_s, 4) if self.stats.audio_s else None,
            "queue_depth": self.queue.depth, "queue_s": round(self.queue.seconds, 2),
            "transcripts": self.stats.transcripts, "segments": self.stats.segments,
            "failures": self.stats.failures, "dropped_segments": self.queue.dropped,
            "dropped_s": round(self.queue.dropped_seconds, 2),
            "gate_drops": dict(gate), "capture": _counters(self.source),
            "segmenter": dataclasses.asdict(self.segmenter.counters),
        }


def _seconds(samples: int) -> dt.timedelta:
    return dt.timedelta(seconds=samples / SAMPLE_RATE)


def _counters(source) -> dict:
    counters = getattr(source, "counters", None)
    return dataclasses.asdict(counters) if counters is not None else {}
