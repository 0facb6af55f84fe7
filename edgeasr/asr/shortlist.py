"""The host's half of the two-stage vocabulary projection (decoder.projection: shortlist).

The bundle's shortlist step (models/shortlist.py) ends in a cheap first pass over the text
tokens, the exact logits of the tail block (end-of-text, the specials, the timestamps) and the
final hidden state as the int8 projection quantizes it. `ShortlistProjection` takes the first
pass's best CANDIDATES text tokens, computes their exact logits from the projection's int8 rows
(bit-identical to the full projection's), and gives a step's scores as a `ShortRow`: a few
hundred token ids, ascending, with their logits. It also verifies a window's steps at once
(`verify`: their best text tokens and the log-sum-exp over every text token, exact), and gives
one step's whole row (`full`) where a step needs the whole vocabulary: the text's logits from the
verification, the tail block's from the step, the rest from the int8 rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeasr.asr.encoder import ort_session
from edgeasr.bundle import PROJECTION_ROWS_ROLE, VERIFY_ROLE, Bundle, shortlist_text_ids
from edgeasr.errors import ModelError

# the first pass's scores are sampled every SAMPLE_STRIDE-th for the threshold of the best
# candidates: one compare over all of them instead of a partition (measured: 18-22 against 72 us
# for 50k floats); more than twice as many as asked for are cut to the best
SAMPLE_STRIDE = 16
# integer dot products of int8 rows and (q - zp) are exact in float32 below 2^24
FLOAT32_EXACT = 2**24
# steps verified in one run at most: the GEMM reads the table once for them all (from ~24 rows on
# it costs the same per row), and the run's buffers, kept from run to run, stay a few MB
VERIFY_ROWS = 24


@dataclass
class ShortRow:
    """One step's scores over its shortlist. The logit rules change `logits` in place and say
    what the window's verification must check (`text_open`, `text_max`, `masked_text`)."""

    ids: np.ndarray  # int64, ascending: the first pass's candidates, then the tail block
    logits: np.ndarray  # float32: the exact logit of each id
    n_text: int  # ids[:n_text] are the candidates (text tokens); the tail block follows, every id
    # from its first (end-of-text) on: a tail id's position is arithmetic
    q: np.ndarray  # the hidden state as the projection quantizes it: uint8 [d] ...
    zp: int  # ... its zero point
    scale: float  # ... and scale
    tail: np.ndarray  # the tail block's logits as the step gave them (the rules change `logits`)
    text_open: bool = True  # no rule masked the text tokens as a whole before weighing them
    text_max: float = -math.inf  # the best text logit the timestamp rule weighed the timestamps against
    masked_text: tuple[int, ...] = ()  # text tokens a rule masked by id (the blank)

    def span(self, start: int, stop: int | None = None) -> slice:
        """The positions of the ids in [start, stop)."""
        return slice(self._position(start), None if stop is None else self._position(stop))

    def at(self, ids) -> np.ndarray:
        """The positions of those of `ids` that are in the shortlist."""
        ids = np.asarray(ids, np.int64)
        tail = int(self.ids[self.n_text])
        pos = np.where(ids >= tail, self.n_text + ids - tail, np.searchsorted(self.ids[: self.n_text], ids))
        pos = np.minimum(pos, len(self.ids) - 1)
        return pos[self.ids[pos] == ids]

    def _position(self, token: int) -> int:
        """Where `token` is or would be in the ids."""
        tail = int(self.ids[self.n_text])
        if token >= tail:
            return min(self.n_text + token - tail, len(self.ids))
        return int(np.searchsorted(self.ids[: self.n_text], token))

    def pick(self) -> int:
        """The likeliest token (the lowest id among equals, as argmax over the whole row)."""
        return int(self.ids[int(np.argmax(self.logits))])


@dataclass
class ShortlistCounts:
    """What the two-stage projection did over a session's greedy windows."""

    windows: int = 0
    steps: int = 0  # picks taken on a shortlist, those redone after a rollback included
    rollbacks: int = 0  # steps taken from their full row after a window's verification
    redone: int = 0  # picks thrown away by the rollbacks


@dataclass(frozen=True)
class Verified:
    """A window's shortlisted steps checked against the whole vocabulary, one row per step."""

    top_logits: np.ndarray  # [n, k]: each step's best text logits, best first
    top_ids: np.ndarray  # [n, k]: their tokens (the lowest id first among equals)
    lse_text: np.ndarray  # [n]: the log-sum-exp of every text token's logit


class ShortlistProjection:
    """The first pass's candidates rescored exactly, a window's verification, one step's full row."""

    def __init__(self, bundle: Bundle, threads: int) -> None:
        meta = bundle.shortlist
        if not meta:
            raise ModelError(f"{bundle.root}: the bundle has no two-stage projection (import it with --with shortlist)")
        self.candidates = int(meta["candidates"])
        self.text_ids = shortlist_text_ids(bundle.suppress_tokens, bundle.tokens.eot)
        self.tail_ids = np.arange(*meta["tail"], dtype=np.int64)
        self.rows = np.load(bundle.path(PROJECTION_ROWS_ROLE))  # [V, d] int8: the projection's rows
        if self.rows.shape != (bundle.n_vocab, bundle.d_model) or self.rows.dtype != np.int8:
            raise ModelError(f"{bundle.path(PROJECTION_ROWS_ROLE)}: not int8 [{bundle.n_vocab}, {bundle.d_model}]")
        self.exact_dtype = np.float32 if bundle.d_model * 255 * 127 < FLOAT32_EXACT else np.float64
        self.verifier = ort_session(bundle.graph(VERIFY_ROLE, "int8"), threads, arena=True)
        # a whole row's other tokens: the suppressed text tokens, the timestamps past the window
        self.other_ids = np.setdiff1d(np.arange(bundle.n_vocab), np.concatenate([self.text_ids, self.tail_ids]))
        self.weight_scale = np.float32(meta["weight_scale"])  # the projection's, per tensor
        self.counts = ShortlistCounts()

    def row(self, scores: np.ndarray, tail: np.ndarray, q: np.ndarray, scale: float, zp: int) -> ShortRow:
        """A step's shortlist: the best first-pass text tokens and the tail block, exact logits."""
        top = _best(scores, self.candidates)  # ascending, so their ids are
        row = self.tail_row(tail, q, scale, zp)
        row.ids, row.n_text = np.concatenate([self.text_ids[top], self.tail_ids]), len(top)
        row.logits = np.concatenate([self.exact(row, row.ids[: len(top)]), tail])
        return row

    def tail_row(self, tail: np.ndarray, q: np.ndarray, scale: float, zp: int) -> ShortRow:
        """A step's shortlist without candidates (what `full` needs)."""
        return ShortRow(self.tail_ids, tail.copy(), 0, q.copy(), zp, scale, tail.copy())

    def exact(self, row: ShortRow, ids) -> np.ndarray:
        """The exact logits of tokens `ids` at the step of `row`: (q - zp).w as integers, times
        the hidden state's scale times the weight's, as the step's projection makes them."""
        centred = row.q.astype(self.exact_dtype) - row.zp
        acc = (self.rows[np.asarray(ids)].astype(self.exact_dtype) @ centred).astype(np.float32)
        return acc * (np.float32(row.scale) * self.weight_scale)

    def full(self, row: ShortRow, out: np.ndarray) -> np.ndarray:
        """The step's whole row of logits into `out` [n_vocab], the full projection's to the bit."""
        out[self.text_ids] = self.verifier.run(["logits"], _feeds([row]))[0][0]
        out[self.tail_ids] = row.tail
        out[self.other_ids] = self.exact(row, self.other_ids)
        return out

    def verify(self, rows: list[ShortRow]) -> Verified:
        """Every step's best text tokens and log-sum-exp over the text, VERIFY_ROWS steps a run."""
        names = ["top_logits", "top_ids", "lse_text"]
        parts = [self.verifier.run(names, _feeds(rows[i : i + VERIFY_ROWS])) for i in range(0, len(rows), VERIFY_ROWS)]
        return Verified(*(np.concatenate([part[k] for part in parts]) for k in range(len(names))))


def _feeds(rows: list[ShortRow]) -> dict[str, np.ndarray]:
    """The verification's inputs: the steps' quantized hidden states."""
    return {"q": np.stack([r.q for r in rows]), "zp": np.array([[r.zp] for r in rows], np.int32),
            "scale": np.array([[r.scale] for r in rows], np.float32)}


def _best(scores: np.ndarray, count: int) -> np.ndarray:
    """About the `count` best of `scores`, ascending: the threshold is the (count / stride)-th best
    of every SAMPLE_STRIDE-th score; the window's verification makes up for a best one left out."""
    k = max(1, count // SAMPLE_STRIDE)
    threshold = np.partition(scores[::SAMPLE_STRIDE], -k)[-k]
    top = np.flatnonzero(scores >= threshold)
    if len(top) > 2 * count:
        top = np.sort(top[np.argpartition(scores[top], -count)[-count:]])
    return top
