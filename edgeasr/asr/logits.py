"""The logit rules, one small class each, and their ordered list for a window.

openai's DecodingTask keeps its rules in one list built once; so does `LogitRules` here: built
once per window (`LogitRules.for_window`), the same list for the greedy pick, the fallback's
samples and the beam. The rules that say which tokens may come (suppression, the timestamp
rules) go first, then those that bias the choice (the names' boost, the repetition penalty, the
end-of-text boost). A window's log-probabilities, which the quality gates judge, are the
model's own after the first kind and before the second, whichever way the window is decoded.

`logits` is the float32 vector for the next token (modified in place); `tokens` are the
tokens generated so far in this window, after the prompt. The rules that say which tokens may
come also apply to a step's shortlist (`apply_short`, decoder.projection: shortlist: a few
hundred tokens by id, asr/shortlist.py's ShortRow); the biases do not, and a window with one is
decoded on the whole vocabulary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from edgeasr.asr.decoding import DecodingOptions, logsumexp
from edgeasr.asr.shortlist import ShortRow
from edgeasr.bundle import Bundle, Tokens

NEG_INF = -np.inf
KEYTERM_CACHE = 8  # requests' names whose boost (a trie of their tokens) is kept


class LogitFilter(Protocol):
    # a rule that biases the choice of a token (a boost, a penalty) rather than saying which
    # tokens may come: the window's log-probabilities are the model's own before it
    biases: bool

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None: ...


def suppressed_tokens(bundle: Bundle, timestamps: bool = True) -> list[int]:
    """The tokens no decoder emits: the model's non-speech symbols, the special tokens, the
    languages; without timestamps, every timestamp and <|notimestamps|> too."""
    tok = bundle.tokens
    ids = set(bundle.suppress_tokens) | {tok.translate, tok.transcribe, tok.sot, tok.sot_prev, tok.sot_lm,
                                         tok.no_speech} | set(tok.languages.values())
    if not timestamps:
        ids |= {tok.no_timestamps, *range(tok.timestamp_begin, bundle.n_vocab)}
    return sorted(ids)


class LogitRules:
    """A window's rules in the order they apply. `apply` runs them on one row of logits and
    returns the logits as the constraints left them (a copy, taken only when a rule that
    biases then changes them), from which the token's log-probability is read; None when no
    rule biases: the row itself is the model's own then."""

    def __init__(self, rules: Sequence[LogitFilter]) -> None:
        self.rules = tuple(rules)
        if any(a.biases and not b.biases for a, b in zip(self.rules, self.rules[1:])):
            raise ValueError("a rule that says which tokens may come follows one that biases")
        self.biased = any(r.biases for r in self.rules)
        # every rule applies to a shortlist: none biases (a boost or a penalty weighs tokens that
        # the first pass may have left out)
        self.shortlisted = all(hasattr(r, "apply_short") for r in self.rules)

    @classmethod
    def for_window(cls, bundle: Bundle, options: DecodingOptions, window_s: float) -> LogitRules:
        """The rules of a window whose speech lasts `window_s`, decoded with `options`."""
        tok, per_pos = bundle.tokens, bundle.audio.seconds_per_position
        rules: list[LogitFilter] = [
            SuppressTokens(suppressed_tokens(bundle)),
            SuppressBlank(tok.blank, tok.eot),
            TimestampRules(tok, round(options.max_initial_timestamp_s / per_pos), round(window_s / per_pos)),
        ]
        if options.keyterms and options.keyterm_boost:
            # first of the biases: a boost weighs text against text, never forces out a timestamp
            rules.append(keyterm_boost(options.keyterms, options.keyterm_boost, tok.eot))
        if options.repetition_penalty != 1.0:
            rules.append(RepetitionPenalty(options.repetition_penalty, options.repetition_window, tok.eot))
        if options.eos_threshold is not None:
            rules.append(EosBoost(tok.eot, options.eos_threshold))
        return cls(rules)

    def apply_short(self, row: ShortRow, tokens: Sequence[int]) -> None:
        """The rules on a step's shortlist, in place (only when `shortlisted`)."""
        for rule in self.rules:
            rule.apply_short(row, tokens)  # type: ignore[attr-defined]

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray | None:
        own = None
        for rule in self.rules:
            if rule.biases and own is None:
                own = logits.copy()
            rule.apply(logits, tokens)
        return own


class SuppressTokens:
    """Never emit these (non-speech symbols, task and other special tokens)."""

    biases = False

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = np.asarray(sorted(set(ids)), dtype=np.int64)
        self._in_tail: np.ndarray | None = None  # their positions in a shortlist, once

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        logits[self.ids] = NEG_INF

    def apply_short(self, row: ShortRow, tokens: Sequence[int]) -> None:
        # the first pass ranks no suppressed token: they are in the tail block, which every step has
        if self._in_tail is None:
            self._in_tail = row.at(self.ids) - row.n_text
        row.logits[row.n_text + self._in_tail] = NEG_INF


class SuppressBlank:
    """No blank as the first text token, and no end-of-text as the very first token
    (openai's SuppressBlank; after the opening timestamp an empty window may end)."""

    biases = False

    def __init__(self, blank: int, eot: int) -> None:
        self.blank, self.eot = blank, eot

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        if not tokens:
            logits[[self.blank, self.eot]] = NEG_INF
        elif all(t > self.eot for t in tokens):
            logits[self.blank] = NEG_INF

    def apply_short(self, row: ShortRow, tokens: Sequence[int]) -> None:
        if tokens and not all(t > self.eot for t in tokens):
            return
        row.logits[row.at([self.blank, self.eot] if not tokens else [self.blank])] = NEG_INF
        row.masked_text += (self.blank,)  # masked whether or not it is a candidate


class TimestampRules:
    """openai's ApplyTimestampRules: timestamps in pairs, never decreasing, the first one
    early, none past the window, and a timestamp whenever they are jointly more likely
    than any single text token."""

    biases = False

    def __init__(self, tok: Tokens, max_initial_index: int, max_index: int) -> None:
        self.eot, self.begin, self.no_ts = tok.eot, tok.timestamp_begin, tok.no_timestamps
        self.max_initial_index, self.max_index = max_initial_index, max_index

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        b = self.begin
        logits[self.no_ts] = NEG_INF
        logits[b + self.max_index + 1 :] = NEG_INF
        last_ts = len(tokens) >= 1 and tokens[-1] >= b
        prev_ts = len(tokens) < 2 or tokens[-2] >= b
        if last_ts:
            if prev_ts:  # a closed pair (or the opening one): text must follow
                logits[b:] = NEG_INF
            else:  # an opening timestamp after text: close it or end
                logits[: self.eot] = NEG_INF
        stamps = [t for t in tokens if t >= b]
        if stamps:  # never go back in time; after a pair, strictly forward
            floor = stamps[-1] if last_ts and not prev_ts else stamps[-1] + 1
            logits[b:floor] = NEG_INF
        if not tokens:  # start with a timestamp, and an early one
            logits[:b] = NEG_INF
            logits[b + self.max_initial_index + 1 :] = NEG_INF
        # the softmax normaliser cancels: compare the timestamps' joint mass with the best text
        # token. Their best one bounds the joint mass from both sides, which mostly settles it
        # without the exp: max <= logsumexp <= max + log(count)
        text_max, times = float(np.max(logits[:b])), logits[b:]
        time_max = float(np.max(times))
        if time_max > text_max or (time_max + math.log(len(times)) > text_max
                                   and logsumexp(times) > text_max):
            logits[:b] = NEG_INF

    def apply_short(self, row: ShortRow, tokens: Sequence[int]) -> None:
        """`apply` on a shortlist: every timestamp a window allows is in it, so only the best text
        logit may differ from the whole row's; it is recorded (`row.text_max`) for the window's
        verification, with whether the text was still open when it was weighed."""
        b, x = self.begin, row.logits
        x[row.at([self.no_ts])] = NEG_INF
        x[row.span(b + self.max_index + 1)] = NEG_INF
        last_ts = len(tokens) >= 1 and tokens[-1] >= b
        prev_ts = len(tokens) < 2 or tokens[-2] >= b
        if last_ts:
            if prev_ts:
                x[row.span(b)] = NEG_INF
            else:
                x[row.span(0, self.eot)] = NEG_INF
                row.text_open = False
        stamps = [t for t in tokens if t >= b]
        if stamps:
            floor = stamps[-1] if last_ts and not prev_ts else stamps[-1] + 1
            x[row.span(b, floor)] = NEG_INF
        if not tokens:
            x[row.span(0, b)] = NEG_INF
            x[row.span(b + self.max_initial_index + 1)] = NEG_INF
            row.text_open = False
        text = row.span(0, b)
        text_max, times = float(np.max(x[text])), x[text.stop :]
        time_max = float(np.max(times))
        row.text_max = text_max
        if time_max > text_max or (time_max + math.log(len(times)) > text_max
                                   and logsumexp(times) > text_max):
            x[text] = NEG_INF


class RepetitionPenalty:
    """Make recently used text tokens less likely. Like Hugging Face's (and unlike
    Hailo's app) it multiplies negative logits, so a penalty always lowers them."""

    biases = True

    def __init__(self, penalty: float, window: int, first_special: int) -> None:
        self.penalty, self.window, self.first_special = penalty, window, first_special

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        if self.penalty == 1.0:
            return
        for t in {t for t in tokens[-self.window :] if t < self.first_special}:
            v = logits[t]  # a dozen scalars: cheaper one by one than as an index array
            logits[t] = v / self.penalty if v > 0 else v * self.penalty


class EosBoost:
    """End the window once end-of-text is likely enough, even if not the top token:
    a decoder fed a short window tends to run on past the speech."""

    biases = True

    def __init__(self, eot: int, threshold: float) -> None:
        self.eot, self.log_threshold = eot, float(np.log(threshold))

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        if not tokens or logits[self.eot] - np.max(logits) < self.log_threshold:
            return  # p(eot) <= exp(eot - max): below the threshold, skip the full softmax
        if logits[self.eot] - logsumexp(logits) >= self.log_threshold:
            keep = logits[self.eot]
            logits[:] = NEG_INF
            logits[self.eot] = keep


@functools.lru_cache(maxsize=KEYTERM_CACHE)
def keyterm_boost(terms: tuple[tuple[int, ...], ...], boost: float, first_special: int) -> KeytermBoost:
    """The boost of a request's names and terms, its trie built once for every window of them."""
    return KeytermBoost(terms, boost, first_special)


class KeytermBoost:
    """Shallow fusion toward the request's names and terms (Moonshine's keyterms, on a frozen
    Whisper): the tokens that begin a term, or go on with one under way, get a bounded boost,
    the more the deeper into the term. `terms` are token sequences (each way of writing each
    name, with its leading space)."""

    biases = True

    def __init__(self, terms: Sequence[Sequence[int]], boost: float, first_special: int) -> None:
        self.root: dict[int, dict] = {}
        for term in terms:
            node = self.root
            for token in term:
                node = node.setdefault(token, {})
        self.depth = max((len(t) for t in terms), default=0)
        self.boost, self.first_special = boost, first_special

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        text = [t for t in tokens[-self.depth :] if t < self.first_special] if self.depth else []
        if tokens and tokens[-1] >= self.first_special:
            text = []  # a timestamp ends a name
        boosts: dict[int, float] = dict.fromkeys(self.root, self.boost)
        for start in range(len(text)):  # every suffix of the text that is a term's beginning
            node: dict | None = self.root
            for token in text[start:]:
                node = node.get(token) if node is not None else None
                if node is None:
                    break
            if node:
                gain = self.boost * (1.0 + math.log(len(text) - start + 1))
                for token in node:
                    boosts[token] = max(boosts.get(token, 0.0), gain)
        for token, gain in boosts.items():
            if logits[token] != NEG_INF:
                logits[token] += gain
