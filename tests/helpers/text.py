"""Comparing a transcript with its reference as the benchmarks score it."""

from __future__ import annotations

import functools


@functools.cache
def _normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """Whisper's English normalizer: case, punctuation, numbers and spellings folded."""
    return _normalizer()(text)


def wer(reference: str, hypothesis: str) -> float:
    """The word error rate of `hypothesis` against `reference`, both normalized."""
    import jiwer

    return jiwer.wer(normalize(reference), normalize(hypothesis))
