"""Speech decoded before its end is known, the same way for both front ends (the microphone
pipeline and the Wyoming sessions).

- **In pieces** (`Continuation`, worker thread): a decode of unfinished speech (a window cut in
  speech, a long request's first window) keeps the text up to its last complete timestamp and
  leaves the rest of the audio; the next decode of the same speech reads that rest first, with
  the text before it as its prompt, as one call over all of it would.
- **Speculatively** (`Speculation`): once a pause has lasted `pipeline.speculate_after_ms`, the
  speech so far is decoded at once. When the speech then ends with nothing more said, the final
  decode takes that result instead of decoding again: the transcript is ready when the end is
  known. Speech after the pause makes it stale.
- **Up to the same audio** (`decode_until`): whether the speculation was ready in time depends
  on the machine, so the decode made without it must read the same audio, or the same speech
  would give different text from one round to the next: both read up to that long past the
  last frame the VAD heard speech in. A VAD can miss quiet speech (webrtcvad heard 3 frames of
  a FLEURS sentence at -67 dBFS): audio past that point as loud as the speech heard is read too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeasr.stages import SAMPLE_RATE, Engine, SpeechFrames, Transcription
from edgeasr.worker import Job

FRAME_S = 0.03  # the frames whose power is compared
# the pause past the speech holds no frame louder than this, against the speech's loud frames
QUIET_DB = -10.0
LOUD_PERCENTILE = 90  # the speech's level: this percentile of its frames' power


def decode_until(samples: np.ndarray, speech_end: int, after_ms: int | None) -> int:
    """How many of `samples` a decode reads, the last speech frame ending at `speech_end`
    (samples from their start; 0: the VAD heard none): up to `after_ms` past it, or all."""
    end = speech_end + (after_ms or 0) * SAMPLE_RATE // 1000
    if after_ms is None or speech_end <= 0 or end >= len(samples):
        return len(samples)
    frame = int(FRAME_S * SAMPLE_RATE)
    heard, rest = _frame_power(samples[:speech_end], frame), _frame_power(samples[end:], frame)
    if len(heard) == 0 or len(rest) == 0:
        return end
    loud = float(np.percentile(heard, LOUD_PERCENTILE))
    return end if float(rest.max()) < loud * 10 ** (QUIET_DB / 10) else len(samples)


def _frame_power(samples: np.ndarray, frame: int) -> np.ndarray:
    n = len(samples) // frame
    x = np.asarray(samples[: n * frame], dtype=np.float32).reshape(n, frame)
    return np.mean(np.square(x), axis=1)


@dataclass(frozen=True)
class Heard:
    """Audio to decode and the VAD's verdict on it, as the front end heard it."""

    audio: np.ndarray  # float32
    speech: SpeechFrames | None = None


@dataclass(frozen=True)
class Decoded:
    result: Transcription
    busy_s: float  # engine time it took (the speculation's, when it is one)
    speculated: bool = False  # a speculation's result, decoded before the end was known


@dataclass(frozen=True)
class _Read:
    """What a speculation's job decoded: after which piece of the speech, how much audio."""

    piece: int
    samples: int
    decoded: Decoded


class Continuation:
    """One front end's speech decoded in pieces. Used on the worker thread only (the one thread
    that runs jobs), so it needs no lock. `context`: the text tokens kept before the audio not
    yet decoded (the next decode's prompt); `piece` counts the decodes that moved it on, so a
    speculation knows whether it read after the same text as the final decode."""

    def __init__(self) -> None:
        self.context: tuple[int, ...] = ()
        self.piece = 0

    def decode(self, engine: Engine, heard: Heard, *, final: bool, speculation: Speculation | None = None,
               **request: Any) -> Decoded:
        """The speech not yet decoded with the text before it as prompt; or the speculation's
        result when it read exactly this audio after the same text. `request`: the rest of
        stages.Engine.transcribe's arguments."""
        if speculation is not None:
            taken = speculation.result_for(self.piece, len(heard.audio))
            if taken is not None:
                return taken
            speculation.cancel()
        t0 = time.monotonic()
        result = engine.transcribe(heard.audio, final=final, prompt=self.context, speech=heard.speech, **request)
        return Decoded(result, time.monotonic() - t0)

    def move_on(self, result: Transcription) -> None:
        """After a decode of unfinished speech: its text is behind, its context the next prompt."""
        self.context = result.context
        self.piece += 1

    def end(self) -> None:
        """The speech is over: what follows starts afresh."""
        self.context = ()
        self.piece += 1


class Speculation:
    """A decode of the speech so far, taken in a pause. Made on the front end's thread, which
    submits `job` and may only `cancel` it; the job runs on the worker, which alone writes and
    reads its result. `heard()` gives what to decode when the job runs (on the worker);
    `request` the rest of the engine's arguments."""

    def __init__(self, speech_frames: int, continuation: Continuation, heard: Callable[[], Heard],
                 seconds: float, **request: Any) -> None:
        self.speech_frames = speech_frames  # the speech when it was taken: more makes it stale
        self.continuation, self.heard, self.request = continuation, heard, request
        self.job = Job(self._run, seconds)  # a failure is the worker's to log: the final decodes again
        self._read: _Read | None = None

    def stale(self, speech_frames: int) -> bool:
        """Was more speech heard since it was taken?"""
        return speech_frames != self.speech_frames

    def cancel(self) -> None:
        self.job.cancel()

    @property
    def state(self) -> str:
        """For the log: what became of it."""
        return "cancelled" if self.job.cancelled.is_set() else "read" if self._read is not None else "not ready"

    def _run(self, engine: Engine, should_stop: Callable[[], bool]) -> None:
        heard = self.heard()  # first: taking what to decode may end a carried run
        piece = self.continuation.piece
        decoded = self.continuation.decode(engine, heard, final=True, should_stop=should_stop, **self.request)
        self._read = _Read(piece, len(heard.audio), Decoded(decoded.result, decoded.busy_s, speculated=True))

    def result_for(self, piece: int, samples: int) -> Decoded | None:
        """Its result, when it read `samples` of audio after the same piece of the speech."""
        read = self._read
        return read.decoded if read is not None and (read.piece, read.samples) == (piece, samples) else None
