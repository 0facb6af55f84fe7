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
- with `wyoming.endpoint_ms`, the transcript goes out once the silence after the speech has
  lasted that long, speech being at least `vad.min_speech_ms` of it (what the segmenter keeps
  as speech: a click before a command is none, and webrtcvad hears one in the first frames of
  most recordings; on the recorded commands, an endpoint after any speech frame answered 10 of
  15 empty at 250 ms and 4 at 700 ms, after 250 ms of speech none at 250 ms or more): at the end of the first VAD frame by which it has (within one frame of it,
  whatever `vad.frame_ms`); the audio after that frame is not heard;
- once the audio not yet committed exceeds the model's window, a commit job decodes its first
  window as unfinished speech and keeps the text up to the last complete timestamp, so a long
  request leaves at most about one window to decode at the end. Each job carries on from the
  committed text (`Transcription.context`): the request reads as `edgeasr transcribe` reads
  the same audio, window by window (measured on the dev set: committing whatever had arrived,
  without that context, cost 7 points of WER over 10 s).

The speculation and the committed text are edgeasr/continuation.py's, as the microphone
pipeline's are.

Cost linear in the audio however it is chunked: a chunk's bytes are appended to a raw buffer,
converted once at least `CONVERT_S` of audio is there (a client sending one sample per event
costs a byte copy per event, not a conversion), into a float buffer that grows by doubling.
`wyoming.max_audio_s` is checked on the bytes, before anything is converted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from edgeasr.config import VadOptions
from edgeasr.continuation import Continuation, Decoded, Heard, Speculation, decode_until
from edgeasr.errors import EdgeAsrError
from edgeasr.stages import SAMPLE_RATE, Engine, SpeechDetector, SpeechFrames, Vocabulary, frames_reaching
from edgeasr.worker import Job, Lane, LaneFull

SAMPLE_TYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype("<i2"), 4: np.dtype("<i4")}  # width in bytes
FULL_SCALE = {1: 128.0, 2: 32768.0, 4: 2147483648.0}
INT16_SCALE = 32767.0
MIN_RATE, MAX_RATE = 1000, 384_000  # Hz a client may send
MAX_CHANNELS = 32
CONVERT_S = 0.02  # raw audio gathered before it is converted (Home Assistant's chunks are longer)


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


def audio_format(rate: Any, width: Any, channels: Any) -> tuple[int, int, int]:
    """An audio-start's format, checked: what the session can convert."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rate, width, channels)):
        raise SessionError(f"audio-start: rate, width and channels must be integers (got {rate!r}, {width!r}, "
                           f"{channels!r})"[:200])
    if width not in SAMPLE_TYPES:
        raise SessionError(f"audio-start: width {width} is not supported (1, 2 or 4 bytes)")
    if not MIN_RATE <= rate <= MAX_RATE or not 1 <= channels <= MAX_CHANNELS:
        raise SessionError(f"audio-start: rate {rate} Hz and {channels} channels are not usable "
                           f"({MIN_RATE}..{MAX_RATE} Hz, 1..{MAX_CHANNELS} channels)")
    return rate, width, channels


class _Samples:
    """16 kHz float32 audio, appended to in amortised constant time (capacity doubles). Views
    handed out stay valid: a reallocation leaves the old array to them."""

    def __init__(self, capacity: int) -> None:
        self._buf = np.zeros(max(1, capacity), np.float32)
        self.n = 0

    def append(self, samples: np.ndarray) -> None:
        need = self.n + len(samples)
        if need > len(self._buf):
            grown = np.zeros(max(need, 2 * len(self._buf)), np.float32)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : need] = samples
        self.n = need

    def view(self, start: int = 0, end: int | None = None) -> np.ndarray:
        return self._buf[start : self.n if end is None else min(end, self.n)]

    def truncate(self, n: int) -> None:
        """Forget the samples from `n` on (views handed out keep theirs)."""
        self.n = min(self.n, n)


def vad_samples(audio: np.ndarray) -> np.ndarray:
    """The session's float audio as the VAD judges it (int16)."""
    return np.clip(audio * INT16_SCALE, -32768, 32767).astype(np.int16)


def to_float(pcm: bytes, width: int, channels: int) -> np.ndarray:
    """Interleaved PCM -> float32 mono in [-1, 1) (channels averaged)."""
    frame = width * channels
    usable = len(pcm) - len(pcm) % frame
    samples = np.frombuffer(pcm[:usable], dtype=SAMPLE_TYPES[width]).astype(np.float32)
    if width == 1:
        samples -= 128.0  # 8-bit PCM is unsigned
    samples /= FULL_SCALE[width]
    return samples.reshape(-1, channels).mean(axis=1) if channels > 1 else samples


@dataclass(frozen=True)
class SessionOptions:
    window_s: float  # the engine's window
    max_audio_s: float  # wyoming.max_audio_s
    partial_interval_ms: int  # pipeline.partial_interval_ms (0: none)
    speculate_after_ms: int | None  # pipeline.speculate_after_ms (None: no speculation)
    frame_ms: int  # vad.frame_ms
    endpoint_ms: int | None = None  # wyoming.endpoint_ms (None: the transcript waits for audio-stop)
    min_speech_ms: int = VadOptions.min_speech_ms  # vad.min_speech_ms: the speech an endpoint follows


class Session:
    """Audio of one request at 16 kHz, and its jobs. Audio arrives on the server's event-loop
    thread, jobs run on the worker thread: the audio buffer is shared under a lock."""

    def __init__(self, lane: Lane, options: SessionOptions, detector: SpeechDetector, *,
                 language: str | None, on_partial: Callable[[str], None], vocabulary: Vocabulary = Vocabulary(),
                 on_final: Callable[[Result], None], on_error: Callable[[Exception], None],
                 on_endpoint: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lane, self.options, self.detector = lane, options, detector
        self.language, self.clock, self.vocabulary = language, clock, vocabulary
        self.window = int(options.window_s * SAMPLE_RATE)
        self.frame = SAMPLE_RATE * options.frame_ms // 1000
        # the silent frames by which endpoint_ms has passed: the endpoint comes within a frame
        # of the silence reaching it, whatever the frame length
        self.endpoint_frames = (None if options.endpoint_ms is None
                                else frames_reaching(options.endpoint_ms, options.frame_ms))
        self.speech_before_endpoint = frames_reaching(options.min_speech_ms, options.frame_ms)
        self.on_partial, self.on_final, self.on_error = on_partial, on_final, on_error
        self.on_endpoint = on_endpoint  # the speech has ended (wyoming.endpoint_ms): answer now
        self._lock = threading.Lock()
        self._audio = _Samples(SAMPLE_RATE)  # grows to at most max_audio_s (and the resampler's tail)
        self._raw = bytearray()  # received, not yet converted
        self._frames_in = 0  # frames received, at the client's rate: what max_audio_s counts
        self._convert_bytes = 1
        self._judged = 0  # samples the VAD has seen
        self._verdicts: list[bool] = []  # its verdict on each frame (the window walk reads them)
        self._speech_frames = 0
        self._silent_frames = 0  # at the end
        self._speech_end = 0  # the end of the last speech frame (samples)
        self._committed = 0  # samples whose text is in _text
        self._text = ""  # committed text
        self.continuation = Continuation()  # the text before what is not committed (worker thread)
        self._language = language or ""
        self._format: tuple[int, int, int] | None = None
        self._resampler: soxr.ResampleStream | None = None
        self._partial_due = 0.0
        self._committing = False
        self._speculation: Speculation | None = None
        self._ended = False  # the endpoint was heard: the audio after it is not
        self.prefix = StablePrefix()

    # -- the event-loop thread ----------------------------------------------------------------
    def start(self, rate: int, width: int, channels: int) -> None:
        self._format = audio_format(rate, width, channels)
        self._convert_bytes = max(1, int(rate * CONVERT_S)) * width * channels
        if rate != SAMPLE_RATE:
            self._resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
        self._partial_due = self.clock() + self.options.partial_interval_ms / 1000

    def budget_bytes(self) -> int:
        """The most audio bytes the session may still take (wyoming.max_audio_s), so that a
        chunk over it is refused before it is read."""
        if self._format is None:
            return 0
        rate, width, channels = self._format
        frame = width * channels
        frames = int(self.options.max_audio_s * rate) - (self._frames_in + len(self._raw) // frame)
        return max(0, frames) * frame + frame - 1 - len(self._raw) % frame

    def add(self, pcm: bytes, rate: object, width: object, channels: object) -> None:
        """Audio as the client sent it; its format must be audio-start's."""
        if self._format is None:
            raise SessionError("audio-chunk before audio-start")
        if (rate, width, channels) != self._format:
            raise SessionError(f"audio-chunk format {rate} Hz/{width} B/{channels} ch differs from "
                               f"audio-start's {self._format[0]} Hz/{self._format[1]} B/{self._format[2]} ch"[:300])
        if len(pcm) > self.budget_bytes():
            raise SessionTooLong(f"more than {self.options.max_audio_s:g} s of audio (wyoming.max_audio_s)")
        if self._ended:
            return  # past the endpoint: not heard
        self._raw += pcm
        if len(self._raw) < self._convert_bytes:
            return  # a tiny chunk: gathered, converted with the next ones
        self._convert()
        pending = self._audio.n - self._committed
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
        self._convert(last=True)
        speculation = self._speculation
        if speculation is not None and speculation.stale(self._speech_frames):
            speculation.cancel()
            speculation = None
        speech_end = self._speech_end
        self._submit(Job(lambda engine, should_stop: self._final(engine, speculation, speech_end),
                         (self._audio.n - self._committed) / SAMPLE_RATE, failed=self.on_error))

    def close(self) -> None:
        """The client went away: nothing of this session runs any more."""
        self.lane.close()

    @property
    def seconds(self) -> float:
        return self._audio.n / SAMPLE_RATE

    def _convert(self, last: bool = False) -> None:
        """The whole frames gathered so far to 16 kHz mono, appended; then the VAD over them."""
        assert self._format is not None
        if self._ended:
            self._raw.clear()
            return
        _, width, channels = self._format
        frame = width * channels
        usable = len(self._raw) - len(self._raw) % frame
        mono = to_float(bytes(self._raw[:usable]), width, channels)
        del self._raw[:usable]
        self._frames_in += usable // frame
        if self._resampler is not None:
            mono = self._resampler.resample_chunk(mono, last=last)
        if len(mono):
            with self._lock:
                self._audio.append(mono)
        self._listen()

    def _listen(self) -> None:
        """The VAD over the new whole frames: speech so far, and the pause at the end."""
        while self._judged + self.frame <= self._audio.n:
            frame = self._audio.view(self._judged, self._judged + self.frame)
            self._judged += self.frame
            speech = self.detector.is_speech(vad_samples(frame))
            with self._lock:
                self._verdicts.append(speech)
            if speech:
                self._speech_frames += 1
                self._silent_frames = 0
                self._speech_end = self._judged
                if self._speculation is not None:
                    self._speculation.cancel()  # speech resumed: that decode is stale
                    self._speculation = None
            else:
                self._silent_frames += 1
                if (self._speech_frames >= max(1, self.speech_before_endpoint)
                        and self._silent_frames == self.endpoint_frames):
                    self._end()
                    return

    def _end(self) -> None:
        """The silence after the speech reached wyoming.endpoint_ms: what follows this frame,
        in this chunk or later, is not heard; the transcript goes out now."""
        self._ended = True
        with self._lock:
            self._audio.truncate(self._judged)
        self.on_endpoint()

    def _maybe_speculate(self) -> None:
        after = self.options.speculate_after_ms
        if (after is None or not self._speech_frames or self._speculation is not None
                or self._silent_frames * self.options.frame_ms < after):
            return
        speech_end = self._speech_end
        speculation = Speculation(self._speech_frames, self.continuation, lambda: self._heard(speech_end),
                                  (self._audio.n - self._committed) / SAMPLE_RATE, **self._request())
        self._speculation = speculation
        self._submit(speculation.job)

    def _submit(self, job: Job) -> None:
        try:
            self.lane.submit(job)
        except LaneFull as exc:
            raise SessionError(f"the server is busy: {exc}") from exc

    # -- the worker thread ----------------------------------------------------------------------
    def _pending(self) -> tuple[Heard, int]:
        """The audio not yet committed with the VAD's verdict on it, and where it starts."""
        with self._lock:
            audio, committed = self._audio.view(self._committed), self._committed
            verdicts = np.array(self._verdicts, dtype=bool)
        return Heard(audio, SpeechFrames(verdicts, self.frame).after(committed)), committed

    def _request(self) -> dict:
        """What the engine hears every decode of this request with."""
        return {"language": self.language, "vocabulary": self.vocabulary}

    def _heard(self, speech_end: int) -> Heard:
        """The audio not yet committed that a final decode reads: up to what a speculation taken
        in the pause after the speech holds (continuation.decode_until), so the transcript is
        the same text whether the speculation was ready in time or not."""
        heard, committed = self._pending()
        end = decode_until(heard.audio, max(0, speech_end - committed), self.options.speculate_after_ms)
        return Heard(heard.audio[:end], heard.speech)

    def _heard_language(self, decoded: Decoded) -> Decoded:
        if decoded.result.language:
            self._language = decoded.result.language
        return decoded

    def _commit(self, engine: Engine, should_stop: Callable[[], bool]) -> None:
        heard, _ = self._pending()  # more than a window: the first one is decoded as offline
        result = self._heard_language(self.continuation.decode(engine, heard, final=False, max_windows=1,
                                                               **self._request())).result
        with self._lock:
            self._committed += result.consumed_samples
            self._text = _join(self._text, result.text)
        self.continuation.move_on(result)
        self._committing = False

    def _partial(self, engine: Engine, should_stop: Callable[[], bool]) -> None:
        heard, _ = self._pending()
        if len(heard.audio):
            result = self._heard_language(self.continuation.decode(
                engine, Heard(heard.audio[: self.window], heard.speech), final=True, should_stop=should_stop,
                partial=True, **self._request())).result
            delta = self.prefix.update(_join(self._text, result.text))
            if delta:
                self.on_partial(delta)

    def _final(self, engine: Engine, speculation: Speculation | None, speech_end: int) -> None:
        heard, text = self._heard(speech_end), self._text
        if len(heard.audio):  # else nothing was said after the text committed
            decoded = self.continuation.decode(engine, heard, final=True, speculation=speculation, **self._request())
            text = _join(text, self._heard_language(decoded).result.text)
        self.on_final(Result(" ".join(text.split()), self._language or "en"))


def _join(a: str, b: str) -> str:
    return f"{a.strip()} {b.strip()}".strip()
