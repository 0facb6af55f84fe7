"""Speech -> text: the engine walks the audio window by window and gathers each window's text.

Its parts: the window walker cuts the windows (asr/windows.py); the window decoder decodes each
one, with the temperature fallback and the quality gates (asr/window_decoder.py), keeping what
the text rules keep (asr/kept_pieces.py); a window that goes on from earlier text loses the
words it reads again across the seam (asr/seams.py), and its words are timed
(asr/window_words.py). A final window heard with a vocabulary is then read as the home's
command it says (asr/command_reader.py).

A call can decode part of the audio (`max_windows`) and a later one carry on from its text
(`prompt` = the earlier `Transcription.context`): the Wyoming sessions and the pipeline's
carried tails read long speech as one call would.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeasr.asr.cleanup import tidy
from edgeasr.asr.command_reader import CommandReader, EncodedWindow, SentenceSource
from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.engine_options import EngineOptions
from edgeasr.asr.features import MelSpec, MelStream, log_mel, silence_level
from edgeasr.asr.gates import compression_ratio
from edgeasr.asr.greedy import decode_window
from edgeasr.asr.kept_pieces import KeptPieces
from edgeasr.asr.pieces import Piece
from edgeasr.asr.seams import SeamRepeats
from edgeasr.asr.sessions import EngineSessions
from edgeasr.asr.vocabulary import VOCABULARY_CACHE, keyterms
from edgeasr.asr.window_decoder import WindowDecoder
from edgeasr.asr.window_words import WindowWords
from edgeasr.asr.windows import PauseFinding, Window, WindowWalker
from edgeasr.bundle import Bundle
from edgeasr.stages import TextSegment, Transcription, Vocabulary, Word

NO_VOCABULARY = Vocabulary()


@dataclass
class _Walk:
    """What a transcription has gathered, window after window."""

    language: str | None  # None: detected in the first window, then kept
    context: list[int]  # text tokens kept so far (the prompt of the next window)
    keyterms: tuple[tuple[int, ...], ...]  # the vocabulary's names and terms, tokenized
    continues: bool  # the audio goes on from a call before (a prompt was given)
    before: int = 0  # tokens of `context` said before this call (the prompt)
    last: EncodedWindow | None = None
    # the first window when it held all the audio: a command whose decoding went on in a second
    # window (a segment ended early) is still read against the whole of it
    whole: EncodedWindow | None = None
    seek: int = 0  # the first sample not yet accounted for
    segments: list[TextSegment] = field(default_factory=list)
    windows: int = 0
    tokens: int = 0
    dropped: int = 0
    doubtful: int = 0
    runaway: int = 0
    steps: int = 0
    timings: dict[str, float] = field(default_factory=lambda: {"features": 0.0, "encoder": 0.0, "decoder": 0.0})


class Transcriber:
    """The engine (stages.Engine), built whole from its options on loaded sessions. `pauses`
    finds where a window of long audio can end in a pause (None: at timestamps only);
    `sentences` gives the home's sentences the commands are read with (None: no reading)."""

    def __init__(self, sessions: EngineSessions, options: EngineOptions, pauses: PauseFinding | None = None,
                 sentences: SentenceSource | None = None, gate_failures: dict[str, int] | None = None) -> None:
        self.sessions, self.options, self.pauses, self.sentences = sessions, options, pauses, sentences
        self.gate_failures: dict[str, int] = gate_failures if gate_failures is not None else {}
        s = sessions
        judge = s.aligner if options.words or options.judge_words else None
        strategy = s.beam(options.beam_size) if options.beam_size > 1 else decode_window
        kept = KeptPieces(s.bundle, s.tokenizer, options.gates, options.guards, options.decoding.task, judge)
        self.walker = WindowWalker(s.spec, pauses)
        self.window_decoder = WindowDecoder(s, strategy, kept, options, self.gate_failures)
        self.seams = SeamRepeats(s.tokenizer)
        self.words = WindowWords(s.tokenizer, s.spec.sample_rate, options.decoding.task,
                                 s.aligner() if options.words else None, judge)
        self.commands = (CommandReader(s.hearing, sentences, s.tokenizer, options.decoding, s.max_prompt,
                                       prompt="prompt" in options.hearing, batch=s.batch)
                         if sentences is not None and "grammar" in options.hearing else None)
        self._keyterms = functools.lru_cache(maxsize=VOCABULARY_CACHE)(
            lambda vocabulary: keyterms(vocabulary, s.tokenizer.encode))
        self._built = True

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_built", False):
            raise AttributeError(f"an engine is built whole: build a variant instead of setting {name}")
        super().__setattr__(name, value)

    def variant(self, options: EngineOptions) -> Transcriber:
        """This engine with other options, on the same sessions; its gate failures count here too."""
        return Transcriber(self.sessions, options, self.pauses, self.sentences, self.gate_failures)

    @property
    def bundle(self) -> Bundle:
        return self.sessions.bundle

    @property
    def encoder(self) -> Encoder:
        return self.sessions.encoder

    @property
    def spec(self) -> MelSpec:
        return self.sessions.spec

    def feature_stream(self) -> MelStream:
        return MelStream(self.spec)

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None, prompt: Sequence[int] = (),
                   max_windows: int | None = None, vocabulary: Vocabulary = NO_VOCABULARY,
                   partial: bool = False) -> Transcription:
        """audio: float32 mono at the bundle's rate. The other arguments are stages.Engine's.
        language: this request's (multilingual bundles), else model.language's. features: the
        log-mel of `audio` computed while it arrived (feature_stream()), used when it fits one
        window. vocabulary: the home's names and terms (asr/vocabulary.py)."""
        audio = np.asarray(audio, dtype=np.float32)
        if language is None or not self.bundle.multilingual:
            language = self.options.decoding.language
        walk = _Walk(language=language, context=list(prompt), continues=bool(prompt), before=len(prompt),
                     keyterms=self._keyterms(vocabulary) if "boost" in self.options.hearing else ())
        while self.walker.words_left(audio, walk.seek):
            if max_windows is not None and walk.windows >= max_windows:
                final = False  # audio is left: it is not consumed
                break
            window = self.walker.window(audio, walk.seek, final)
            whole = window.seek == 0 and len(window.audio) == len(audio)
            self._transcribe_window(window, walk, features if whole else None, should_stop)
            if whole:
                walk.whole = walk.last
            if not final and not window.more:
                break
        if final:
            walk.seek = len(audio)
        result = self._transcription(walk, complete=final)
        read = walk.last if walk.windows == 1 else walk.whole
        if self.commands is not None and vocabulary and final and not partial and read is not None:
            result = self.commands.read(result, read, vocabulary, walk.context[: walk.before])
        return result

    def _transcribe_window(self, window: Window, walk: _Walk, features: np.ndarray | None,
                           should_stop: Callable[[], bool] | None) -> None:
        """Encode and decode one window; its kept segments and tokens join `walk`."""
        chunk, sr = window.audio, self.spec.sample_rate
        t0 = time.monotonic()
        mel = features if features is not None else log_mel(chunk, self.spec)
        t1 = time.monotonic()
        encoded = self.encoder.encode(mel)
        walk.timings["features"] += (t1 - t0) * 1e3
        walk.timings["encoder"] += (time.monotonic() - t1) * 1e3
        silence = silence_level(mel)
        earlier = walk.context[-self.sessions.max_prompt:] if self.options.decoding.condition_on_previous_text else []
        decoded = self.window_decoder.decode(encoded, silence, chunk, window.complete, earlier, walk.language,
                                             self.walker.speech(window), should_stop, more=window.more,
                                             keyterms=walk.keyterms, follows=walk.continues or bool(walk.segments))
        result = decoded.result
        walk.timings["decoder"] += decoded.decoder_ms
        walk.steps += decoded.decoder_steps
        walk.windows += 1
        walk.tokens += len(result.tokens)
        walk.runaway += int(result.hit_cap)
        walk.doubtful += int(decoded.doubtful)
        walk.language = result.language
        pieces = decoded.pieces
        if decoded.failed_gate is not None:
            walk.dropped += 1
            pieces = []
        offset = window.seek / sr
        if self.options.guards.repeats:
            pieces = self.seams.without_repeat(pieces, walk.context)
        pieces, words = self.words.words(pieces, chunk, result, offset, walk.timings, window.complete,
                                         continues=window.seek > 0 or walk.continues)
        for p, piece_words in zip(pieces, words):
            segment = self._segment(p, piece_words, offset, len(chunk), result)
            if segment is not None:
                walk.segments.append(segment)
                walk.context += p.tokens
        walk.seek += decoded.advance
        walk.last = EncodedWindow(encoded, silence)

    def _segment(self, piece: Piece, words: tuple[Word, ...], offset: float, n_samples: int,
                 result: WindowResult) -> TextSegment | None:
        text = self.sessions.tokenizer.decode(piece.tokens)
        if not text.strip():
            return None
        start, end = offset + piece.start, offset + (piece.end if piece.end is not None else n_samples / self.spec.sample_rate)
        if words:  # a closing timestamp can come seconds early ("... yolks of four eggs.<7.00>" for 8.9 s)
            start, end = min(start, words[0].start), max(end, words[-1].end)
        return TextSegment(start=round(start, 3), end=round(end, 3), text=text,
                           tokens=tuple(piece.tokens), avg_logprob=float(np.mean(piece.logprobs)),
                           no_speech_prob=result.no_speech_prob, compression_ratio=compression_ratio(text),
                           words=words)

    def _transcription(self, walk: _Walk, complete: bool) -> Transcription:
        segments = tidy(walk.segments, complete=complete)
        return Transcription(text="".join(s.text for s in segments).strip(), segments=tuple(segments),
                             language=walk.language or "en", windows=walk.windows, tokens=walk.tokens,
                             consumed_samples=walk.seek, dropped_windows=walk.dropped,
                             doubtful_windows=walk.doubtful, runaway_windows=walk.runaway, decoder_steps=walk.steps,
                             timings_ms=walk.timings, context=tuple(walk.context[-self.sessions.max_prompt:]))
