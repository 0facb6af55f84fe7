"""A window decoded token by token with timestamps: greedy, or sampled at a temperature (the
fallback's retries). The logit rules apply before each pick (asr/logits.py); beam.BeamDecoder
is the other way to decode a window, with the same signature."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from edgeasr.asr import logits as rules
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, WindowResult, feed_prompt
from edgeasr.bundle import Bundle
from edgeasr.errors import Cancelled


def build_rules(bundle: Bundle, options: DecodingOptions, window_s: float) -> list[rules.LogitFilter]:
    tok = bundle.tokens
    per_pos = bundle.audio.seconds_per_position
    suppress = set(bundle.suppress_tokens) | {tok.translate, tok.transcribe, tok.sot, tok.sot_prev,
                                              tok.sot_lm, tok.no_speech}
    suppress |= set(tok.languages.values())
    chain: list[rules.LogitFilter] = [
        rules.SuppressTokens(sorted(suppress)),
        rules.SuppressBlank(tok.blank, tok.eot),
        rules.TimestampRules(tok, round(options.max_initial_timestamp_s / per_pos),
                             round(window_s / per_pos)),
    ]
    if options.repetition_penalty != 1.0:
        chain.append(rules.RepetitionPenalty(options.repetition_penalty, options.repetition_window,
                                             tok.eot))
    if options.eos_threshold is not None:
        chain.append(rules.EosBoost(tok.eot, options.eos_threshold))
    if options.keyterms and options.keyterm_boost:
        # after the timestamp rules: a boost weighs text against text, never forces out a timestamp
        chain.insert(3, rules.KeytermBoost(options.keyterms, options.keyterm_boost, tok.eot))
    return chain


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """A token drawn from softmax(logits / temperature) (the rules' -inf stay impossible)."""
    scaled = (logits - np.max(logits)) / temperature
    p = np.exp(scaled)
    return int(rng.choice(len(p), p=p / p.sum()))


def token_cap(session: DecoderSession, options: DecodingOptions, window_s: float) -> int:
    """Text tokens a window may take after its prompt (runaway loops stop there)."""
    cap = max(4, math.ceil(options.max_tokens_per_s * window_s))
    return min(cap, session.bundle.n_text_ctx - session.length - 1)


def decode_window(session: DecoderSession, audio_features: np.ndarray, options: DecodingOptions,
                  window_s: float, silence: float | None = None, chain: list[rules.LogitFilter] | None = None,
                  prompt: Sequence[int] = (), rng: np.random.Generator | None = None,
                  should_stop: Callable[[], bool] | None = None) -> WindowResult:
    """Decoding with timestamps of one window whose speech lasts `window_s`: greedy, or
    sampled at `options.temperature` (with `rng`). `silence` is the window's log-mel value
    of silence (`features.silence_level`); `prompt` is earlier text of the same speech
    (openai's condition_on_previous_text), fed after <|startofprev|>."""
    bundle, tok = session.bundle, session.bundle.tokens
    chain = chain if chain is not None else build_rules(bundle, options, window_s)
    t0 = time.monotonic()
    session.start(audio_features, options.encoder_padding, silence)
    t1 = time.monotonic()
    logits, no_speech_prob, language = feed_prompt(session, options, prompt)
    cap = token_cap(session, options, window_s)
    tokens: list[int] = []
    logprobs: list[float] = []
    hit_cap = True
    while len(tokens) < cap:
        if should_stop is not None and should_stop():
            raise Cancelled("decoding stopped on request")
        own = None  # the logits before the first rule that biases the choice
        for rule in chain:
            if rule.biases and own is None:
                own = logits.copy()
            rule.apply(logits, tokens)
        if options.temperature > 0 and rng is not None:
            token = sample(logits, options.temperature, rng)
        else:
            token = int(np.argmax(logits))
        if own is not None:
            logprobs.append(float(own[token]) - rules.logsumexp(own))
        elif options.temperature > 0 and rng is not None:
            logprobs.append(float(logits[token]) - rules.logsumexp(logits))
        else:
            logprobs.append(rules.logprob_of_max(logits, token, session.scratch))
        if token == tok.eot:
            hit_cap = False
            break
        tokens.append(token)
        logits = session.step([token])
    t2 = time.monotonic()
    timings = {"cross_kv": (t1 - t0) * 1e3, "decoder": (t2 - t0) * 1e3,
               "steps": len(tokens) + 1}
    return WindowResult(tokens, logprobs, no_speech_prob, language, hit_cap, timings)
