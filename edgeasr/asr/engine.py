"""Build the engine from a bundle and the config's sections: its sessions, then its options.

The sections are passed whole (`model`, `encoder`, `decoder`): the config dataclasses are the
one place each setting is declared. Where long audio is cut at pauses is the caller's choice
(`pauses`, the segmenter's rule), and so are the home's sentences (`sentences`): this package
depends on neither the audio side nor the home.
"""

from __future__ import annotations

from dataclasses import replace

from edgeasr.asr.command_reader import SentenceSource
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, preset_options
from edgeasr.asr.encoder import create_encoder
from edgeasr.asr.engine_options import EngineOptions, Fallback
from edgeasr.asr.gates import Gate, default_gates
from edgeasr.asr.sessions import EngineSessions
from edgeasr.asr.transcriber import Transcriber
from edgeasr.asr.windows import PauseFinding
from edgeasr.bundle import ALIGN_ROLE, Bundle
from edgeasr.config import DecoderConfig, EncoderConfig, ModelConfig


def single_threaded_blas() -> None:
    """Run numpy's BLAS on one thread, process-wide. Its one job here is the log-mel's small
    matrix product, and after each call an OpenBLAS worker spins long enough to take the
    second core from the encoder and the decoder. On the dev set (2 vCPUs, one process,
    utterances alternating) this took the median latency from 98.8 to 88.8 ms, and the
    encoder from 41 to 34 ms per window."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


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


def load_sessions(bundle: Bundle, encoder: EncoderConfig, decoder: DecoderConfig) -> EngineSessions:
    single_threaded_blas()
    return EngineSessions(bundle, create_encoder(bundle, encoder),
                          DecoderSession(bundle, decoder.precision, decoder.threads, decoder.spin), decoder.precision,
                          decoder.threads)


def build_engine(bundle: Bundle, model: ModelConfig, encoder: EncoderConfig, decoder: DecoderConfig,
                 pauses: PauseFinding | None = None, words: bool = False,
                 sentences: SentenceSource | None = None) -> Transcriber:
    """The engine for these settings. `pauses` finds where a window of long audio can end in a
    pause (the segmenter's rule), None to cut long audio at timestamps only. `words`: word
    timestamps in the segments (output.words). `sentences`: the home's sentences the final
    text is read as commands with (None: it is not)."""
    return Transcriber(load_sessions(bundle, encoder, decoder), engine_options(model, decoder, bundle, words),
                       pauses, sentences)


def reconfigured(engine: Transcriber, model: ModelConfig, decoder: DecoderConfig) -> Transcriber:
    """The engine with the settings a running daemon can change (SIGHUP), on the same sessions:
    the decoding options and the gates. The config marks exactly these keys `live` (config.LIVE)."""
    return engine.variant(live_options(engine.options, model, decoder, engine.bundle))


def live_options(options: EngineOptions, model: ModelConfig, decoder: DecoderConfig, bundle: Bundle) -> EngineOptions:
    """`options` with the live keys' values of these settings."""
    return replace(options, decoding=decoding_options(model, decoder, bundle), gates=gates(decoder),
                   on_gate_fail=decoder.on_gate_fail, fallback=Fallback(decoder.fallback_temperature_step))
