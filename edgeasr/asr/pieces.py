"""A window's decoded tokens cut into pieces at its timestamps, and where the pieces' text
starts repeating itself (the decoder running on past the speech, or a speaker saying a phrase
again: `spoken.repeat_is_spoken` tells them apart by the VAD)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.spoken import SpeechMap, repeat_is_spoken, said_again


@dataclass
class Piece:
    """A segment of one window's text, as the timestamps around it cut it."""

    start: float  # seconds from the window start
    end: float | None  # None: no closing timestamp
    tokens: list[int]
    logprobs: list[float]


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
DISTANT_REPEAT = 6  # tokens: a longer phrase coming back anywhere in the window
# The start of every text token of the window's pieces in order, then the end of the text, in
# seconds from the window's start (`words.WordAligner.token_times`); asked for only when a
# repeat must be judged inside a segment.
TokenTimes = Callable[[], Sequence[float]]


def trim_repeats(pieces: list[Piece], speech: SpeechMap | None = None,
                 token_times: TokenTimes | None = None) -> list[Piece]:
    """The pieces up to where the text starts looping (`find_loop`)."""
    return find_loop(pieces, speech, token_times)[0]


def find_loop(pieces: list[Piece], speech: SpeechMap | None = None,
              token_times: TokenTimes | None = None) -> tuple[list[Piece], int | None]:
    """Cut where the window's text starts repeating itself: a short window makes the decoder
    run on past the speech. Shorter phrases recur in real speech ("it was here that ..., it
    was here that ..."), so only an immediate repeat or a long one counts. A speaker may say
    a phrase twice ("tear down the fence! tear down the fence!"): a loop has no audio under
    it, a repeat has. Given the VAD's `speech`, a repeat is kept when there is speech under it
    enough for its tokens (`spoken.repeat_is_spoken`), timed by its segment's timestamps when
    it is a segment of its own, else by `token_times` (the alignment heads) against the first
    saying (`spoken.said_again`). Returns the pieces cut there, and the index of the
    piece where the loop began (None: no loop)."""
    flat = [(i, j) for i, p in enumerate(pieces) for j in range(len(p.tokens))]
    text = [pieces[i].tokens[j] for i, j in flat]
    last_start: dict[tuple[int, ...], int] = {}
    long_first: dict[tuple[int, ...], int] = {}
    spoken_until = -1  # the tokens before this were judged said again: they repeat by right
    for k in range(len(text)):
        short, long = tuple(text[k : k + ADJACENT_REPEAT]), tuple(text[k : k + DISTANT_REPEAT])
        prev = last_start.get(short)
        last_start[short] = k
        first_long = long_first.setdefault(long, k)
        if len(short) == ADJACENT_REPEAT and prev is not None and k - prev <= ADJACENT_REPEAT + 1:
            first, length = prev, k - prev  # the phrase said again is text[first:k]
        elif len(long) == DISTANT_REPEAT and first_long < k:
            first, length = first_long, DISTANT_REPEAT
        else:
            continue
        if k < spoken_until:
            continue
        i, j = flat[k]
        p = pieces[i]
        if speech is not None and j == 0 and p.end is not None and repeat_is_spoken(
                speech, p.start, p.end, len(p.tokens)):
            spoken_until = k + len(p.tokens)  # said again, as a segment of its own
            continue
        if speech is not None and token_times is not None and _said_again(
                speech, token_times(), first, k, min(length, len(text) - k)):
            spoken_until = k + length  # said again, inside a segment
            continue
        cut = Piece(p.start, p.end, p.tokens[:j], p.logprobs[:j])
        return pieces[:i] + ([cut] if cut.tokens else []), _looped_piece(pieces, flat[first][0])
    return pieces, None


def _said_again(speech: SpeechMap, times: Sequence[float], first: int, again: int, length: int) -> bool:
    """Is text[again : again+length], a repeat of text[first : first+length], said again?"""
    return said_again(speech, (times[first], times[first + length]), (times[again], times[again + length]))


def _looped_piece(pieces: list[Piece], default: int) -> int:
    """The first piece that a later one ends like: a loop of whole segments, each saying
    closed by a made-up timestamp (an n-gram across a segment boundary can point one piece
    late); else `default`, the piece where the repeated phrase was first seen."""
    tails = [tuple(p.tokens[-ADJACENT_REPEAT:]) for p in pieces]
    for i, tail in enumerate(tails):
        if len(tail) == ADJACENT_REPEAT and tail in tails[i + 1 :]:
            return i
    return default
