"""Assemble the engine (encoder + decoder -> Transcriber) from a bundle and the config's sections.

The sections are passed whole (`model`, `encoder`, `decoder`): the config dataclasses are the
one place each setting is declared. Where long audio is cut at pauses is the caller's choice
(`pauses`, the segmenter's rule), so this package does not depend on the audio side.
"""

from __future__ import annotations

import functools

from edgeasr.asr.beam import BatchDecoderSession, BeamDecoder
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, preset_options
from edgeasr.asr.encoder import create_encoder
from edgeasr.asr.gates import Gate, default_gates
from edgeasr.asr.grammar import ROWS as GRAMMAR_ROWS
from edgeasr.asr.transcriber import Fallback, PauseFinding, Transcriber
from edgeasr.asr.words import WordAligner
from edgeasr.bundle import ALIGN_ROLE, BATCH_STEP_ROLE, Bundle
from edgeasr.config import DecoderConfig, EncoderConfig, ModelConfig


def single_threaded_blas() -> None:
    """Run numpy's BLAS on one thread, process-wide. Its one job here is the log-mel's small
    matrix product, and after each call an OpenBLAS worker spins long enough to take the
    second core from the encoder and the decoder. Measured on the dev set (2 vCPUs, one
    process, utterances alternating): median latency 98.8 -> 88.8 ms, encoder 41 -> 34 ms
    per window."""
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


def build_engine(bundle: Bundle, model: ModelConfig, encoder: EncoderConfig,
                 decoder: DecoderConfig, pauses: PauseFinding | None = None,
                 words: bool = False) -> Transcriber:
    """The engine for these settings; `pauses` finds where a window of long audio can end in
    a pause (the segmenter's rule), None to cut long audio at timestamps only; `words`:
    word timestamps in the segments (output.words)."""
    single_threaded_blas()
    engine = Transcriber(
        bundle,
        create_encoder(bundle, encoder),
        DecoderSession(bundle, decoder.precision, decoder.threads),
        decoding_options(model, decoder, bundle),
        gates(decoder),
        decoder.on_gate_fail,
        Fallback(decoder.fallback_temperature_step),
        pauses=pauses,
    )
    if decoder.beam_size > 1:
        engine.decode = BeamDecoder(bundle, engine.decoder, decoder.beam_size, decoder.precision,
                                    decoder.threads)
    if words:
        engine.aligner = WordAligner(bundle, engine.decoder, decoder.precision, decoder.threads)
    if bundle.has_graph(BATCH_STEP_ROLE, decoder.precision):  # the search held to a home's sentences steps its hypotheses at once
        engine.batch_session = functools.cache(
            lambda: BatchDecoderSession(bundle, engine.decoder, GRAMMAR_ROWS, decoder.precision, decoder.threads))
    if decoder.drop_unspoken_words and bundle.has_graph(ALIGN_ROLE, decoder.precision):
        # only asked for when output.words made no aligner
        engine.judging_aligner = functools.cache(
            lambda: WordAligner(bundle, engine.decoder, decoder.precision, decoder.threads))
    return engine


def reconfigure(engine: Transcriber, model: ModelConfig, decoder: DecoderConfig) -> None:
    """Apply the settings a running engine can change (SIGHUP): the decoding options and the
    gates. The config marks exactly these keys `live` (config.LIVE)."""
    engine.options = decoding_options(model, decoder, engine.bundle)
    engine.gates = gates(decoder)
    engine.on_gate_fail = decoder.on_gate_fail
    engine.fallback = Fallback(decoder.fallback_temperature_step)
