"""Words read twice across a window seam.

A window that goes on from text kept before it (an earlier window's, or the prompt of a
carried tail) reads again the words said across the seam, alike or misheard: "...free to
confess that the | the old temptation", "...and form a rainbow. | and former rainbow.". Its
first words that repeat the last ones kept are dropped. Only at the window's very start: a
phrase said twice has audio of its own there.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence

from edgeasr.asr.text.pieces import EDGE_S, Piece
from edgeasr.asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SEAM_WORDS = 4  # the longest phrase a seam repeats (two words seen)
SEAM_TOKENS = 16  # the kept text's last tokens: enough for SEAM_WORDS words
SEAM_FUZZY_LETTERS = 8  # a misheard repeat is judged on this many letters at least
SEAM_FUZZY_RATIO = 0.8  # ... and must share this much of them ("andformerrainbow", "andformarainbow")


def repeats_the_end(head: list[str], kept: list[str]) -> bool:
    """Do the words `head` repeat the end of `kept`? The same words do, and so do nearly the
    same letters over as many words give or take one: a word cut by the seam is heard otherwise."""
    if kept[-len(head):] == head:
        return True
    letters = "".join(head)
    for m in (len(head) - 1, len(head), len(head) + 1):
        tail = "".join(kept[-m:]) if 0 < m <= len(kept) else ""
        if min(len(letters), len(tail)) >= SEAM_FUZZY_LETTERS and difflib.SequenceMatcher(
                None, letters, tail, autojunk=False).ratio() >= SEAM_FUZZY_RATIO:
            return True
    return False


class SeamRepeats:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def without_repeat(self, pieces: list[Piece], before: Sequence[int]) -> list[Piece]:
        """The window's pieces without their first words that repeat the end of `before`, the
        text tokens kept before the window."""
        if not pieces or not before or pieces[0].start > EDGE_S:
            return pieces
        kept = self.words_of(before[-SEAM_TOKENS:])
        first = pieces[0]
        for n in range(min(SEAM_WORDS, len(kept)), 0, -1):
            cut = self._after_words(first.tokens, n)
            if cut is not None and repeats_the_end(self.words_of(first.tokens[:cut]), kept):
                log.debug("dropped %d words repeated across a window seam", n)
                rest = Piece(first.start, first.end, first.tokens[cut:], first.logprobs[cut:])
                return ([rest] if rest.tokens else []) + pieces[1:]
        return pieces

    def words_of(self, tokens: Sequence[int]) -> list[str]:
        """The tokens' text as words of letters and digits, lower-cased."""
        words = ("".join(c for c in w if c.isalnum()) for w in self.tokenizer.decode(list(tokens)).lower().split())
        return [w for w in words if w]

    def _after_words(self, tokens: Sequence[int], n: int) -> int | None:
        """How many of the tokens make up their first n words (with the marks after them)."""
        for k in range(1, len(tokens) + 1):
            if len(self.words_of(tokens[:k])) > n:
                return k - 1
        return len(tokens) if len(self.words_of(tokens)) == n else None
