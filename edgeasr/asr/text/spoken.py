"""Is there speech under this text? Rules that judge decoded text by the audio under it.

A decoder that has run past the speech (a loop, or a "Thank you." at the end of the
padding) writes text over audio that holds none: the VAD says so. The rules work on time
spans: a segment's timestamps, or the alignment heads' times of its words (a phrase
repeated inside a segment, `said_again`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Segment timestamps are only roughly where the words are: look this far either side.
MARGIN_S = 0.2
# A segment with less speech than this under it (margins included) was not spoken.
MIN_SPOKEN_S = 0.15
# Speech a repeated token needs at least (fast speech is ~4 tokens per second): a repeat
# with less speech under it than its tokens need is the decoder looping, not the speaker.
SPOKEN_S_PER_TOKEN = 0.15


@dataclass(frozen=True)
class SpeechMap:
    """The VAD's verdict for each frame of a window (True: speech)."""

    speech: np.ndarray  # bool per frame
    frame_s: float
    origin_s: float = 0.0  # where the first frame starts, from the window's start (<= 0)

    def spoken_s(self, start: float, end: float) -> float:
        """Seconds of speech between start and end (seconds from the window's start)."""
        lo = max(0, int(np.floor((start - self.origin_s) / self.frame_s)))
        hi = min(len(self.speech), int(np.ceil((end - self.origin_s) / self.frame_s)))
        return float(np.count_nonzero(self.speech[lo:hi])) * self.frame_s if hi > lo else 0.0

    def is_spoken(self, start: float, end: float) -> bool:
        return self.spoken_s(start - MARGIN_S, end + MARGIN_S) >= MIN_SPOKEN_S


# What Whisper writes over silence and noise, learnt from subtitles (the "bag of
# hallucinations" of arXiv:2501.11378), lower-case without punctuation. Such a segment is
# kept only with speech under most of it.
STOCK_PHRASES = frozenset({
    "you", "thank you", "thanks", "thank you very much", "thanks for watching",
    "thank you for watching", "thank you so much for watching", "bye", "bye bye",
    "please subscribe", "subtitles by the amaraorg community",
})
STOCK_SPOKEN_FRACTION = 0.5


def stock_phrase(text: str) -> bool:
    words = "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()
    return " ".join(words) in STOCK_PHRASES


def silent(speech: SpeechMap, start: float, end: float) -> bool:
    """No speech under a segment (its margins included)."""
    return not speech.is_spoken(start, end)


def stock_phrase_unspoken(speech: SpeechMap, start: float, end: float, text: str) -> bool:
    """A stock phrase with speech under less than most of it."""
    return stock_phrase(text) and speech.spoken_s(start, end) < STOCK_SPOKEN_FRACTION * (end - start)


def repeat_is_spoken(speech: SpeechMap, start: float, end: float, repeated_tokens: int) -> bool:
    """A phrase said again ("tear down the fence! tear down the fence!") has speech under
    it, enough for its tokens; a loop has little or none."""
    return speech.spoken_s(start, end + MARGIN_S) >= SPOKEN_S_PER_TOKEN * repeated_tokens


# A phrase said again takes about as long, and holds about as much speech, as the first time.
SAID_AGAIN_MIN_SHARE = 0.5


def said_again(speech: SpeechMap, first: tuple[float, float], again: tuple[float, float]) -> bool:
    """Is a repeat, timed word by word (`first` and `again`: each saying's start and end),
    said again? A loop's tokens are squeezed into what audio is left, or lie past the speech;
    a phrase said again lasts, and has speech under it, about as the first saying does."""
    def lasts(span: tuple[float, float]) -> float:
        return span[1] - span[0]

    def spoken(span: tuple[float, float]) -> float:
        return speech.spoken_s(span[0], span[1] + MARGIN_S)

    return (lasts(again) >= SAID_AGAIN_MIN_SHARE * lasts(first)
            and spoken(again) >= max(MIN_SPOKEN_S, SAID_AGAIN_MIN_SHARE * spoken(first)))
