"""A window's kept pieces as timed words, and the closing words with no audio under them.

A window that ends in a pause makes the decoder run on past the speech: base read a stream's
segment cut in a pause as "... he makes me harshly feel. He makes me", its last three words
aligned at 9.90-9.90 s of 9.93. Such closing words, squeezed into no time at the very end of
the audio, are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.text.pieces import EDGE_S, Piece, piece_end
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner, text_of
from edgeasr.stages import Word

log = logging.getLogger(__name__)


class WindowWords:
    """`aligner`: word timestamps for the transcripts (None: none). `judge`: the aligner that
    judges words by the audio under them, for the unspoken tail (None: the rule is off)."""

    def __init__(self, tokenizer: Tokenizer, sample_rate: int, task: str, aligner: WordAligner | None = None,
                 judge: Callable[[], WordAligner] | None = None) -> None:
        self.tokenizer, self.sample_rate, self.task = tokenizer, sample_rate, task
        self.aligner, self.judge = aligner, judge

    def words(self, pieces: list[Piece], chunk: np.ndarray, result: WindowResult, offset: float, complete: bool,
              continues: bool = False) -> tuple[list[Piece], list[tuple[Word, ...]], bool]:
        """Each kept piece's words, timed from the audio start (none without an aligner), and
        whether the aligner ran. The last window of audio decoded in several (`continues`:
        windows or a call before it) may hold the end of the speech only, and with little audio
        the decoder runs on: when its text runs to the end of its audio, it loses the closing
        words with no audio under them."""
        sr = self.sample_rate
        runs_to_end = (bool(pieces) and complete and continues
                       and piece_end(pieces[-1], chunk, sr) > len(chunk) / sr - EDGE_S)
        aligner = (self.judge() if self.judge is not None else None) if runs_to_end else self.aligner
        if aligner is None:
            return pieces, [() for _ in pieces], False
        words = aligner.words(pieces, len(chunk), result.language, self.task, offset)
        if runs_to_end:
            pieces, words = self.drop_unspoken_tail(pieces, words, offset + len(chunk) / sr)
        return pieces, words if self.aligner is not None else [() for _ in pieces], True

    def drop_unspoken_tail(self, pieces: list[Piece], words: list[tuple[Word, ...]],
                           audio_end: float) -> tuple[list[Piece], list[tuple[Word, ...]]]:
        """Without the last piece's closing words that the alignment squeezes into no time at the
        very end of the audio: they have no audio under them."""
        last = list(words[-1]) if words else []
        n = len(last)
        while n and last[n - 1].end <= last[n - 1].start and last[n - 1].start >= audio_end - EDGE_S:
            n -= 1
        if n == len(last):
            return pieces, words
        log.debug("dropped %d unspoken words at the end of a window", len(last) - n)
        piece, kept = pieces[-1], text_of(last[:n]).strip()
        k = len(piece.tokens)
        while k and self.tokenizer.decode(piece.tokens[:k]).strip() != kept:
            k -= 1
        if k == 0:
            return pieces[:-1], words[:-1]
        cut = Piece(piece.start, piece.end, piece.tokens[:k], piece.logprobs[:k])
        return [*pieces[:-1], cut], [*words[:-1], tuple(last[:n])]
