"""A window's decoded tokens cut into pieces at its timestamps, and where the pieces' text
starts repeating itself (the decoder running on past the speech, or a speaker saying a phrase
again: `spoken.repeat_is_spoken` tells them apart by the VAD). Also what the text rules and the
window walk agree on about a window's edges."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.text.spoken import SpeechMap, repeat_is_spoken, said_again

MIN_WINDOW_S = 0.1  # a shorter remainder of audio holds no word
MIN_ADVANCE_S = 1.0  # a window that would seek less than this is taken whole (no stalls)
EDGE_S = 0.5  # a segment "closed" this close to the edge of a cut window was closed by the edge


@dataclass
class Piece:
    """A segment of one window's text, as the timestamps around it cut it."""

    start: float  # seconds from the window start
    end: float | None  # None: no closing timestamp
    tokens: list[int]
    logprobs: list[float]


def piece_end(piece: Piece, chunk: np.ndarray, sample_rate: int) -> float:
    """Where a piece ends in its window: its closing timestamp, or the window's end."""
    return piece.end if piece.end is not None else len(chunk) / sample_rate


def split_segments(result: WindowResult, timestamp_begin: int, seconds_per_position: float) -> list[Piece]:
    """Cut the token stream at timestamps: <t0> text <t1><t1> text <t2> ... [text]."""
    pieces: list[Piece] = []
    current: Piece | None = None
    for token, lp in zip(result.tokens, result.logprobs):
        if token >= timestamp_begin:
            t = (token - timestamp_begin) * seconds_per_position
            if current is not None and current.tokens:
                current.end = t
                pieces.append(current)
                current = None
            elif current is None:
                current = Piece(t, None, [], [])
        else:
            if current is None:
                start = pieces[-1].end if pieces else None
                current = Piece(start if start is not None else 0.0, None, [], [])
            current.tokens.append(token)
            current.logprobs.append(lp)
    if current is not None and current.tokens:
        pieces.append(current)
    return pieces


ADJACENT_REPEAT = 4  # tokens: a phrase said again at once ("by a similar process, by a similar process")
MIN_PHRASE = 3  # tokens: a shorter phrase said twice in a row is not judged ("the the" may be said)
DISTANT_REPEAT = 6  # tokens: a longer phrase coming back anywhere in the window
# tokens between a phrase and its repeat: a loop often joins them with a word ("...harshly
# feel, and he makes me harshly feel.", a 10 s window of tiny.en at the end of a sentence)
REPEAT_GAP = 2
# The start of every text token of the window's pieces in order, then the end of the text, in
# seconds from the window's start (`words.WordAligner.token_times`); asked for only when a
# repeat must be judged inside a segment.
TokenTimes = Callable[[], Sequence[float]]


# A token's key for the repeat rule ("" for punctuation: left out of the comparison). A loop
# changes case and marks ("... she missed the pleasant little interviews. She missed the
# pleasant little interviews, ...", measured on tiny.en): token ids alone miss it.
TokenKey = Callable[[int], str]


def trim_repeats(pieces: list[Piece], speech: SpeechMap | None = None,
                 token_times: TokenTimes | None = None, key: TokenKey = str) -> list[Piece]:
    """The pieces up to where the text starts looping (`find_loop`)."""
    return find_loop(pieces, speech, token_times, key)[0]


def find_loop(pieces: list[Piece], speech: SpeechMap | None = None,
              token_times: TokenTimes | None = None, key: TokenKey = str) -> tuple[list[Piece], int | None]:
    """Cut where the window's text starts repeating itself: a short window makes the decoder
    run on past the speech. Shorter phrases recur in real speech ("it was here that ..., it
    was here that ..."), so only an immediate repeat or a long one counts; tokens are compared
    by `key` (case and punctuation folded), punctuation left out. A speaker may say a phrase
    twice ("tear down the fence! tear down the fence!"): a loop has no audio under it, a repeat
    has. Given the VAD's `speech`, a repeat is kept when there is speech under it enough for
    its tokens (`spoken.repeat_is_spoken`), timed by its segment's timestamps when it is a
    segment of its own, else by `token_times` (the alignment heads) against the first saying
    (`spoken.said_again`). Returns the pieces cut there, and the index of the piece where the
    loop began (None: no loop)."""
    flat = [(i, j) for i, p in enumerate(pieces) for j in range(len(p.tokens))]
    keys = [key(pieces[i].tokens[j]) for i, j in flat]
    at = [n for n, k in enumerate(keys) if k]  # the compared tokens' places in `flat`
    text = [keys[n] for n in at]
    starts: dict[int, int] = {}  # piece -> where its first compared token is in `text`
    for k, n in enumerate(at):
        starts.setdefault(flat[n][0], k)
    last_start: dict[tuple[str, ...], int] = {}
    long_first: dict[tuple[str, ...], int] = {}
    spoken_until = -1  # the tokens before this were judged said again: they repeat by right
    for k in range(len(text)):
        short, long = tuple(text[k : k + ADJACENT_REPEAT]), tuple(text[k : k + DISTANT_REPEAT])
        prev = last_start.get(short)
        last_start[short] = k
        first_long = long_first.setdefault(long, k)
        said_twice = next((n for n in range(MIN_PHRASE, ADJACENT_REPEAT + 2)
                           if k >= n and text[k - n : k] == text[k : k + n]), None)
        if len(short) == ADJACENT_REPEAT and prev is not None and k - prev < DISTANT_REPEAT + REPEAT_GAP:
            first, length = prev, k - prev  # the phrase said again is text[first:k]
        elif said_twice is not None:  # a phrase said twice in a row, maybe the text's last words
            first, length = k - said_twice, said_twice
        elif len(long) == DISTANT_REPEAT and first_long < k:
            first, length = first_long, DISTANT_REPEAT
        else:
            continue
        if k < spoken_until:
            continue
        i, j = flat[at[k]]
        p = pieces[i]
        if speech is not None and starts[i] == k and p.end is not None and repeat_is_spoken(
                speech, p.start, p.end, len(p.tokens)):
            spoken_until = k + sum(1 for n in at if flat[n][0] == i)  # said again, as a segment of its own
            continue
        length = min(length, len(text) - k)
        if speech is not None and token_times is not None and _said_again(
                speech, token_times(), at[first], at[first + length - 1] + 1, at[k], at[k + length - 1] + 1):
            spoken_until = k + length  # said again, inside a segment
            continue
        cut = Piece(p.start, p.end, p.tokens[:j], p.logprobs[:j])
        return pieces[:i] + ([cut] if cut.tokens else []), _looped_piece(pieces, flat[at[first]][0], key)
    return pieces, None


def _said_again(speech: SpeechMap, times: Sequence[float], first: int, first_end: int, again: int,
                again_end: int) -> bool:
    """Is the repeat at tokens [again, again_end) of the window's text, of [first, first_end),
    said again?"""
    return said_again(speech, (times[first], times[first_end]), (times[again], times[again_end]))


def _looped_piece(pieces: list[Piece], default: int, key: TokenKey) -> int:
    """The first piece that a later one ends like: a loop of whole segments, each saying
    closed by a made-up timestamp (an n-gram across a segment boundary can point one piece
    late); else `default`, the piece where the repeated phrase was first seen."""
    tails = [tuple(k for k in map(key, p.tokens) if k)[-ADJACENT_REPEAT:] for p in pieces]
    for i, tail in enumerate(tails):
        if len(tail) == ADJACENT_REPEAT and tail in tails[i + 1 :]:
            return i
    return default
