"""One Wyoming transcription (`transcribe`, `audio-start`, `audio-chunk`..., `audio-stop`), apart
from the protocol: audio of any rate, width and channels in, 16 kHz mono float32 kept (bounded
by `wyoming.max_audio_s`), jobs at the inference worker, text out through callbacks.

Decoding while the user still speaks:
- partial jobs re-decode the audio not yet committed, every `pipeline.partial_interval_ms`;
  their texts reach the client as `transcript-chunk` deltas of the words two consecutive
  partial results agree on (Wyoming clients append chunks; the final `transcript` rules);
- the session runs the VAD on the audio as it arrives: once a pause has lasted
  `pipeline.speculate_after_ms`, the audio so far is decoded at once. When `audio-stop` comes
  with no speech after that pause (Home Assistant stops after its own VAD's silence), that
  result is the transcript: nothing is left to decode after the stop;
- once the audio not yet committed exceeds the model's window, a commit job decodes its first
  window as unfinished speech and keeps the text up to the last complete timestamp, so a long
  request leaves at most about one window to decode at the end. Each job carries on from the
  committed text (`Transcription.context`): the request reads as `edgeasr transcribe` reads
  the same audio, window by window (measured on the dev set: committing whatever had arrived,
  without that context, cost 7 points of WER over 10 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from edgeasr.errors import EdgeAsrError
from edgeasr.stages import SAMPLE_RATE, SpeechDetector
from edgeasr.worker import Job, Lane, LaneFull

SAMPLE_TYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype("<i2"), 4: np.dtype("<i4")}  # width in bytes
FULL_SCALE = {1: 128.0, 2: 32768.0, 4: 2147483648.0}
INT16_SCALE = 32767.0


class SessionError(EdgeAsrError):
    """What the client sent cannot be transcribed (format, size, order); it is told so."""

    code = "bad-request"


class SessionTooLong(SessionError):
    code = "audio-too-long"


@dataclass(frozen=True)
class Result:
    text: str
    language: str


class StablePrefix:
    """Words that two consecutive partial results agree on; each word is handed out once, as a
    delta a client appends ("word" first, then " word ...")."""

    def __init__(self) -> None:
        self._previous: list[str] = []
        self.emitted: list[str] = []

    def update(self, hypothesis: str) -> str:
        """The text to append now (empty when nothing new is agreed on)."""
        words = hypothesis.split()
        agreed: list[str] = []
        for a, b in zip(self._previous, words):
            if a != b:
                break
            agreed.append(a)
        self._previous = words
        return self._extend(agreed)

    def rest(self, final: str) -> str:
        """What the final text adds to the chunks handed out, when it continues them."""
        return self._extend(final.split())

    def _extend(self, words: list[str]) -> str:
        n = len(self.emitted)
        if len(words) <= n or words[:n] != self.emitted:
            return ""  # nothing new, or a revision of words already handed out
        new = words[n:]
        self.emitted = list(words)
        return (" " if n else "") + " ".join(new)


def to_float(pcm: bytes, width: int, channels: int) -> np.ndarray:
    """Interleaved PCM -> float32 mono in [-1, 1) (channels averaged)."""
    frame = width * channels
    usable = len(pcm) - len(pcm) % frame
    samples = np.frombuffer(pcm[:usable], dtype=SAMPLE_TYPES[width]).astype(np.float32)
    if width == 1:
        samples -= 128.0  # 8-bit PCM is unsigned
    samples /= FULL_SCALE[width]
    return samples.reshape(-1, channels).mean(axis=1) if channels > 1 else samples


@dataclass
class _Speculation:
    speech_frames: int  # the session's speech when it was taken: more means it is stale
    committed: int  # and its committed samples: a commit since makes it stale too
    job: Job
    text: str | None = None


@dataclass(frozen=True)
class SessionOptions:
    window_s: float  # the engine's window
    max_audio_s: float  # wyoming.max_audio_s
    partial_interval_ms: int  # pipeline.partial_interval_ms (0: none)
    speculate_after_ms: int | None  # pipeline.speculate_after_ms (None: no speculation)
    frame_ms: int  # vad.frame_ms


class Session:
    """Audio of one request at 16 kHz, and its jobs. Audio arrives on the server's event-loop
    thread, jobs run on the worker thread: the audio buffer is shared under a lock."""

    def __init__(self, lane: Lane, options: SessionOptions, detector: SpeechDetector, *,
                 language: str | None, on_partial: Callable[[str], None],
                 on_final: Callable[[Result], None], on_error: Callable[[Exception], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lane, self.options, self.detector = lane, options, detector
        self.language, self.clock = language, clock
        self.window = int(options.window_s * SAMPLE_RATE)
        self.frame = SAMPLE_RATE * options.frame_ms // 1000
        self.on_partial, self.on_final, self.on_error = on_partial, on_final, on_error
        self._lock = threading.Lock()
        self._audio = np.zeros(0, np.float32)
        self._judged = 0  # samples the VAD has seen
        self._speech_frames = 0
        self._silent_frames = 0  # at the end
        self._committed = 0  # samples whose text is in _text
        self._text = ""  # committed text
        self._context: tuple[int, ...] = ()  # its last tokens: the prompt of what follows (worker thread)
        self._language = language or ""
        self._format: tuple[int, int, int] | None = None
        self._resampler: Any = None
        self._partial_due = 0.0
        self._committing = False
        self._speculation: _Speculation | None = None
        self.prefix = StablePrefix()
        self.speculation_used = False

    # -- the event-loop thread ----------------------------------------------------------------
    def start(self, rate: int, width: int, channels: int) -> None:
        if width not in SAMPLE_TYPES:
            raise SessionError(f"audio-start: width {width} is not supported (1, 2 or 4 bytes)")
        if not 1000 <= rate <= 384_000 or not 1 <= channels <= 32:
            raise SessionError(f"audio-start: rate {rate} Hz and {channels} channels are not usable")
        self._format = (rate, width, channels)
        if rate != SAMPLE_RATE:
            self._resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
        self._partial_due = self.clock() + self.options.partial_interval_ms / 1000

    def add(self, pcm: bytes, rate: int, width: int, channels: int) -> None:
        if self._format is None:
            raise SessionError("audio-chunk before audio-start")
        if (rate, width, channels) != self._format:
            raise SessionError(f"audio-chunk format {rate} Hz/{width} B/{channels} ch differs from "
                               f"audio-start's {self._format[0]} Hz/{self._format[1]} B/{self._format[2]} ch")
        mono = to_float(pcm, width, channels)
        if self._resampler is not None:
            mono = self._resampler.resample_chunk(mono)
        self._append(mono)
        self._listen()
        pending = len(self._audio) - self._committed
        if pending > self.window and not self._committing:
            self._committing = True
            self._submit(Job(self._commit, pending / SAMPLE_RATE, failed=self.on_error))
        elif self._silent_frames:
            self._maybe_speculate()
        elif self.options.partial_interval_ms and self.clock() >= self._partial_due:
            self._partial_due = self.clock() + self.options.partial_interval_ms / 1000
            self.lane.offer_partial(Job(self._partial, min(pending, self.window) / SAMPLE_RATE, partial=True))

    def stop(self) -> None:
        """audio-stop: the final job (after any commit or speculation still queued)."""
        if self._format is None:
            raise SessionError("audio-stop before audio-start")
        if self._resampler is not None:
            self._append(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
            self._listen()
        speculation = self._speculation
        if speculation is not None and speculation.speech_frames != self._speech_frames:
            speculation.job.cancel()
            speculation = None
        self._submit(Job(lambda engine, should_stop: self._final(engine, speculation),
                         self.seconds, failed=self.on_error))

    def close(self) -> None:
        """The client went away: nothing of this session runs any more."""
        self.lane.close()

    @property
    def seconds(self) -> float:
        return len(self._audio) / SAMPLE_RATE

    def _append(self, mono: np.ndarray) -> None:
        with self._lock:
            if len(self._audio) + len(mono) > self.options.max_audio_s * SAMPLE_RATE:
                raise SessionTooLong(f"more than {self.options.max_audio_s:g} s of audio "
                                     "(wyoming.max_audio_s)")
            self._audio = np.concatenate([self._audio, mono.astype(np.float32, copy=False)])

    def _listen(self) -> None:
        """The VAD over the new whole frames: speech so far, and the pause at the end."""
        while self._judged + self.frame <= len(self._audio):
            frame = self._audio[self._judged : self._judged + self.frame]
            int16 = np.clip(frame * INT16_SCALE, -32768, 32767).astype(np.int16)
            self._judged += self.frame
            if self.detector.is_speech(int16):
                self._speech_frames += 1
                self._silent_frames = 0
                if self._speculation is not None:
                    self._speculation.job.cancel()  # speech resumed: that decode is stale
                    self._speculation = None
            else:
                self._silent_frames += 1

    def _maybe_speculate(self) -> None:
        after = self.options.speculate_after_ms
        if (after is None or not self._speech_frames or self._speculation is not None
                or self._silent_frames * self.options.frame_ms < after):
            return
        speculation = _Speculation(self._speech_frames, self._committed, Job(lambda e, s: None, 0.0))

        def run(engine: Any, should_stop: Callable[[], bool]) -> None:
            audio, committed = self._pending()
            if committed != speculation.committed:
                return  # a commit came first: the final decodes what is left
            speculation.text = self._transcribe(engine, audio, final=True, should_stop=should_stop).text

        speculation.job = Job(run, (len(self._audio) - self._committed) / SAMPLE_RATE, failed=lambda exc: None)
        self._speculation = speculation
        self._submit(speculation.job)

    def _submit(self, job: Job) -> None:
        try:
            self.lane.submit(job)
        except LaneFull as exc:
            raise SessionError(f"the server is busy: {exc}") from exc

    # -- the worker thread ----------------------------------------------------------------------
    def _pending(self) -> tuple[np.ndarray, int]:
        with self._lock:
            return self._audio[self._committed:], self._committed

    def _transcribe(self, engine: Any, audio: np.ndarray, final: bool,
                    should_stop: Callable[[], bool] | None = None, max_windows: int | None = None) -> Any:
        result = engine.transcribe(audio, final=final, language=self.language, should_stop=should_stop,
                                   prompt=self._context, max_windows=max_windows)
        if result.language:
            self._language = result.language
        return result

    def _commit(self, engine: Any, should_stop: Callable[[], bool]) -> None:
        audio, _ = self._pending()  # more than a window: the first one is decoded as offline
        result = self._transcribe(engine, audio, final=False, max_windows=1)
        with self._lock:
            self._committed += result.consumed_samples
            self._text = _join(self._text, result.text)
        self._context = result.context
        self._committing = False

    def _partial(self, engine: Any, should_stop: Callable[[], bool]) -> None:
        audio, _ = self._pending()
        if len(audio):
            result = self._transcribe(engine, audio[: self.window], final=True, should_stop=should_stop)
            delta = self.prefix.update(_join(self._text, result.text))
            if delta:
                self.on_partial(delta)

    def _final(self, engine: Any, speculation: _Speculation | None) -> None:
        audio, committed = self._pending()
        text = self._text
        if speculation is not None and speculation.text is not None and speculation.committed == committed:
            text = _join(text, speculation.text)  # decoded during the pause before audio-stop
            self.speculation_used = True
        elif len(audio):
            text = _join(text, self._transcribe(engine, audio, final=True).text)
        self.on_final(Result(" ".join(text.split()), self._language or "en"))


def _join(a: str, b: str) -> str:
    return f"{a.strip()} {b.strip()}".strip()
