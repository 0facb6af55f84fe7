"""Speech segmentation: a push-style webrtcvad state machine with no I/O.

Audio is judged in VAD frames (10/20/30 ms). A segment opens on the first speech frame
(with up to `pre_roll_ms` of the audio before it), runs while non-speech stays shorter
than `hangover_ms`, and closes with that hangover included. Segments with less than
`min_speech_ms` of speech frames are dropped (counted). A segment never exceeds the
model's window: a pause of `cut_pause_ms` within `cut_search_s` of the limit is cut
at once; otherwise at the limit it is cut after the quietest frame of the last
`cut_search_s` (non-speech frames first: `cut_in_pause`). The next segment continues
from exactly that sample, so the pieces concatenate to the original audio (`cut=True`
on all but the last). Everything is held in preallocated frame arrays of one window.

Which detector judges the frames is `vad.detector` (edgeasr/audio/vad.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgeasr.audio.clock import StreamClock
from edgeasr.audio.vad import make_detector
from edgeasr.config import VadOptions
from edgeasr.errors import ConfigError
from edgeasr.stages import (
    SAMPLE_RATE,
    AudioChunk,
    OpenSegment,
    SegmenterCounters,
    SpeechDetector,
    SpeechFrames,
    SpeechSegment,
    frames_reaching,
    quietest_frame,
)


class Segmenter:
    """stages.Segmenter: the VAD state machine above, over one window of preallocated frames."""

    def __init__(
        self,
        options: VadOptions,
        max_window_s: float,
        clock: StreamClock,
        detector: SpeechDetector | None = None,
    ) -> None:
        fms = options.frame_ms
        self._n = SAMPLE_RATE * fms // 1000  # samples per VAD frame
        self._max_frames = int(round(max_window_s * 1000) // fms)
        self._pre_roll = frames_reaching(options.pre_roll_ms, fms)
        if self._max_frames < self._pre_roll + 2:
            raise ConfigError(
                f"vad.max_window_s: {max_window_s} is not allowed "
                f"(longer than vad.pre_roll_ms + 2 frames)"
            )
        self._hangover = max(1, frames_reaching(options.hangover_ms, fms))
        self._min_speech = frames_reaching(options.min_speech_ms, fms)
        self._search = min(max(1, frames_reaching(options.cut_search_s * 1000, fms)), self._max_frames - 1)
        self._cut_pause = max(1, frames_reaching(options.cut_pause_ms, fms))
        self._options = options
        self._clock = clock
        self._detector = detector or make_detector(options)
        cap = self._max_frames
        self._audio = np.zeros((cap, self._n), dtype=np.int16)
        self._speech = np.zeros(cap, dtype=bool)
        self._energy = np.zeros(cap, dtype=np.float32)
        self._mono = np.zeros(cap, dtype=np.float64)  # capture time of each frame's end
        self._partial = np.zeros(self._n, dtype=np.int16)  # samples short of a frame
        self._counters = SegmenterCounters()
        self.reset()

    @property
    def counters(self) -> SegmenterCounters:
        return replace(self._counters)

    @property
    def clock(self) -> StreamClock:
        return self._clock

    def open_segment(self, copy: bool = True) -> OpenSegment | None:
        """A snapshot of the segment being built, or None while no one speaks. copy=False: its
        samples are a view of the segmenter's buffer, valid until the next push()."""
        if not self._open:
            return None
        spoken = np.flatnonzero(self._speech[: self._count])
        return OpenSegment(
            seq=self._seq,
            start_sample=self._first,
            samples=self._audio[: self._count].reshape(-1).copy() if copy else self._audio[: self._count].reshape(-1),
            speech_frames=len(spoken),
            silence_ms=self._silence_run * self._options.frame_ms,
            speech_end_mono=float(self._mono[spoken[-1]]) if len(spoken) else self._speech_mono,
            speech_end_sample=self._first + (int(spoken[-1]) + 1) * self._n if len(spoken) else 0,
            speech=SpeechFrames(self._speech[: self._count].copy() if copy else self._speech[: self._count], self._n),
        )

    def reset(self) -> None:
        """Forget all audio and start a new stream (counters are kept)."""
        self._count = 0  # frames held: the open segment, or the pre-roll when idle
        self._first = 0  # stream sample of frame 0
        self._open = False
        self._continuation = False  # the open segment continues a cut one
        self._silence_run = 0
        self._speech_mono = 0.0  # capture time of the last speech frame seen
        self._partial_len = 0
        self._next_sample: int | None = None
        self._seq = 0

    def push(self, chunk: AudioChunk) -> list[SpeechSegment]:
        """Feed audio in stream order; returns the segments it completed."""
        out: list[SpeechSegment] = []
        if self._next_sample is not None and chunk.start_sample != self._next_sample:
            out += self.flush()  # a gap (dropped audio): never join across it
            self._next_sample = None
        if self._next_sample is None:
            self._first = chunk.start_sample - self._count * self._n - self._partial_len
        self._clock.observe(chunk)
        samples = chunk.samples
        end = chunk.start_sample + len(samples)
        self._next_sample = end
        if self._partial_len:
            samples = np.concatenate([self._partial[: self._partial_len], samples])
        n_frames = len(samples) // self._n
        for i in range(n_frames):
            frame = samples[i * self._n : (i + 1) * self._n]
            frame_end = end - (len(samples) - (i + 1) * self._n)
            t_mono = chunk.t_mono - (end - frame_end) / SAMPLE_RATE
            self._step(frame, t_mono, out)
        rest = samples[n_frames * self._n :]
        self._partial[: len(rest)] = rest
        self._partial_len = len(rest)
        return out

    def flush(self) -> list[SpeechSegment]:
        """End of stream (or a gap): close the open segment; a partial frame is dropped."""
        seg = self._close() if self._open else None
        self._first += (self._count * self._n) + self._partial_len
        self._count = 0
        self._partial_len = 0
        return [seg] if seg is not None else []

    # --- the state machine -----------------------------------------------------------

    def _step(self, frame: np.ndarray, t_mono: float, out: list[SpeechSegment]) -> None:
        if self._open and self._count == self._max_frames:
            out.append(self._cut(self._count - self._search))
        is_speech = self._detector.is_speech(frame)
        k = self._count
        self._audio[k] = frame
        self._speech[k] = is_speech
        self._energy[k] = np.mean(np.square(frame, dtype=np.float32))
        self._mono[k] = t_mono
        self._count += 1
        if not self._open:
            if is_speech:
                self._open, self._silence_run = True, 0
            else:
                self._drop_front(self._count - self._pre_roll)
            return
        self._silence_run = 0 if is_speech else self._silence_run + 1
        if (self._cut_pause <= self._silence_run < min(self._hangover, self._count)
                and self._count > self._max_frames - self._search):
            # a pause near the limit (however long it lasted before it got near): cut in it
            # now rather than at the limit, where the text spoken before it would wait for
            # the window to fill. Not a piece that is all pause (what a cut leaves).
            out.append(self._cut(self._count - self._silence_run))
            return
        if self._silence_run >= self._hangover:
            closed = self._close()
            if closed is not None:
                out.append(closed)
                self._drop_front(self._count)  # emitted audio never becomes pre-roll again
            else:
                self._drop_front(self._count - self._pre_roll)

    def _cut(self, lo: int) -> SpeechSegment:
        """Split the window after its quietest frame from frame `lo` on."""
        k, pause = quietest_frame(self._speech[lo : self._count], self._energy[lo : self._count])
        k += lo
        seg = self._segment(k + 1, cut=True, in_pause=pause)
        self._speech_mono = seg.speech_end_mono  # for a continuation holding no speech
        self._counters.cuts += 1
        self._drop_front(k + 1)
        # after a cut mid-speech the next piece is kept whatever it holds (the engine carries
        # the unfinished words into it); after a pause it is judged like any segment
        self._continuation = not pause
        spoken = np.flatnonzero(self._speech[: self._count])
        self._silence_run = self._count - 1 - int(spoken[-1]) if len(spoken) else self._count
        return seg

    def _close(self) -> SpeechSegment | None:
        speech_frames = int(self._speech[: self._count].sum())
        keep = self._continuation or speech_frames >= self._min_speech
        seg = self._segment(self._count, cut=False) if keep else None
        if not keep:
            self._counters.dropped_short += 1
        self._open = self._continuation = False
        self._silence_run = 0
        return seg

    def _segment(self, n_frames: int, cut: bool, in_pause: bool = False) -> SpeechSegment:
        start = self._first
        end = start + n_frames * self._n
        spoken = np.flatnonzero(self._speech[:n_frames])
        # a continuation may hold only the quiet after the speech of the piece before it
        speech_end_mono = float(self._mono[spoken[-1]]) if len(spoken) else self._speech_mono
        seg = SpeechSegment(
            samples=self._audio[:n_frames].reshape(-1).copy(),
            start_sample=start,
            end_sample=end,
            start_utc=self._clock.utc(start),
            end_utc=self._clock.utc(end),
            speech_end_mono=speech_end_mono,
            cut=cut,
            cut_in_pause=in_pause,
            seq=self._seq,
            speech_frames=len(spoken),
            speech_end_sample=start + (int(spoken[-1]) + 1) * self._n if len(spoken) else 0,
            speech=SpeechFrames(self._speech[:n_frames].copy(), self._n),
        )
        self._seq += 1
        self._counters.segments += 1
        return seg

    def _drop_front(self, k: int) -> None:
        """Forget the first k frames held (shifting the rest to the front)."""
        if k <= 0:
            return
        rest = self._count - k
        for arr in (self._audio, self._speech, self._energy, self._mono):
            arr[:rest] = arr[k : self._count]
        self._count = rest
        self._first += k * self._n
