"""The contract between pipeline stages: small frozen dataclasses and Protocols.

Audio flows  capture/sources -> AudioChunk -> segmenter -> SpeechSegment -> transcriber
-> Transcription -> Transcript -> payload -> outbox -> mqtt.  Everything after capture is mono
16 kHz; `SAMPLE_RATE` is the one place that number lives for the pipeline (the model
bundle's manifest carries the same value for the engine and is checked against it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

SAMPLE_RATE = 16_000  # Hz, after capture-side resampling


@dataclass(frozen=True)
class AudioChunk:
    """A block of captured audio, in stream order."""

    samples: np.ndarray  # int16, mono, SAMPLE_RATE
    start_sample: int  # index of samples[0] since the stream started
    t_mono: float  # time.monotonic() when the last sample was captured (or read)


@dataclass(frozen=True)
class SpeechSegment:
    """One speech window cut by the segmenter (at most the model's window long)."""

    samples: np.ndarray  # int16, mono, SAMPLE_RATE: pre-roll + speech + hangover
    start_sample: int  # stream offsets (monotonic by construction)
    end_sample: int
    start_utc: dt.datetime  # wall clock, timezone-aware UTC
    end_utc: dt.datetime
    speech_end_mono: float  # time.monotonic() when the last speech sample was captured
    cut: bool = False  # True when cut at the window limit while speech went on
    cut_in_pause: bool = False  # ... and cut in a pause the VAD found: no word spans the cut
    seq: int = 0  # segment number in this stream
    speech_frames: int = 0  # VAD frames judged speech in it

    @property
    def duration_s(self) -> float:
        return (self.end_sample - self.start_sample) / SAMPLE_RATE


@dataclass(frozen=True)
class Word:
    """A word of a segment, timed from the alignment heads' cross-attention (seconds from the
    audio start, like the segment's). `word` keeps its leading space and punctuation, so a
    segment's words spell its text."""

    word: str
    start: float
    end: float
    probability: float  # mean of its tokens' probabilities


@dataclass(frozen=True)
class TextSegment:
    """A timestamped piece of a transcription (times in seconds from the audio start)."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    words: tuple[Word, ...] = ()  # empty unless word timestamps are on (output.words)


@dataclass(frozen=True)
class Transcription:
    """What the engine made of one piece of audio."""

    text: str
    segments: tuple[TextSegment, ...]
    language: str
    windows: int  # encoder windows run
    tokens: int  # tokens decoded (all windows, prompts excluded)
    consumed_samples: int  # audio accounted for; the rest is carried to the next call
    dropped_windows: int = 0  # windows rejected by the quality gates
    runaway_windows: int = 0  # windows that hit the token cap
    # decoder passes that picked a token: one per generated token, end-of-text included, in
    # every attempt at a window (what the decoder's time is spent on)
    decoder_steps: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)  # features, encoder, decoder
    # the text tokens kept, the last a prompt holds: the `prompt` of the call that decodes
    # the audio after consumed_samples
    context: tuple[int, ...] = ()

    @property
    def avg_logprob(self) -> float:
        n = sum(len(s.tokens) for s in self.segments)
        if not n:
            return 0.0
        return sum(s.avg_logprob * len(s.tokens) for s in self.segments) / n

    @property
    def no_speech_prob(self) -> float:
        return max((s.no_speech_prob for s in self.segments), default=0.0)


@dataclass(frozen=True)
class Transcript:
    """What the front ends hand to publishers: one utterance's transcription."""

    id: str  # the utterance's id (a UUID): its partial results and its final transcript share it
    segment: SpeechSegment  # the audio it covers (times, end of speech)
    transcription: Transcription
    busy_ms: float  # engine time spent on it
    partial: bool = False  # True: the text so far of speech that is still going on


class AudioSource(Protocol):
    """Capture: a microphone, a file or stdin."""

    def read(self, timeout_s: float) -> AudioChunk | None:
        """The next chunk, or None if none arrived within timeout_s."""

    @property
    def ended(self) -> bool:
        """True once a finite source (file, stdin) has delivered everything."""

    def close(self) -> None: ...


class SpeechDetector(Protocol):
    """Is this VAD frame (int16 mono SAMPLE_RATE, 10/20/30 ms) speech?"""

    def is_speech(self, frame: np.ndarray) -> bool: ...


class FeatureStream(Protocol):
    """The engine's features computed while audio arrives (asr.features.MelStream)."""

    def push(self, samples: np.ndarray) -> None: ...

    def window(self, start_sample: int = 0) -> np.ndarray: ...

    def reset(self) -> None: ...


class Engine(Protocol):
    """Speech -> text (edgeasr.asr.transcriber.Transcriber)."""

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None, prompt: Sequence[int] = (),
                   max_windows: int | None = None) -> Transcription:
        """audio: float32 mono SAMPLE_RATE. final=False: a cut window, speech goes on;
        the unconsumed tail (after the last complete timestamp) is left for the next call.
        should_stop() is asked between decoded tokens; yes raises errors.Cancelled.
        features: the audio's log-mel from feature_stream(), when it fits one window.
        prompt: the `context` of the call that decoded the audio just before. max_windows:
        decode at most that many windows, leaving the rest unconsumed."""

    def feature_stream(self) -> FeatureStream:
        """A stream that computes the features of one window while its audio arrives."""


class Publisher(Protocol):
    """Where transcripts go (MQTT through the durable outbox, stdout, ...)."""

    def publish(self, transcript: Transcript) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class Notifier(Protocol):
    """The service manager (systemd's sd_notify; a no-op outside systemd)."""

    def notify(self, state: str) -> None: ...
