"""Beam search over a window: a few hypotheses decoded together, one batched run per step.

`BatchDecoderSession` runs the bundle's `decoder_step_batch` graph for `size` hypotheses
at once: the self-attention caches of their own tokens are rows of one preallocated buffer
[layers, 2, size, n_text_ctx, d]; the cross K/V and the score bias are the
`DecoderSession`'s own buffers, bound by address (the window is the same for every
hypothesis). The prompt runs once through the DecoderSession; its cache rows are then
laid out once as the heads' keys and values that every hypothesis reads.

`BeamDecoder` is the search, as faster-whisper (CTranslate2) does it with patience 1: per
step every hypothesis' logits go through the window's logit rules, as greedy decoding's do
(per row), the 2 x size best continuations of all of them are ranked by total log-probability
(the rules' biases included: they are there to steer the choice), the
first `size` are kept, and one that ends in end-of-text is set aside as finished and
replaced by the next candidate that does not. The search stops when `size` hypotheses
have finished; the best is the one with the highest log-probability per token (length
normalisation, CTranslate2's length_penalty 1). The log-probability kept for each token, which
the quality gates judge, is the model's own before the biases, as greedy decoding keeps it
(logits.LogitRules). Unlike CTranslate2, a hypothesis that the
token cap cut is taken only when none ended (measured on base, beam 3: WER 11.2 -> 10.6 %,
runaway windows 15 -> 10: a repetition loop scores well per token).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edgeasr.asr.decoding import (
    STEP_SPIN_US,
    DecoderSession,
    DecodingOptions,
    WindowResult,
    feed_prompt,
    logsumexp,
)
from edgeasr.asr.encoder import ort_session, warm_run
from edgeasr.asr.greedy import decode_window, token_cap
from edgeasr.asr.logits import LogitRules
from edgeasr.asr.tail import WindowEnd
from edgeasr.bundle import BATCH_STEP_ROLE, Bundle
from edgeasr.config import DecoderConfig
from edgeasr.errors import Cancelled


class BatchDecoderSession:
    def __init__(self, bundle: Bundle, decoder: DecoderSession, size: int,
                 precision: str = DecoderConfig.precision, threads: int = DecoderConfig.threads) -> None:
        """`size` rows at most: a beam of decoder.beam_size (its range is the config's), or
        the rows of the search held to a home's sentences (grammar.ROWS)."""
        self.bundle, self.decoder, self.size = bundle, decoder, size
        self.session = ort_session(bundle.graph(BATCH_STEP_ROLE, precision), threads,
                                   STEP_SPIN_US if decoder.spin else 0)
        layers, d = bundle.decoder_layers, bundle.d_model
        self.cache = np.zeros((layers, 2, size, bundle.n_text_ctx, d), np.float32)  # each row's own tokens
        self.rows = np.zeros((size, 1, d), np.float32)  # each hypothesis' new token's row
        self.new = np.zeros((layers, 2, size, 1, d), np.float32)
        self.logits = np.zeros((size, bundle.n_vocab), np.float32)
        self.lse = np.zeros(size, np.float32)  # each row's log-sum-exp of its logits
        self.offset = np.zeros(1, np.int64)
        self.prompt = 0  # the prompt's positions, shared by every row
        self.length = 0  # each row's own tokens after the prompt
        self._shared: dict[str, np.ndarray] = {}  # the window's cross K/V and the prompt's K/V, bound by `begin`
        self._bindings: dict[int, Any] = {}  # onnxruntime IOBindings by the number of rows a step runs
        self._bound: set[int] = set()  # those that have the window's and the prompt's buffers bound
        self._warm = False  # `warm` has run

    def warm(self, prompt: int) -> None:
        """One run for every number of rows a step may take, after a prompt of `prompt`
        positions, on zeros and off the search's buffers (a search may be under way beside this):
        the first run of each costs more than its next ones (base, measured: 10 against 3 ms for
        one row, 15 against 5 for five), which the first commands read would pay."""
        if self._warm:
            return
        for n in range(1, self.size + 1):
            warm_run(self.session, {"batch": n, "n": 1, "positions": self.bundle.audio.n_positions, "prefix": prompt})
        self._warm = True

    def _binding(self, n: int):
        """The step's bindings for its first n rows (each buffer holds them first and whole):
        made once; a step binds nothing."""
        if n not in self._bindings:
            layers, d = self.bundle.decoder_layers, self.bundle.d_model
            binding = self.session.io_binding()
            binding.bind_input("token_embeddings", "cpu", 0, np.float32, [n, 1, d], self.rows.ctypes.data)
            binding.bind_input("offset", "cpu", 0, np.int64, [1], self.offset.ctypes.data)
            binding.bind_output("logits", "cpu", 0, np.float32, [n, self.bundle.n_vocab], self.logits.ctypes.data)
            binding.bind_output("logsumexp", "cpu", 0, np.float32, [n], self.lse.ctypes.data)
            for i in range(layers):
                for j, kind in enumerate("kv"):
                    binding.bind_input(f"self_{kind}{i}", "cpu", 0, np.float32, [n, *self.cache.shape[3:]],
                                       self.cache[i, j].ctypes.data)
                    binding.bind_output(f"new_{kind}{i}", "cpu", 0, np.float32, [n, 1, d], self.new[i, j].ctypes.data)
            self._bindings[n] = binding
        if n not in self._bound:  # bound when first used after `begin`: a search uses few sizes
            self._bind_shared(self._bindings[n])
            self._bound.add(n)
        return self._bindings[n]

    def _bind_shared(self, binding: Any) -> None:
        for name, array in self._shared.items():
            binding.bind_input(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)

    def begin(self) -> None:
        """After the prompt ran through the DecoderSession: its cache rows, per layer as the
        heads' keys [H, dh, P] and values [H, P, dh] that every hypothesis reads, and the
        window's cross K/V (which `start` may have reallocated), bound again."""
        p, heads = self.decoder.length, self.bundle.decoder_heads
        self.prompt, self.length = p, 0
        self._shared = dict(self.decoder.cross_inputs())
        for i, layer in enumerate(self.decoder.cache[:, :, :p]):
            k, v = (rows.reshape(p, heads, -1) for rows in layer)  # [P, H, dh]
            self._shared[f"prefix_k{i}"] = np.ascontiguousarray(k.transpose(1, 2, 0))
            self._shared[f"prefix_v{i}"] = np.ascontiguousarray(v.transpose(1, 0, 2))
        self._bound.clear()

    def reorder(self, parents: list[int]) -> None:
        """Hypothesis r continues hypothesis parents[r]: copy the cache rows that change, in
        place (the sources first, as one may be overwritten by another's copy)."""
        moved = [r for r, parent in enumerate(parents) if parent != r]
        if moved and self.length:
            t = self.length
            sources = self.cache[:, :, [parents[r] for r in moved], :t]  # a copy (fancy index)
            self.cache[:, :, moved, :t] = sources

    def step(self, tokens: list[int]) -> np.ndarray:
        """One token per hypothesis after the cached ones, for the first len(tokens) of them
        (fewer rows, less work); the logits [size, n_vocab], of which those rows are valid (the
        session's buffer: valid until the next step, and the caller may change it); `lse`
        holds their log-sum-exps."""
        n = len(tokens)
        if self.prompt + self.length + 1 > self.cache.shape[3]:
            raise ValueError("decoder context is full")
        if not 0 < n <= self.size:
            raise ValueError(f"a step of {n} hypotheses in a batch of {self.size}")
        self.decoder.embedding.read(tokens, self.rows[:n, 0])
        self.offset[0] = self.length
        self.session.run_with_iobinding(self._binding(n))
        self.cache[:, :, :n, self.length] = self.new[:, :, :n, 0]
        self.length += 1
        return self.logits


@dataclass
class _Hypothesis:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    score: float = 0.0  # sum of the log-probabilities
    ended: bool = False  # by end-of-text (else by the token cap)

    def normalised(self) -> float:
        return self.score / max(1, len(self.tokens))


@dataclass(frozen=True)
class Candidate:
    row: int  # the hypothesis it continues
    token: int
    logprob: float  # the token's log-probability
    total: float  # the hypothesis' score with it


# log-probability below the best candidate that the first search for candidates takes in
# (doubled while fewer than asked for are found): a compare and a nonzero over the rows
# instead of a partition of every row
SEARCH_MARGIN = 8.0


def best_candidates(logits: np.ndarray, scores: np.ndarray, count: int, scratch: np.ndarray) -> list[Candidate]:
    """The `count` best continuations of all hypotheses, best first: logits [rows, V] after
    the logit rules, scores [rows] the hypotheses' sums of log-probabilities so far; `scratch`
    an array at least as large as logits. A continuation's total is its score plus the token's
    log-softmax."""
    top = logits.max(axis=1)
    dead = ~np.isfinite(top)  # a row the rules emptied (or a spare row) continues nothing
    top = np.where(dead, 0.0, top).astype(np.float32)
    work = scratch[: len(logits)]
    np.subtract(logits, top[:, None], out=work)
    np.exp(work, out=work)
    lse = top + np.log(work.sum(axis=1))
    offset = np.where(dead, -np.inf, scores - lse)  # total = logit + offset
    best = float(np.max(top + offset))
    margin = SEARCH_MARGIN
    while True:
        # every continuation with a total >= cut, so the best `count` of them are the best of all
        cut = best - margin
        rows, tokens = np.divmod(np.flatnonzero(logits >= (cut - offset)[:, None]), logits.shape[1])
        if len(rows) >= count or not np.isfinite(cut):
            break
        margin = margin * 2 if margin < 1e4 else np.inf  # at last: every continuation
    totals = logits[rows, tokens] + offset[rows]
    if len(totals) > count:  # a flat distribution lets thousands in: partition before sorting
        keep = np.argpartition(-totals, count - 1)[:count]
        rows, tokens, totals = rows[keep], tokens[keep], totals[keep]
    order = np.argsort(-totals, kind="stable")
    return [Candidate(int(rows[i]), int(tokens[i]), float(logits[rows[i], tokens[i]] - lse[rows[i]]),
                      float(totals[i])) for i in order]


def _unbiased(candidate: Candidate, own: np.ndarray | None) -> Candidate:
    """The candidate with its token's log-probability read from the row as the constraints left it."""
    if own is None:
        return candidate
    return replace(candidate, logprob=float(own[candidate.token]) - logsumexp(own))


class BeamDecoder:
    """decode_window's signature with a beam of `size` hypotheses (the transcriber's
    `decode` hook); one batched run of the step per token. At a temperature above 0 (the
    fallback's retries) it samples as decode_window does: openai's whisper and faster-whisper
    search with the beam at temperature 0 only."""

    def __init__(self, bundle: Bundle, decoder: DecoderSession, size: int,
                 precision: str = DecoderConfig.precision, threads: int = DecoderConfig.threads) -> None:
        self.batch = BatchDecoderSession(bundle, decoder, size, precision, threads)
        self.size = size
        self.scratch = np.zeros((size, bundle.n_vocab), np.float32)  # for the softmax of a step

    def __call__(self, session: DecoderSession, audio_features: np.ndarray, options: DecodingOptions,
                 window_s: float, end: WindowEnd | None = None, rules: LogitRules | None = None,
                 prompt: Sequence[int] = (), rng: np.random.Generator | None = None,
                 should_stop: Callable[[], bool] | None = None) -> WindowResult:
        if options.temperature > 0:
            return decode_window(session, audio_features, options, window_s, end, rules, prompt, rng,
                                 should_stop)
        rules = rules if rules is not None else LogitRules.for_window(session.bundle, options, window_s)
        t0 = time.monotonic()
        session.start(audio_features, options.encoder_padding, end)
        t1 = time.monotonic()
        logits, no_speech_prob, language = feed_prompt(session, options, prompt)
        cap = token_cap(session, options, window_s)
        best, steps = self.search(logits, rules, cap, should_stop)
        timings = {"cross_kv": (t1 - t0) * 1e3, "decoder": (time.monotonic() - t0) * 1e3, "steps": steps}
        return WindowResult(best.tokens, best.logprobs, no_speech_prob, language, not best.ended, timings)

    def search(self, logits: np.ndarray, rules: LogitRules, cap: int,
               should_stop: Callable[[], bool] | None = None) -> tuple[_Hypothesis, int]:
        """The beam from the prompt the DecoderSession has just run (`logits`: its next-token
        logits) to the best hypothesis of at most `cap` tokens; and the decoder runs it took."""
        eot = self.batch.bundle.tokens.eot
        self.batch.begin()
        alive, finished, steps = [_Hypothesis()], [], 1
        rows = logits[None]  # one row: every hypothesis starts from the prompt
        while True:
            if should_stop is not None and should_stop():
                raise Cancelled("decoding stopped on request")
            alive, parents, done = self._advance(rows, alive, rules, eot, cap)
            finished += done
            if len(finished) >= self.size or not alive:
                break
            self.batch.reorder(parents)
            rows = self.batch.step([h.tokens[-1] for h in alive])
            steps += 1
        # a hypothesis the token cap cut is a runaway loop (its repeats are likely, so its score
        # per token is high): one that ended is taken before it (CTranslate2 ranks them together)
        ended = [h for h in finished if h.ended]
        return max(ended or finished or alive, key=_Hypothesis.normalised), steps

    def _advance(self, logits: np.ndarray, alive: list[_Hypothesis], rules: LogitRules, eot: int,
                 cap: int) -> tuple[list[_Hypothesis], list[int], list[_Hypothesis]]:
        """One step of the search: the hypotheses that go on (and each one's parent row) and
        the ones that finished. CTranslate2's rule: of the 2 x size best candidates the first
        `size` are taken, an end-of-text among them finishes its hypothesis and its place goes
        to the next candidate that is not end-of-text."""
        own = [rules.apply(row, h.tokens) for row, h in zip(logits, alive)]
        scores = np.array([h.score for h in alive])
        candidates = best_candidates(logits, scores, 2 * self.size, self.scratch)
        if rules.biased:  # the tokens' log-probabilities are the model's own (greedy's convention)
            candidates = [_unbiased(c, own[c.row]) for c in candidates]
        kept: list[Candidate] = []
        done: list[_Hypothesis] = []
        spare = iter(c for c in candidates[self.size :] if c.token != eot)
        for c in candidates[: self.size]:
            if c.token == eot:
                parent = alive[c.row]
                done.append(_Hypothesis(parent.tokens, [*parent.logprobs, c.logprob], c.total, ended=True))
                c = next(spare, c)
                if c.token == eot:
                    continue
            kept.append(c)
        nxt = [_Hypothesis([*alive[c.row].tokens, c.token], [*alive[c.row].logprobs, c.logprob], c.total)
               for c in kept]
        if nxt and len(nxt[0].tokens) >= cap:  # the cap: what is alive ends here, unfinished
            return [], [], done + nxt
        while nxt and len(nxt) < self.size:  # the batch keeps its size: a spare copy of the last
            nxt.append(_Hypothesis(list(nxt[-1].tokens), list(nxt[-1].logprobs), -math.inf))
            kept.append(kept[-1])
        return nxt, [c.row for c in kept], done
