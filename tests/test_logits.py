"""Each logit rule on a small vocabulary: text 0..9, eot 10, specials 11..19, timestamps 20..29."""

from __future__ import annotations

import numpy as np
import pytest

from edgeasr.asr.decoding import logprob_of_max
from edgeasr.asr.logits import (
    EosBoost,
    LogitRules,
    RepetitionPenalty,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
)
from edgeasr.asr.shortlist import ShortRow
from edgeasr.bundle import Tokens

TOK = Tokens(eot=10, sot=11, translate=12, transcribe=13, sot_lm=14, sot_prev=15, no_speech=16,
             no_timestamps=19, timestamp_begin=20, blank=3, languages={})
V = 30


def flat() -> np.ndarray:
    return np.zeros(V, np.float32)


def allowed(logits: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(logits)).tolist())


def test_suppress_tokens():
    x = flat()
    SuppressTokens([1, 5, 16]).apply(x, [])
    assert allowed(x) == set(range(V)) - {1, 5, 16}


def test_suppress_blank_only_before_text():
    rule = SuppressBlank(TOK.blank, TOK.eot)
    first, after_ts, after_text = flat(), flat(), flat()
    rule.apply(first, [])
    rule.apply(after_ts, [20])
    rule.apply(after_text, [20, 5])
    assert {3, 10}.isdisjoint(allowed(first))
    assert 3 not in allowed(after_ts) and 10 in allowed(after_ts)
    assert allowed(after_text) == set(range(V))


def test_timestamps_first_token_is_an_early_timestamp():
    x = flat()
    TimestampRules(TOK, max_initial_index=2, max_index=8).apply(x, [])
    assert allowed(x) == {20, 21, 22}


def test_timestamps_come_in_pairs_and_never_go_back():
    rule = TimestampRules(TOK, max_initial_index=2, max_index=8)
    opening = flat()
    opening[TOK.eot] = 5.0  # likely enough to survive the timestamp-mass rule
    rule.apply(opening, [20, 5, 6, 24])  # text closed at index 4: close the pair or end
    assert allowed(opening) & set(range(10)) == set()  # no text
    assert {t for t in allowed(opening) if t >= 20} == set(range(24, 29)) and 10 in allowed(opening)
    after_pair = flat()
    rule.apply(after_pair, [20, 5, 24, 24])  # a pair: text must follow
    assert allowed(after_pair) == set(range(0, 19))  # no timestamp (specials: SuppressTokens' job)
    mid_text = flat()
    mid_text[:20] = 5.0  # text far more likely than any timestamp
    rule.apply(mid_text, [20, 5, 24, 24, 7])
    stamps = {t for t in allowed(mid_text) if t >= 20}
    assert stamps == set(range(25, 29))  # strictly after the last pair, none past the window
    assert 19 not in allowed(mid_text)  # no-timestamps token is never allowed


@pytest.mark.parametrize("stamps, forced", [
    ([0.0] * 10, True),  # the best timestamp alone beats the best text token
    ([-2.0] * 10, True),  # each one less likely, jointly more: log(9 e^-2) = 0.2 > -1
    ([-4.0] * 10, False),  # jointly less likely: log(9 e^-4) = -1.8
    ([-1.5] + [-50.0] * 9, False),  # one near the text token, the rest negligible
])
def test_timestamp_forced_when_jointly_more_likely(stamps, forced):
    x = flat()
    x[:20] = -10.0
    x[5] = -1.0  # the best text token
    x[20:] = stamps
    TimestampRules(TOK, max_initial_index=9, max_index=9).apply(x, [20, 5])
    # after an opening timestamp and text, timestamp 20 is behind: 21..29 are left
    assert (np.logaddexp.reduce(np.float64(stamps[1:])) > -1.0) == forced  # the case is what it says
    assert (5 not in allowed(x)) == forced
    assert allowed(x) >= {t for t in range(21, 30)}


def test_repetition_penalty_lowers_negative_logits_too():
    x = flat()
    x[4], x[6] = 2.0, -2.0
    RepetitionPenalty(penalty=2.0, window=8, first_special=TOK.eot).apply(x, [4, 6, 21])
    assert x[4] == 1.0  # positive: divided
    assert x[6] == -4.0  # negative: multiplied, so it goes down (Hailo's app raises it)
    assert x[21] == 0.0  # timestamps are not penalised


def test_eos_boost_ends_when_eot_is_likely_enough():
    x = flat() - 10.0
    x[10], x[4] = 2.0, 2.5  # eot not the top token, but p(eot) ~ 0.38
    EosBoost(TOK.eot, threshold=0.2).apply(x, [20, 4])
    assert allowed(x) == {10}
    y = flat() - 10.0
    y[10], y[4] = 2.0, 2.5
    EosBoost(TOK.eot, threshold=0.5).apply(y, [20, 4])
    assert allowed(y) == set(range(V))


def test_logprob_of_max_is_the_log_softmax_of_the_greedy_pick():
    x = np.random.default_rng(0).normal(0, 5, 51_864).astype(np.float32)
    x[:100] = -np.inf  # suppressed tokens take no probability
    pick = int(np.argmax(x))
    expected = -np.log(np.exp(x.astype(np.float64) - x[pick]).sum())
    assert abs(logprob_of_max(x, pick, np.empty_like(x)) - expected) < 1e-5
    only = np.full(V, -np.inf, np.float32)
    only[10] = 3.0  # EosBoost left end-of-text alone: it is certain
    assert logprob_of_max(only, 10, np.empty_like(only)) == 0.0


HISTORIES = [[], [20], [20, 5], [20, 5, 24], [20, 5, 24, 24], [20, 5, 24, 24, 7], [21, 3]]


@pytest.mark.parametrize("tokens", HISTORIES)
@pytest.mark.parametrize("seed", range(10))
def test_the_rules_on_a_shortlist_are_the_rules_on_its_tokens(tokens, seed):
    """A shortlist: text candidates 1, 3, 4, 7 (the blank among them), then every token from
    end-of-text on. Where the best text token is a candidate, each rule leaves its tokens as on the
    whole row; the timestamp rule records the best text logit it weighed and whether text was open."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, V).astype(np.float32)
    x[20:] += rng.uniform(-3, 3)
    x[[0, 2, 5, 6, 8, 9]] = np.minimum(x[[0, 2, 5, 6, 8, 9]], x[[1, 3, 4, 7]].max() - 0.5)
    ids = np.array([1, 3, 4, 7, *range(10, V)])
    row = ShortRow(ids, x[ids].copy(), 4, np.zeros(4, np.uint8), 0, 1.0, x[10:].copy())
    rules = LogitRules([SuppressTokens([1, 16]), SuppressBlank(TOK.blank, TOK.eot),
                        TimestampRules(TOK, max_initial_index=2, max_index=8)])
    assert rules.shortlisted
    rules.apply(x, tokens)
    rules.apply_short(row, tokens)
    np.testing.assert_array_equal(row.logits, x[ids])
    closing = len(tokens) >= 2 and tokens[-1] >= 20 > tokens[-2]  # text, then an opening timestamp
    assert row.text_open == (bool(tokens) and not closing)
    assert (TOK.blank in row.masked_text) == all(t > TOK.eot for t in tokens)


def test_a_bias_keeps_a_window_off_the_shortlist():
    rules = LogitRules([SuppressTokens([1]), RepetitionPenalty(1.3, 8, TOK.eot)])
    assert not rules.shortlisted
