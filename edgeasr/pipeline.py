"""The audio front end: capture -> segmenter -> the inference worker -> publishers.

The capture loop (the caller's thread) reads the source and feeds the segmenter. Every segment
becomes a final job on this front end's lane at the worker, bounded in seconds of audio: a live
source (microphone, file read at real time) drops the oldest queued speech when inference
falls behind (counted, reported), a file or stdin waits instead, so nothing read is lost.

While someone speaks into a live source:
- partial results: every `pipeline.partial_interval_ms` the segment so far is offered to the
  worker as a partial job (skipped, never queued, when the worker is busy) and published with
  the id the final transcript will carry;
- speculative decoding: once a pause has lasted `pipeline.speculate_after_ms`, the speech so
  far is decoded at once. If the hangover then ends without more speech, the segment's final
  job finds that result ready, so the transcript leaves as the hangover ends instead of a
  decode later; if speech resumes, the speculation is thrown away.

A segment cut at the window limit while speech goes on leaves its unfinished tail to the next
segment, which is decoded after it with the text before it as prompt. The speculation and the
carried text are edgeasr/continuation.py's, as the Wyoming sessions' are.

Threads. Each piece of state has one owner, and what crosses goes inside a job, through the
lane (whose lock orders the hand-off):
- the capture thread (`run`) owns the segmenter, the open segment's features, the utterance
  ids (a job is handed the id it publishes under), when the next partial is due, the current
  speculation (it only cancels that job, never reads its result) and the last partial job
  offered (cancelled once its segment's final is queued);
- the worker thread, in the jobs, owns the carried tail and the text before it (the
  `Continuation`), a speculation's result (written by its job, read by the final job after
  it) and `stats`, but `stats.speculations`, counted when the capture thread starts one. The
  worker runs one job at a time: no lock.
Others only read counters (`metrics`, any thread) or set flags (`request_stop`,
`log_transcripts` on SIGHUP).
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
from edgeasr.continuation import Continuation, Heard, Speculation, decode_until
from edgeasr.errors import EdgeAsrError
from edgeasr.stages import (
    SAMPLE_RATE,
    AudioSource,
    Engine,
    OpenSegment,
    Publisher,
    Segmenter,
    SpeechFrames,
    SpeechSegment,
    Transcript,
    Transcription,
    Vocabulary,
)
from edgeasr.worker import Job, LaneFull, Overflow, Worker

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5  # longest wait for audio, so stop requests and liveness marks stay prompt
LATENCY_WINDOW = 200  # transcripts the latency percentiles are taken over
INT16_SCALE = 32768.0


@dataclass
class Stats:
    transcripts: int = 0
    segments: int = 0
    empty: int = 0  # segments that gave no text (noise, gates)
    failures: int = 0  # segments the engine raised on (each reported)
    partials: int = 0  # partial results published
    speculations: int = 0  # speculative decodes started (the capture thread counts them)
    speculation_hits: int = 0  # ... whose result became the transcript
    audio_s: float = 0.0
    busy_s: float = 0.0
    latencies_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


@dataclass(frozen=True)
class _Utterance:
    """What a segment's messages carry (the id of its partial results and its transcript) and
    the vocabulary it is heard with, both fixed when its speech begins."""

    id: str
    vocabulary: Vocabulary


@dataclass(frozen=True)
class _Tail:
    """The unfinished tail of a window cut in speech, decoded again with the next segment."""

    heard: Heard  # its audio and the VAD's verdict on it
    segment: SpeechSegment  # where it lies in the stream


@dataclass
class _Speculating:
    """The speculation taken in the open segment's pause, and which segment it is for."""

    seq: int
    speculation: Speculation


class Pipeline:
    def __init__(self, source: AudioSource, segmenter: Segmenter, worker: Worker, publishers: list[Publisher],
                 options: PipelineConfig, *, live: bool, log_transcripts: bool = False,
                 progress: Callable[[str], None] = lambda stage: None,
                 status: Callable[[str], None] = lambda text: None,
                 report_error: Callable[[str, str], None] = lambda error, context: None,
                 clock: Callable[[], float] = time.monotonic,
                 vocabulary: Callable[[], Vocabulary] = Vocabulary) -> None:
        """live: a microphone (or a file read at real time): partial results and speculative
        decoding are on, and when inference falls behind the oldest queued speech is dropped;
        otherwise capture waits and every segment is decoded once. clock: when partial results
        are due (the monotonic clock; tests pass the stream position). vocabulary: the home's names
        and terms as they are now (each segment is heard with those it began with)."""
        self.clock, self.vocabulary = clock, vocabulary
        self.source, self.segmenter, self.worker = source, segmenter, worker
        self.publishers, self.options = publishers, options
        self.live, self.log_transcripts = live, log_transcripts
        self.progress, self.status, self.report_error = progress, status, report_error
        self.lane = worker.lane("audio input", options.queue_s, Overflow.DROP_OLDEST if live else Overflow.BLOCK)
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.error: EdgeAsrError | None = None
        self._first_audio = threading.Event()
        # capture thread
        self._ids: dict[int, _Utterance] = {}  # segment seq -> the id its messages carry, its vocabulary
        self._open_seq: int | None = None  # the segment being built, as last seen
        self._dropped_short = 0  # the segmenter's count, as last seen
        self._partial_due = 0.0
        self._partial_job: tuple[int, Job] | None = None  # the last partial offered, with its seq
        self._speculating: _Speculating | None = None  # taken in the open segment's pause
        # the open segment's log-mel, computed as its audio arrives, so that a partial job
        # does not compute it again on the worker's thread
        self._features = worker.engine.feature_stream() if live and options.partial_interval_ms else None
        self._fed = 0  # samples of the open segment pushed into _features
        # worker thread
        self.continuation = Continuation()
        self._tail: _Tail | None = None

    # ------------------------------------------------------------------ lifecycle
    def request_stop(self) -> None:
        self.stop_event.set()

    def wait_for_audio(self, timeout_s: float) -> bool:
        return self._first_audio.wait(timeout_s)

    def run(self) -> None:
        """Capture until stopped or the input ends; every segment read is queued. An input that
        fails (an unreadable file, a microphone gone for good) ends the capture: what was read
        before is still queued, and the error is kept in `self.error` for the exit code."""
        try:
            self._capture()
        except EdgeAsrError as exc:
            self.error = exc
            log.error("%s", exc)
        for segment in self.segmenter.flush():  # the segment in progress is finished, not lost
            self._enqueue(segment)

    def _capture(self) -> None:
        while not self.stop_event.is_set():
            chunk = self.source.read(IDLE_POLL_S)
            self.progress("capture")
            if chunk is None:
                if self.source.ended:
                    break
                continue
            self._first_audio.set()
            for segment in self.segmenter.push(chunk):
                self._enqueue(segment)
            if self.live:
                self._while_speaking()

    # ------------------------------------------------------------------ capture thread
    def _utterance_id(self, seq: int) -> _Utterance:
        if seq not in self._ids:
            self._ids[seq] = _Utterance(str(uuid.uuid4()), self.vocabulary())
        return self._ids[seq]

    def _enqueue(self, segment: SpeechSegment) -> None:
        utterance = self._utterance_id(segment.seq)
        del self._ids[segment.seq]  # its final is the last message under that id
        if self._partial_job is not None and self._partial_job[0] <= segment.seq:
            self._partial_job[1].cancel()  # not run yet: the final says it all
            self._partial_job = None
        speculating, speculation = self._speculating, None
        unfinished = segment.cut and not segment.cut_in_pause  # decoded as not final
        if speculating is not None:
            speculation = speculating.speculation
            if unfinished or speculating.seq != segment.seq or speculation.stale(segment.speech_frames):
                log.debug("speculation for segment %d is stale (speech frames %d -> %d, cut %s)",
                          speculating.seq, speculation.speech_frames, segment.speech_frames, segment.cut)
                speculation.cancel()  # speech went on after it
                speculation = None
        self._speculating = None
        job = Job(lambda engine, should_stop: self._final(engine, segment, utterance, speculation),
                  segment.duration_s, failed=lambda exc: self._failed(segment, exc))
        self.lane.submit(job, stop=None if self.live else self.stop_event)

    def _while_speaking(self) -> None:
        """Offer a partial job when one is due; speculate when a pause has lasted long enough.
        Runs at every block read: the open segment is looked at in place, and copied only for
        a job."""
        open_segment = self.segmenter.open_segment(copy=False)
        self._track(open_segment)
        if open_segment is None:
            return
        speculating = self._speculating
        if speculating is not None and speculating.speculation.stale(open_segment.speech_frames):
            log.debug("speech resumed in segment %d: speculation dropped", speculating.seq)
            speculating.speculation.cancel()  # speech resumed: that decode is worthless
            self._speculating = speculating = None
        after = self.options.speculate_after_ms
        if (after is not None and speculating is None and open_segment.speech_frames
                and open_segment.silence_ms >= after):
            self._speculate(open_segment)
        if self._features is not None:
            self._features.push(open_segment.samples[self._fed :].astype(np.float32) / INT16_SCALE)
            self._fed = len(open_segment.samples)
        interval = self.options.partial_interval_ms
        now = self.clock()
        if interval and now >= self._partial_due and open_segment.silence_ms == 0:
            self._partial_due = now + interval / 1000
            self._offer_partial(open_segment)

    def _track(self, open_segment: OpenSegment | None) -> None:
        """New speech: its first partial comes an interval later. Speech too short to keep:
        forget the id its partial results carried."""
        seq = open_segment.seq if open_segment is not None else None
        if seq is not None and seq != self._open_seq:
            self._utterance_id(seq)
            self._partial_due = self.clock() + (self.options.partial_interval_ms or 0) / 1000
            if self._features is not None:
                self._features.reset()
                self._fed = 0
        dropped = self.segmenter.counters.dropped_short
        if dropped != self._dropped_short and self._open_seq is not None:
            self._ids.pop(self._open_seq, None)
        self._open_seq, self._dropped_short = seq, dropped

    def _offer_partial(self, open_segment: OpenSegment) -> None:
        snapshot = dataclasses.replace(open_segment, samples=open_segment.samples.copy(),
                                       speech=_copied(open_segment.speech))
        mel = self._features.window() if self._features is not None else None
        utterance = self._utterance_id(snapshot.seq)
        job = Job(lambda engine, should_stop: self._partial(engine, should_stop, snapshot, utterance, mel),
                  len(snapshot.samples) / SAMPLE_RATE, partial=True)
        self._partial_job = (snapshot.seq, job)
        self.lane.offer_partial(job)

    def _speculate(self, open_segment: OpenSegment) -> None:
        samples = self._heard(open_segment.samples, open_segment.start_sample, open_segment.speech_end_sample).copy()
        start_sample, speech = open_segment.start_sample, _copied(open_segment.speech)
        speculation = Speculation(open_segment.speech_frames, self.continuation,
                                  lambda: self._after_tail(samples, start_sample, speech)[0],
                                  len(samples) / SAMPLE_RATE, vocabulary=self._utterance_id(open_segment.seq).vocabulary)
        self._speculating = _Speculating(open_segment.seq, speculation)
        self.stats.speculations += 1
        self.lane.submit(speculation.job, stop=None)

    def _failed(self, segment: SpeechSegment, exc: Exception) -> None:
        if isinstance(exc, LaneFull):  # on the capture thread, from submit()
            log.warning("inference is behind: dropped %.1f s of queued speech (%d dropped so far)",
                        segment.duration_s, self.lane.dropped)
            self.report_error("inference behind: queued speech dropped",
                              f"{segment.duration_s:.1f} s from {segment.start_utc.isoformat()}")
            return
        self.stats.failures += 1  # on the worker thread: the engine raised
        self.report_error(f"transcription failed: {exc}", segment.start_utc.isoformat())

    def _heard(self, samples: np.ndarray, start_sample: int, speech_end_sample: int) -> np.ndarray:
        """What the decode of a segment ended by a pause reads: what a speculation taken in
        that pause holds (continuation.decode_until), so the transcript is the same text whether
        the speculation was ready in time or not."""
        speech_end = speech_end_sample - start_sample if speech_end_sample else 0
        return samples[: decode_until(samples, speech_end, self.options.speculate_after_ms)]

    # ------------------------------------------------------------------ worker thread (jobs)
    def _after_tail(self, samples: np.ndarray, start_sample: int,
                    speech: SpeechFrames | None) -> tuple[Heard, _Tail | None]:
        """The samples as float32 audio with the VAD's verdict on them, the carried tail before
        them when they continue it (the continuation holds the text before the tail); the tail
        prepended, if any. A tail the audio does not continue never will be (segments come in
        stream order: one between was dropped): it is forgotten, and so is the text before it."""
        audio = samples.astype(np.float32) / INT16_SCALE
        tail = self._tail
        if tail is not None and tail.segment.end_sample == start_sample:
            joined = (tail.heard.speech.then(speech) if tail.heard.speech is not None and speech is not None
                      else None)
            return Heard(np.concatenate([tail.heard.audio, audio]), joined), tail
        if tail is not None or self.continuation.context:  # nor is the text of a run whose decode failed
            self._tail = None
            self.continuation.end()
        return Heard(audio, speech), None

    def _final(self, engine: Engine, segment: SpeechSegment, utterance: _Utterance,
               speculation: Speculation | None) -> None:
        self.status("transcribing")
        samples = segment.samples if segment.cut else self._heard(segment.samples, segment.start_sample,
                                                                  segment.speech_end_sample)
        heard, tail = self._after_tail(samples, segment.start_sample, segment.speech)
        self._tail = None  # taken: a final consumes the tail it continues
        if tail is not None:  # the transcript covers the tail too
            segment = dataclasses.replace(segment, start_sample=tail.segment.start_sample,
                                          start_utc=tail.segment.start_utc)
        # a cut in a pause ends the segment's words: decode it as complete (no tail carried)
        decoded = self.continuation.decode(engine, heard, final=not segment.cut or segment.cut_in_pause,
                                           speculation=speculation, vocabulary=utterance.vocabulary)
        if decoded.speculated:
            self.stats.speculation_hits += 1  # decoded during the hangover
        else:
            log.debug("segment %d decoded at its end (speculation: %s)", segment.seq,
                      "none" if speculation is None else speculation.state)
        result = decoded.result
        self.stats.segments += 1
        self.stats.audio_s += len(heard.audio) / SAMPLE_RATE
        self.stats.busy_s += decoded.busy_s
        if segment.cut and result.consumed_samples < len(heard.audio):
            segment = self._keep_tail(segment, heard, result)
        else:
            self.continuation.end()
        self._publish(segment, utterance, result, decoded.busy_s, partial=False)
        self.status("listening")

    def _keep_tail(self, segment: SpeechSegment, heard: Heard, result: Transcription) -> SpeechSegment:
        """Carry the audio the result left unconsumed to the next (contiguous) segment; returns
        the segment the transcript covers, which ends where that tail starts."""
        start = segment.start_sample + result.consumed_samples
        tail = dataclasses.replace(segment, start_sample=start,
                                   start_utc=segment.start_utc + _seconds(result.consumed_samples))
        consumed = result.consumed_samples
        speech = heard.speech.after(consumed) if heard.speech is not None else None
        self._tail = _Tail(Heard(heard.audio[consumed:], speech), tail)
        self.continuation.move_on(result)
        return dataclasses.replace(segment, end_sample=start, end_utc=tail.start_utc)

    def _partial(self, engine: Engine, should_stop: Callable[[], bool], open_segment: OpenSegment, utterance: _Utterance,
                 mel: np.ndarray | None) -> None:
        heard, tail = self._after_tail(open_segment.samples, open_segment.start_sample, open_segment.speech)
        # a carried tail goes first: the features computed are not this audio's
        decoded = self.continuation.decode(engine, heard, final=True, should_stop=should_stop,
                                           features=mel if tail is None else None,
                                           vocabulary=utterance.vocabulary, partial=True)
        result = decoded.result
        n = len(open_segment.samples)
        segment = SpeechSegment(samples=open_segment.samples, start_sample=open_segment.start_sample,
                                end_sample=open_segment.start_sample + n,
                                start_utc=self.segmenter.clock.utc(open_segment.start_sample),
                                end_utc=self.segmenter.clock.utc(open_segment.start_sample + n),
                                speech_end_mono=open_segment.speech_end_mono, seq=open_segment.seq,
                                speech_frames=open_segment.speech_frames)
        self._publish(segment, utterance, result, decoded.busy_s, partial=True)

    def _publish(self, segment: SpeechSegment, utterance: _Utterance, result: Transcription, busy_s: float,
                 partial: bool) -> None:
        if not result.text:
            if not partial:
                self.stats.empty += 1
            return
        transcript = Transcript(utterance.id, segment, result, busy_s * 1e3, partial=partial)
        for publisher in self.publishers:
            publisher.publish(transcript)
        if partial:
            self.stats.partials += 1
            return
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

        s = self.stats
        return {
            "latency_ms_p50": pct(0.5), "latency_ms_p95": pct(0.95),
            "real_time_factor": round(s.busy_s / s.audio_s, 4) if s.audio_s else None,
            "queue_depth": self.lane.depth, "queue_s": round(self.lane.seconds, 2),
            "transcripts": s.transcripts, "segments": s.segments, "failures": s.failures,
            "partials": s.partials, "speculations": s.speculations, "speculation_hits": s.speculation_hits,
            "dropped_segments": self.lane.dropped, "dropped_s": round(self.lane.dropped_seconds, 2),
            "gate_drops": dict(getattr(self.worker.engine, "gate_failures", {})),
            "capture": _counters(self.source),
            "segmenter": dataclasses.asdict(self.segmenter.counters),
        }


def _copied(speech: SpeechFrames | None) -> SpeechFrames | None:
    """A verdict that outlives the segmenter's next push (its flags may be a view)."""
    return dataclasses.replace(speech, flags=speech.flags.copy()) if speech is not None else None


def _seconds(samples: int) -> dt.timedelta:
    return dt.timedelta(seconds=samples / SAMPLE_RATE)


def _counters(source: AudioSource) -> dict:
    """A source's counters, for the sources that keep them (the microphone's overflows)."""
    counters = getattr(source, "counters", None)
    return dataclasses.asdict(counters) if counters is not None else {}
