"""Greedy decoding on the two-stage projection (decoder.projection: shortlist), verified per window.

Each step's pick is taken on its shortlist (asr/shortlist.py): the first pass's best text tokens
with their exact logits, and the tail block. No cheap first pass bounds the tokens it leaves out,
so once the window is decoded its steps are verified in one run over the whole text vocabulary:
a step is right when the text was not open when the rules weighed it, or when its best text token
the rules allow was a candidate, or scored below the best the shortlist had (then the rules and the
pick saw what they see on the whole row). At the first step that fails, the window goes back
there: that step is taken from its full row and decoding goes on from it (a rollback, counted).
So the tokens are those of the full projection. Their log-probabilities are read over everything
the rules allow: the tail block from the shortlist, the text from the verification's log-sum-exp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeasr.asr.decoding import DecoderSession, logprob_of_max, logsumexp
from edgeasr.asr.logits import LogitRules
from edgeasr.asr.shortlist import ShortlistProjection, ShortRow, Verified
from edgeasr.errors import Cancelled


@dataclass
class _Pick:
    token: int
    logprob: float = math.nan  # read once verified, for a shortlisted step
    row: ShortRow | None = None  # None: taken on the full row


@dataclass
class _Window:
    picks: list[_Pick] = field(default_factory=list)
    verified: int = 0  # picks checked (or taken on their full row)

    @property
    def tokens(self) -> list[int]:
        return [p.token for p in self.picks]


def decode_shortlisted(session: DecoderSession, rules: LogitRules, logits: np.ndarray, cap: int,
                       should_stop: Callable[[], bool] | None = None) -> tuple[list[int], list[float], bool]:
    """Greedy decoding from the first text token's full `logits` (the prompt just run) to at most
    `cap` tokens: the tokens (end-of-text excluded), each pick's log-probability, and whether the
    cap stopped it."""
    shortlist = session.shortlist
    assert shortlist is not None  # noqa: S101 (the caller checks)
    eot, base = session.bundle.tokens.eot, session.length  # base: the prompt's cache rows
    window = _Window()
    scores: np.ndarray | ShortRow = logits
    counts = shortlist.counts
    counts.windows += 1
    while True:
        tokens = window.tokens
        while len(tokens) < cap:
            if should_stop is not None and should_stop():
                raise Cancelled("decoding stopped on request")
            pick = _pick(scores, rules, tokens, session.scratch)
            counts.steps += pick.row is not None
            window.picks.append(pick)
            if pick.token == eot:
                break
            tokens.append(pick.token)
            scores = session.step_short([pick.token])
        bad = _verify(window, shortlist)
        if bad is None:
            break
        # back to the step the shortlist got wrong: its full row, and decoding goes on from there
        row = window.picks[bad].row
        assert row is not None  # noqa: S101 (only shortlisted picks fail)
        counts.rollbacks += 1
        counts.redone += len(window.picks) - bad - 1
        del window.picks[bad:]
        window.verified = bad
        session.length = base + bad
        scores = shortlist.full(row, session.logits[0])
    picks = window.picks
    hit_cap = not picks or picks[-1].token != eot
    return [p.token for p in picks if p.token != eot], [p.logprob for p in picks], hit_cap


def _pick(scores: np.ndarray | ShortRow, rules: LogitRules, tokens: Sequence[int], scratch: np.ndarray) -> _Pick:
    if isinstance(scores, ShortRow):
        rules.apply_short(scores, tokens)
        return _Pick(scores.pick(), row=scores)
    rules.apply(scores, tokens)  # no rule biases: the row is the model's own after the rules
    token = int(np.argmax(scores))
    return _Pick(token, logprob_of_max(scores, token, scratch))


def _verify(window: _Window, shortlist: ShortlistProjection) -> int | None:
    """Check the window's picks since the last verification, in one run: the index of the first
    wrong one, or None (every pick's log-probability read)."""
    pending = [at for at in range(window.verified, len(window.picks)) if window.picks[at].row is not None]
    rows = [row for at in pending if (row := window.picks[at].row) is not None]
    verified = shortlist.verify(rows) if rows else None
    for k, at in enumerate(pending):
        pick = window.picks[at]
        assert pick.row is not None and verified is not None  # noqa: S101 (pending: shortlisted picks)
        if not _seen(pick.row, verified, k):
            return at
        pick.logprob = _logprob(pick.row, pick.token, float(verified.lse_text[k]), shortlist)
    window.verified = len(window.picks)
    return None


def _seen(row: ShortRow, verified: Verified, k: int) -> bool:
    """Did the step's shortlist hold what the rules and the pick weigh of the text: the best text
    token the rules allow (verified row k), or a token more likely than it? Closed text weighs
    none; where the verification's few best are all masked, the step is taken again to be sure."""
    if not row.text_open:
        return True
    allowed = [i for i, token in enumerate(verified.top_ids[k]) if int(token) not in row.masked_text]
    if not allowed:
        return False
    best = allowed[0]
    return bool(verified.top_logits[k, best] < row.text_max or len(row.at([verified.top_ids[k, best]])))


def _logprob(row: ShortRow, token: int, lse_text: float, shortlist: ShortlistProjection) -> float:
    """The pick's log-probability over every token the rules allow: the tail block's from the
    shortlist and, where text is allowed, every text token's (the verification's log-sum-exp, less
    those a rule masked by id)."""
    parts = [logsumexp(row.logits[row.n_text :])]
    if np.isfinite(row.logits[: row.n_text]).any():
        text = lse_text
        if row.masked_text:
            weight = float(np.exp(shortlist.exact(row, list(row.masked_text)) - text).sum())
            text = text + math.log1p(-min(weight, 1.0)) if weight < 1.0 else -math.inf
        parts.append(text)
    return float(row.logits[row.at([token])[0]]) - logsumexp(np.array(parts))
