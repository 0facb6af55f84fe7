"""What an engine is made of: its options (what it does, fixed when it is built) and its sessions
(the loaded models it runs on), each made from the config's sections. The engine itself, which
walks audio window by window, is asr/transcriber.py's `Transcriber` (`build_engine` there).

The sections are passed whole (`model`, `encoder`, `decoder`): the config dataclasses are the
one place each setting is declared.

An engine never changes after it is built: a variant (a bench's row, an ablation's rule, the
settings a SIGHUP reloads) is another engine, built from other options on the same sessions.
The encoder and the decoder are loaded at once; the graphs only some engines use are made on
first use (a beam's batched step, the word aligner, the batched step of the search held to a
home's sentences), so variants are cheap: they share all of it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from edgeasr.asr.beam import BatchDecoderSession, BeamDecoder
from edgeasr.asr.commands.budget import DEFAULT_BUDGET, BudgetOptions
from edgeasr.asr.commands.grammar import ROWS as GRAMMAR_ROWS
from edgeasr.asr.commands.reader import CommandHearing
from edgeasr.asr.commands.vocabulary import MEANS
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, preset_options
from edgeasr.asr.encoder import Encoder, create_encoder
from edgeasr.asr.features import MelSpec
from edgeasr.asr.gates import Gate, default_gates
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner
from edgeasr.bundle import ALIGN_ROLE, BATCH_STEP_ROLE, Bundle
from edgeasr.config import GATE_FAILURE_ACTIONS, DecoderConfig, EncoderConfig, ModelConfig
from edgeasr.errors import ConfigError

# ---------------------------------------------------------------- the options


@dataclass(frozen=True)
class Fallback:
    """Temperatures to decode a failed window again at: step, 2*step, ... up to 1.0."""

    step: float = DecoderConfig.fallback_temperature_step
    # above this temperature the retry is decoded without the earlier text as prompt
    prompt_reset_temperature: float = 0.5

    def temperatures(self) -> tuple[float, ...]:
        n = int(round(1.0 / self.step)) if self.step > 0 else 0
        return (0.0, *(round(self.step * i, 3) for i in range(1, n + 1)))


@dataclass(frozen=True)
class Guards:
    """The rules beside the quality gates that can remove decoded text. Each can be turned off:
    `edgeasr models ablate` counts the real and the made-up words each one removes."""

    repeats: bool = True  # a window's text cut where it starts repeating itself (pieces.find_loop)
    silent_segments: bool = True  # a segment with no speech under it that the decoder doubts too
    stock_phrases: bool = True  # "Thank you." and the like over little speech (spoken.stock_phrase)
    short_tails: bool = True  # a last second after kept text that the model calls silence (kept_pieces)


@dataclass(frozen=True)
class EngineOptions:
    decoding: DecodingOptions
    gates: tuple[Gate, ...] = default_gates()
    on_gate_fail: str = DecoderConfig.on_gate_fail  # one of config.GATE_FAILURE_ACTIONS
    fallback: Fallback = Fallback()
    guards: Guards = Guards()
    beam_size: int = 1  # 1: greedy decoding; more: a beam search of that many hypotheses
    words: bool = False  # word timestamps in the segments (output.words)
    # the rules that judge words by the audio under them: a window's closing words, a repeat
    # inside a segment (decoder.drop_unspoken_words, where the bundle has the aligner)
    judge_words: bool = False
    # which of vocabulary.MEANS a vocabulary is heard by (bench-commands measures each)
    vocabulary_means: frozenset[str] = frozenset(MEANS)
    # how much the command reading may do (commands.budget.UNLIMITED: measuring what it cuts)
    reading: BudgetOptions = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.on_gate_fail not in GATE_FAILURE_ACTIONS:
            raise ConfigError(f"decoder.on_gate_fail: {self.on_gate_fail!r} is not allowed "
                              f"({', '.join(GATE_FAILURE_ACTIONS)})")


# ---------------------------------------------------------------- the sessions


class EngineSessions:
    """The loaded models; `precision` and `threads` are those of the graphs made on first use."""

    def __init__(self, bundle: Bundle, encoder: Encoder, decoder: DecoderSession,
                 precision: str = DecoderConfig.precision, threads: int = DecoderConfig.threads) -> None:
        self.bundle, self.encoder, self.decoder = bundle, encoder, decoder
        self.precision, self.threads = precision, threads
        self.tokenizer = Tokenizer(bundle)
        a = bundle.audio
        self.spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
        # the names prompts and the searches of the home's sentences, kept per vocabulary
        self.command_hearing = CommandHearing(decoder, self.tokenizer, bundle.tokens.eot)
        self._beams: dict[int, BeamDecoder] = {}
        self._aligner: WordAligner | None = None
        self._batch: BatchDecoderSession | None = None
        self._batch_lock = threading.Lock()  # the reading's `prepare` may make it on its own thread

    @property
    def max_prompt(self) -> int:
        """Prompt tokens at most: openai's half of the text context, less <|startofprev|>."""
        return self.bundle.n_text_ctx // 2 - 1

    def beam(self, size: int) -> BeamDecoder:
        """The beam search of `size` hypotheses (a ModelError without the batched step)."""
        if size not in self._beams:
            self._beams[size] = BeamDecoder(self.bundle, self.decoder, size, self.precision, self.threads)
        return self._beams[size]

    def aligner(self) -> WordAligner:
        """The word aligner (a ModelError without its graph or the alignment heads)."""
        if self._aligner is None:
            self._aligner = WordAligner(self.bundle, self.decoder, self.precision, self.threads)
        return self._aligner

    def batch(self) -> BatchDecoderSession | None:
        """The batched step for the search held to the home's sentences, None without it."""
        with self._batch_lock:
            if self._batch is None and self.bundle.has_graph(BATCH_STEP_ROLE, self.precision):
                self._batch = BatchDecoderSession(self.bundle, self.decoder, GRAMMAR_ROWS, self.precision,
                                                  self.threads)
            return self._batch


# ---------------------------------------------------------------- made from the config


def single_threaded_blas() -> None:
    """Run numpy's BLAS on one thread, process-wide. Its one job here is the log-mel's small
    matrix product, and after each call an OpenBLAS worker spins long enough to take the
    second core from the encoder and the decoder. On the dev set (2 vCPUs, one process,
    utterances alternating) this took the median latency from 98.8 to 88.8 ms, and the
    encoder from 41 to 34 ms per window."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


def load_sessions(bundle: Bundle, encoder: EncoderConfig, decoder: DecoderConfig) -> EngineSessions:
    single_threaded_blas()
    return EngineSessions(bundle, create_encoder(bundle, encoder),
                          DecoderSession(bundle, decoder.precision, decoder.threads, decoder.spin, decoder.projection),
                          decoder.precision, decoder.threads)


def decoding_options(model: ModelConfig, decoder: DecoderConfig, bundle: Bundle) -> DecodingOptions:
    """The decoder's options: the preset (none: the bundle's calibrated values), with the
    keys the config sets on top of it."""
    return preset_options(
        decoder.preset, bundle.decoding, language=model.language, task=model.task,
        encoder_padding=decoder.encoder_padding, repetition_penalty=decoder.repetition_penalty,
        eos_threshold=decoder.eos_threshold, max_tokens_per_s=decoder.max_tokens_per_s,
        condition_on_previous_text=decoder.condition_on_previous_text)


def gates(decoder: DecoderConfig) -> tuple[Gate, ...]:
    return default_gates(decoder.logprob_threshold, decoder.no_speech_threshold,
                         decoder.compression_ratio_threshold)


def engine_options(model: ModelConfig, decoder: DecoderConfig, bundle: Bundle, words: bool = False) -> EngineOptions:
    """The engine's options for these settings; `words`: word timestamps in the segments."""
    return EngineOptions(
        decoding_options(model, decoder, bundle), gates(decoder), decoder.on_gate_fail,
        Fallback(decoder.fallback_temperature_step), beam_size=decoder.beam_size, words=words,
        judge_words=decoder.drop_unspoken_words and bundle.has_graph(ALIGN_ROLE, decoder.precision))


def live_options(options: EngineOptions, model: ModelConfig, decoder: DecoderConfig, bundle: Bundle) -> EngineOptions:
    """`options` with the values of the keys a running daemon can change (SIGHUP; the config
    marks exactly these `live`: config.LIVE): the decoding options and the gates."""
    return replace(options, decoding=decoding_options(model, decoder, bundle), gates=gates(decoder),
                   on_gate_fail=decoder.on_gate_fail, fallback=Fallback(decoder.fallback_temperature_step))
