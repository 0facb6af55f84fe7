"""A window's decoded tokens cut into pieces at its timestamps, and where the pieces' text
starts repeating itself (the decoder running on past the speech, or a speaker saying a phrase
again: `spoken.repeat_is_spoken` tells them apart by the VAD)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.spoken import SpeechMap, repeat_is_spoken


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


def trim_repeats(pieces: list[Piece], speech: SpeechMap | None = None) -> list[Piece]:
    """The pieces up to where the text starts looping (`find_loop`)."""
    return find_loop(pieces, speech)[0]


def find_loop(pieces: list[Piece], speech: SpeechMap | None = None) -> tuple[list[Piece], int | None]:
    """Cut where the window's text starts repeating itself: a short window makes the decoder
    run on past the speech. Shorter phrases recur in real speech ("it was here that ..., it
    was here that ..."), so only an immediate repeat or a long one counts. A speaker may say
    a phrase twice ("tear down the fence! tear down the fence!"): a repeat that the decoder
    timestamped as a segment of its own is kept when the VAD hears enough speech under it
    for its tokens (`spoken.repeat_is_spoken`). Inside a segment the timestamps cannot tell
    (word timestamps will). Returns the pieces cut there, and the index of the piece where
    the loop began (None: no loop)."""
    flat = [(i, j) for i, p in enumerate(pieces) for j in range(len(p.tokens))]
    text = [pieces[i].tokens[j] for i, j in flat]
    last_start: dict[tuple[int, ...], int] = {}
    long_first: dict[tuple[int, ...], int] = {}
    spoken_again = -1  # a piece judged said again: its tokens repeat by right
    for k in range(len(text)):
        short, long = tuple(text[k : k + ADJACENT_REPEAT]), tuple(text[k : k + DISTANT_REPEAT])
        prev = last_start.get(short)
        last_start[short] = k
        first_long = long_first.setdefault(long, k)
        if len(short) == ADJACENT_REPEAT and prev is not None and k - prev <= ADJACENT_REPEAT + 1:
            first = prev
        elif len(long) == DISTANT_REPEAT and first_long < k:
            first = first_long
        else:
            continue
        i, j = flat[k]
        p = pieces[i]
        if i == spoken_again:
            continue
        if (speech is not None and j == 0 and p.end is not None
                and repeat_is_spoken(speech, p.start, p.end, len(p.tokens))):
            spoken_again = i  # said again, as a segment of its own
            continue
        cut = Piece(p.start, p.end, p.tokens[:j], p.logprobs[:j])
        return pieces[:i] + ([cut] if cut.tokens else []), _looped_piece(pieces, flat[first][0])
    return pieces, None


def _looped_piece(pieces: list[Piece], default: int) -> int:
    """The first piece that a later one ends like: a loop of whole segments, each saying
    closed by a made-up timestamp (an n-gram across a segment boundary can point one piece
    late); else `default`, the piece where the repeated phrase was first seen."""
    tails = [tuple(p.tokens[-ADJACENT_REPEAT:]) for p in pieces]
    for i, tail in enumerate(tails):
        if len(tail) == ADJACENT_REPEAT and tail in tails[i + 1 :]:
            return i
    return default
