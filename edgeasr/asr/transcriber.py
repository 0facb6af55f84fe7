"""Speech -> text: the engine walks the audio window by window and gathers each window's text.

One window's path, in order: the walk cuts it out of the audio (asr/windows.py), its log-mel
(asr/features.py) goes through the encoder (asr/encoder.py, or the Hailo-8's), the window
decoder (asr/window_decoder.py) decodes it and judges the text, and says where the next window
starts; the engine only gathers the segments. A final window heard with a vocabulary is then
read as the home's command it says (asr/commands/).

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

from edgeasr.asr.commands.reader import CommandReader, EncodedWindow, SentenceSource
from edgeasr.asr.commands.vocabulary import VOCABULARY_CACHE, keyterms
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.engine import EngineOptions, EngineSessions, engine_options, live_options, load_sessions
from edgeasr.asr.features import MelSpec, MelStream, log_mel, silence_level
from edgeasr.asr.tail import WindowEnd
from edgeasr.asr.text.cleanup import tidy
from edgeasr.asr.window_decoder import Before, WindowDecoder, WindowText
from edgeasr.asr.windows import SpeechJudging, Window, WindowWalker
from edgeasr.bundle import Bundle
from edgeasr.config import DecoderConfig, EncoderConfig, ModelConfig
from edgeasr.stages import SpeechFrames, TextSegment, Transcription, Vocabulary

NO_VOCABULARY = Vocabulary()


@dataclass
class _Walk:
    """What a transcription has gathered, window after window."""

    language: str | None  # None: detected in the first window, then kept
    context: list[int]  # text tokens kept so far (the prompt of the next window)
    keyterms: tuple[tuple[int, ...], ...]  # the vocabulary's names and terms, tokenized
    prompted: bool  # the audio goes on from a call before (a prompt was given)
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

    def before_window(self) -> Before:
        return Before(self.context, self.language, self.keyterms, self.prompted, bool(self.segments))

    def add(self, text: WindowText) -> None:
        """A window's text joins the transcription; the next window starts after what it accounts for."""
        result = text.result
        self.segments += text.segments
        self.context += text.tokens
        self.seek += text.advance
        self.language = result.language
        self.windows += 1
        self.tokens += len(result.tokens)
        self.runaway += int(result.hit_cap)
        self.doubtful += int(text.doubtful)
        self.dropped += int(text.dropped)
        self.steps += text.decoder_steps
        self.timings["decoder"] += text.decoder_ms
        if text.words_ms:
            self.timings["words"] = self.timings.get("words", 0.0) + text.words_ms


class Transcriber:
    """The engine (stages.Engine), built whole from its options on loaded sessions. `vad` judges
    audio given without the front end's verdict (None: no VAD, long audio cut at timestamps
    only); `sentences` gives the home's sentences the commands are read with (None: no reading)."""

    def __init__(self, sessions: EngineSessions, options: EngineOptions, vad: SpeechJudging | None = None,
                 sentences: SentenceSource | None = None, gate_failures: dict[str, int] | None = None) -> None:
        self.sessions, self.options, self.vad, self.sentences = sessions, options, vad, sentences
        self.gate_failures: dict[str, int] = gate_failures if gate_failures is not None else {}
        s, means = sessions, options.vocabulary_means
        self.walker = WindowWalker(s.spec, vad.search_s if vad is not None else None)
        self.window_decoder = WindowDecoder(s, options, self.gate_failures)
        self.commands = (CommandReader(s.command_hearing, sentences, s.tokenizer, options.decoding, s.max_prompt,
                                       prompt="prompt" in means, batch=s.batch, budget=options.reading)
                         if sentences is not None and "grammar" in means else None)
        self._keyterms = functools.lru_cache(maxsize=VOCABULARY_CACHE)(
            lambda vocabulary: keyterms(vocabulary, s.tokenizer.encode))
        self._built = True

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_built", False):
            raise AttributeError(f"an engine is built whole: build a variant instead of setting {name}")
        super().__setattr__(name, value)

    def variant(self, options: EngineOptions) -> Transcriber:
        """This engine with other options, on the same sessions; its gate failures count here too."""
        return Transcriber(self.sessions, options, self.vad, self.sentences, self.gate_failures)

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

    def prepare(self, vocabulary: Vocabulary, language: str) -> bool:
        """Build ahead what reading commands with `vocabulary` in `language` needs
        (CommandReader.prepare); False where nothing is read, or nothing in that language."""
        return self.commands is not None and self.commands.prepare(vocabulary, language)

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None, prompt: Sequence[int] = (),
                   max_windows: int | None = None, vocabulary: Vocabulary = NO_VOCABULARY,
                   partial: bool = False, speech: SpeechFrames | None = None) -> Transcription:
        """audio: float32 mono at the bundle's rate. The other arguments are stages.Engine's.
        language: this request's (multilingual bundles), else model.language's. features: the
        log-mel of `audio` computed while it arrived (feature_stream()), used when it fits one
        window. vocabulary: the home's names and terms (asr/commands/vocabulary.py). speech:
        the VAD's verdict on `audio` as the front end heard it (None: judged here, once)."""
        audio = np.asarray(audio, dtype=np.float32)
        if speech is None and self.vad is not None:
            speech = self.vad.judge(audio)
        if language is None or not self.bundle.multilingual:
            language = self.options.decoding.language
        walk = _Walk(language=language, context=list(prompt), prompted=bool(prompt), before=len(prompt),
                     keyterms=self._keyterms(vocabulary) if "boost" in self.options.vocabulary_means else ())
        while self.walker.words_left(audio, walk.seek):
            if max_windows is not None and walk.windows >= max_windows:
                final = False  # audio is left: it is not consumed
                break
            window = self.walker.window(audio, walk.seek, final, speech)
            whole = window.seek == 0 and len(window.audio) == len(audio)
            encoded = self._encode(window, features if whole else None, walk)
            walk.add(self.window_decoder.decode(window, encoded.features, encoded.end, walk.before_window(),
                                                should_stop))
            walk.last = encoded
            if whole:
                walk.whole = encoded
            if not final and not window.more:
                break
        if final:
            walk.seek = len(audio)
        result = self._transcription(walk, complete=final)
        read = walk.last if walk.windows == 1 else walk.whole
        if self.commands is not None and vocabulary and final and not partial and read is not None:
            result = self.commands.read(result, read, vocabulary, walk.context[: walk.before])
        return result

    def _encode(self, window: Window, features: np.ndarray | None, walk: _Walk) -> EncodedWindow:
        """A window's encoder output and how its audio ends (its log-mel: `features`, else computed)."""
        t0 = time.monotonic()
        mel = features if features is not None else log_mel(window.audio, self.spec)
        t1 = time.monotonic()
        encoded = self.encoder.encode(mel)
        walk.timings["features"] += (t1 - t0) * 1e3
        walk.timings["encoder"] += (time.monotonic() - t1) * 1e3
        return EncodedWindow(encoded, WindowEnd(silence_level(mel), window.ends_inside))

    def _transcription(self, walk: _Walk, complete: bool) -> Transcription:
        segments = tidy(walk.segments, complete=complete)
        return Transcription(text="".join(s.text for s in segments).strip(), segments=tuple(segments),
                             language=walk.language or "en", windows=walk.windows, tokens=walk.tokens,
                             consumed_samples=walk.seek, dropped_windows=walk.dropped,
                             doubtful_windows=walk.doubtful, runaway_windows=walk.runaway, decoder_steps=walk.steps,
                             timings_ms=walk.timings, context=tuple(walk.context[-self.sessions.max_prompt:]))


def build_engine(bundle: Bundle, model: ModelConfig, encoder: EncoderConfig, decoder: DecoderConfig,
                 vad: SpeechJudging | None = None, words: bool = False,
                 sentences: SentenceSource | None = None) -> Transcriber:
    """The engine for these settings. `vad` judges audio given whole (audio.vad.SpeechJudge;
    None: no VAD, long audio cut at timestamps only). `words`: word timestamps in the segments
    (output.words). `sentences`: the home's sentences the final text is read as commands with
    (None: it is not). The VAD and the home's sentences are the caller's: this package depends
    on neither the audio side nor the home."""
    return Transcriber(load_sessions(bundle, encoder, decoder), engine_options(model, decoder, bundle, words),
                       vad, sentences)


def reconfigured(engine: Transcriber, model: ModelConfig, decoder: DecoderConfig) -> Transcriber:
    """The engine with the settings a running daemon can change (SIGHUP), on the same sessions."""
    return engine.variant(live_options(engine.options, model, decoder, engine.bundle))
