"""The contract between pipeline stages: small frozen dataclasses and Protocols.

Audio flows  capture/sources -> AudioChunk -> segmenter -> SpeechSegment (and, while speech
goes on, OpenSegment) -> transcriber -> Transcription -> Transcript -> payload -> outbox -> mqtt.
Everything after capture is mono 16 kHz; `SAMPLE_RATE` is the one place that number lives for
the pipeline (the model bundle's manifest carries the same value for the engine and is
checked against it). docs/architecture.md draws the seams.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

SAMPLE_RATE = 16_000  # Hz, after capture-side resampling



def frames_reaching(ms: float, frame_ms: int) -> int:
    """The VAD frames by which `ms` has passed: a duration in milliseconds as audio judged
    frame by frame takes it (rounded up, never shorter than asked)."""
    return math.ceil(ms / frame_ms)


def quietest_frame(speech: np.ndarray, energy: np.ndarray) -> tuple[int, bool]:
    """Where speech that runs on may be cut, in a span of VAD frames (the segmenter's cut and
    the engine's window walk alike): its quietest non-speech frame (True: a pause, so no word
    spans the cut), or its quietest frame when every one is speech (False)."""
    quiet = np.flatnonzero(~speech)
    if len(quiet):
        return int(quiet[np.argmin(energy[quiet])]), True
    return int(np.argmin(energy)), False


@dataclass(frozen=True)
class SpeechFrames:
    """The VAD's verdict on a piece of audio, frame by frame, as the front end heard it: frame
    i covers samples [offset + i * frame, offset + (i + 1) * frame) of that audio (`offset` <= 0:
    audio cut from a longer stream may start inside a frame)."""

    flags: np.ndarray  # bool, True: speech
    frame: int  # samples per frame
    offset: int = 0

    def after(self, samples: int) -> SpeechFrames:
        """The verdict on the audio from `samples` on: its frames from the one holding that sample."""
        k = max(0, (samples - self.offset) // self.frame)
        return SpeechFrames(self.flags[k:], self.frame, self.offset + k * self.frame - samples)

    def then(self, more: SpeechFrames) -> SpeechFrames:
        """This verdict followed by `more`, the verdict on the audio that follows this one's
        last frame."""
        return SpeechFrames(np.concatenate([self.flags, more.flags]), self.frame, self.offset)

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
    speech_end_sample: int = 0  # stream sample where its last speech frame ends (0: none)
    speech: SpeechFrames | None = None  # the VAD's verdict on its frames, from its first sample

    @property
    def duration_s(self) -> float:
        return (self.end_sample - self.start_sample) / SAMPLE_RATE


@dataclass(frozen=True)
class OpenSegment:
    """The segment being built: speech has begun and it is neither closed nor cut yet."""

    seq: int  # the seq it will carry when emitted
    start_sample: int
    samples: np.ndarray  # int16: what it holds so far (a copy, or a view valid until the next push)
    speech_frames: int  # grows only while someone speaks: unchanged means no new speech
    silence_ms: int  # non-speech at its end so far
    speech_end_mono: float  # capture time of its last speech frame
    speech_end_sample: int = 0  # stream sample where its last speech frame ends (0: none)
    speech: SpeechFrames | None = None  # the VAD's verdict on its frames, from its first sample


@dataclass
class SegmenterCounters:
    segments: int = 0  # emitted
    dropped_short: int = 0  # closed with too little speech
    cuts: int = 0  # cut at the window limit while speech went on


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
    # windows kept though every attempt failed a quality gate (`decoder.on_gate_fail`: retry
    # or keep): the decoder itself did not know what was said
    doubtful_windows: int = 0
    # decoder passes that picked a token: one per generated token, end-of-text included, in
    # every attempt at a window (what the decoder's time is spent on)
    decoder_steps: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)  # features, encoder, decoder
    # the text tokens kept, the last a prompt holds: the `prompt` of the call that decodes
    # the audio after consumed_samples
    context: tuple[int, ...] = ()
    # what the text asks of the home, when it is one of the home's sentences (a vocabulary given)
    intent: Intent | None = None
    # what the command reading did (asr/commands/budget.py): its search's steps and the
    # hypotheses they took, the texts Home Assistant's matcher read, whether its budget cut it
    reading: dict[str, int] = field(default_factory=dict)

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
class HomeName:
    """A name a command may say: an entity's, an area's or a floor's, with its aliases; or a
    plain name whose role is not known (Wyoming's `transcript_names`): it then stands for an
    entity or an area alike."""

    name: str
    kind: str  # "entity", "area", "floor" or "name" (role unknown)
    domain: str | None = None  # an entity's domain (light, switch, climate, ...)
    aliases: tuple[str, ...] = ()

    @property
    def spoken(self) -> tuple[str, ...]:
        """Every way to say it: its name, then its aliases."""
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class Vocabulary:
    """The words one request should be heard with: the home's names and other terms (from
    the config's `vocabulary`, Home Assistant and the Wyoming request, merged). Empty: decode
    as if there were none. It travels whole through the stage seams, frozen."""

    names: tuple[HomeName, ...] = ()
    terms: tuple[str, ...] = ()
    language: str | None = None  # the home's language (Home Assistant's sentences)

    def __bool__(self) -> bool:
        return bool(self.names or self.terms)

    def merged(self, other: Vocabulary) -> Vocabulary:
        """Both vocabularies' names and terms, this one's first, each once (case folded)."""
        names: dict[tuple[str, str], HomeName] = {}
        for n in (*self.names, *other.names):
            names.setdefault((n.kind, n.name.casefold()), n)
        terms: dict[str, str] = {}
        for t in (*self.terms, *other.terms):
            terms.setdefault(t.casefold(), t)
        return Vocabulary(tuple(names.values()), tuple(terms.values()), self.language or other.language)


@dataclass(frozen=True)
class Intent:
    """What a transcript asks of the home, as Home Assistant's matcher (hassil) reads it."""

    name: str  # HassTurnOn, HassStartTimer, ...
    slots: tuple[tuple[str, str], ...] = ()  # (slot, value) in the matcher's order, e.g. (("name", "Lamp"),)
    # the slots filled with whatever words were said (a list item, a timer's name, a delayed
    # command): a text that is a command only through them is weak evidence of one
    free: frozenset[str] = field(default=frozenset(), compare=False)


@dataclass(frozen=True)
class WordGraph:
    """A home's sentences as a graph of words (Home Assistant's templates with the home's names):
    a sentence is a path from `start` to a final state. An arc is labelled by what is said
    along it: a word or a whole name, NUMBER (digits, a decimal point maybe), or None (nothing).
    What the engine's grammar-constrained decoding walks (asr/grammar.py)."""

    NUMBER = "<number>"

    start: int
    arcs: Mapping[int, tuple[tuple[str | None, int], ...]]
    finals: frozenset[int]


class Sentences(Protocol):
    """A home's sentences (edgeasr.home.sentences): what a text asks, and all of them as a graph
    of words, for the engine to hold a decoding to."""

    def recognize(self, text: str) -> Intent | None: ...

    def graph(self) -> WordGraph: ...


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


class StreamClock(Protocol):
    """Stream samples -> wall clock (audio.clock.StreamClock)."""

    def utc(self, sample: int) -> dt.datetime: ...


class Segmenter(Protocol):
    """AudioChunks in, SpeechSegments out (audio.segmenter.Segmenter); no I/O."""

    def push(self, chunk: AudioChunk) -> list[SpeechSegment]:
        """Feed audio in stream order; returns the segments it completed."""

    def flush(self) -> list[SpeechSegment]:
        """End of stream: the open segment, closed."""

    def open_segment(self, copy: bool = True) -> OpenSegment | None:
        """The segment being built, or None while no one speaks. copy=False: its samples are
        a view, valid until the next push()."""

    @property
    def counters(self) -> SegmenterCounters: ...

    @property
    def clock(self) -> StreamClock: ...


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
                   max_windows: int | None = None, vocabulary: Vocabulary = Vocabulary(),
                   partial: bool = False, speech: SpeechFrames | None = None) -> Transcription:
        """audio: float32 mono SAMPLE_RATE. final=False: a cut window, speech goes on;
        the unconsumed tail (after the last complete timestamp) is left for the next call.
        should_stop() is asked between decoded tokens; yes raises errors.Cancelled.
        features: the audio's log-mel from feature_stream(), when it fits one window.
        prompt: the `context` of the call that decoded the audio just before. max_windows:
        decode at most that many windows, leaving the rest unconsumed. vocabulary: the home's
        names and terms to hear this request with. partial: a look at speech still under way,
        shown while it is said: the home's commands are not read in it (the final text's are).
        speech: the VAD's verdict on `audio` as the front end heard it (None: the engine judges
        the audio itself, once)."""

    def feature_stream(self) -> FeatureStream:
        """A stream that computes the features of one window while its audio arrives."""


class Publisher(Protocol):
    """Where transcripts go (MQTT through the durable outbox, stdout, ...)."""

    def publish(self, transcript: Transcript) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class Notifier(Protocol):
    """The service manager (notify.SystemdNotifier: sd_notify; a no-op outside systemd)."""

    @property
    def enabled(self) -> bool:
        """True when a service manager listens (only then is there a watchdog to ping)."""

    @property
    def last_status(self) -> str:
        """The last STATUS= text sent."""

    def notify(self, state: str) -> None:
        """Send sd_notify assignments (READY=1, WATCHDOG=1, ...), one per line."""

    def ready(self, status: str) -> None: ...

    def status(self, text: str) -> None: ...

    def stopping(self, status: str = ...) -> None: ...
