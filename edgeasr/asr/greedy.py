"""A window decoded token by token with timestamps: greedy, or sampled at a temperature (the
fallback's retries). The window's logit rules (logits.LogitRules) apply before each pick;
beam.BeamDecoder is the other way to decode a window, with the same signature."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from edgeasr.asr.decoding import (
    DecoderSession,
    DecodingOptions,
    WindowResult,
    feed_prompt,
    logprob_of_max,
    logsumexp,
)
from edgeasr.asr.greedy_shortlist import decode_shortlisted
from edgeasr.asr.logits import LogitRules
from edgeasr.asr.tail import WindowEnd
from edgeasr.errors import Cancelled


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
                  window_s: float, end: WindowEnd | None = None, rules: LogitRules | None = None,
                  prompt: Sequence[int] = (), rng: np.random.Generator | None = None,
                  should_stop: Callable[[], bool] | None = None) -> WindowResult:
    """Decoding with timestamps of one window whose speech lasts `window_s`: greedy, or
    sampled at `options.temperature` (with `rng`). `end`: how the window's audio ends (its
    silence level, and whether it ends inside the window: what the padding rows stand for);
    `rules` the window's (built here if not given);
    `prompt` is earlier text of the same speech (openai's condition_on_previous_text), fed
    after <|startofprev|>."""
    rules = rules if rules is not None else LogitRules.for_window(session.bundle, options, window_s)
    eot = session.bundle.tokens.eot
    sampled = options.temperature > 0 and rng is not None
    t0 = time.monotonic()
    session.start(audio_features, options.encoder_padding, end)
    t1 = time.monotonic()
    logits, no_speech_prob, language = feed_prompt(session, options, prompt)
    cap = token_cap(session, options, window_s)
    if session.shortlist is not None and rules.shortlisted and not sampled:
        picked, picked_logprobs, capped = decode_shortlisted(session, rules, logits, cap, should_stop)
        timings = {"cross_kv": (t1 - t0) * 1e3, "decoder": (time.monotonic() - t0) * 1e3, "steps": len(picked) + 1}
        return WindowResult(picked, picked_logprobs, no_speech_prob, language, capped, timings)
    tokens: list[int] = []
    logprobs: list[float] = []
    hit_cap = True
    while len(tokens) < cap:
        if should_stop is not None and should_stop():
            raise Cancelled("decoding stopped on request")
        own = rules.apply(logits, tokens)
        token = sample(logits, options.temperature, rng) if sampled and rng is not None else int(np.argmax(logits))
        if own is not None:
            logprobs.append(float(own[token]) - logsumexp(own))
        elif sampled:
            logprobs.append(float(logits[token]) - logsumexp(logits))
        else:
            logprobs.append(logprob_of_max(logits, token, session.scratch))
        if token == eot:
            hit_cap = False
            break
        tokens.append(token)
        logits = session.step([token])
    t2 = time.monotonic()
    timings = {"cross_kv": (t1 - t0) * 1e3, "decoder": (t2 - t0) * 1e3, "steps": len(tokens) + 1}
    return WindowResult(tokens, logprobs, no_speech_prob, language, hit_cap, timings)
