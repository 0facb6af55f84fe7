"""Word timestamps from the alignment heads' cross-attention: openai/whisper's method in numpy.

The decoder is run once more over the window's text (`words.WordAligner`, graph
`decoder_align`) and returns the cross-attention scores of the alignment heads, the few
heads whose attention follows the audio as the text goes on (manifest `alignment_heads`).
From those scores, as openai's `timing.py` and CTranslate2's `Whisper.align` do:

1. softmax over the window's real positions (the padding row is left out);
2. per head and position, normalise over the tokens (mean 0, standard deviation 1), so that
   a position every token looks at does not count;
3. median filter along time (width 7), then the mean over the heads: a tokens x positions
   similarity;
4. dynamic time warping through it: the cheapest monotonic path from the first token at the
   first position to the end-of-text at the last one. A token starts where the path first
   reaches its row;
5. tokens are grouped into words (a word starts at a token that begins with a space;
   punctuation joins its neighbour), a word lasting from its first token's start to the
   next word's start.

Times here are in encoder positions until `word_timings` turns them into seconds.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

# openai's defaults (transcribe.py): punctuation that joins the next word, or the previous one
PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"
# languages written without spaces: one word per decodable piece (openai's list)
NO_SPACE_LANGUAGES = ("zh", "ja", "th", "lo", "my", "yue")
REPLACEMENT_CHAR = "\ufffd"  # what a token that ends inside a UTF-8 character decodes to


@dataclass(frozen=True)
class AlignOptions:
    median_filter_width: int = 7  # positions; openai's and CTranslate2's default
    # openai's hacks against a word stretched over a pause: at a sentence end (and at a
    # segment's ends) no word lasts longer than twice the median word, taken as at most this
    max_median_s: float = 0.7


DEFAULT_OPTIONS = AlignOptions()


@dataclass
class WordSpan:
    """A word while it is being built: its text, tokens and times in positions."""

    text: str
    tokens: list[int]
    start: float
    end: float
    probability: float


# ---------------------------------------------------------------- the similarity matrix


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over `width` neighbours along the last axis, edges mirrored (numpy's 'reflect',
    as openai's torch padding and CTranslate2's kernel do); an axis too short is returned as is.

    The `width` shifted copies are sorted element-wise by an odd-even transposition network
    (width rounds of neighbour compare-and-swap), a few dozen whole-array minima and maxima
    instead of a partition per window (measured: 27 -> 3 ms for a window of 33 tokens)."""
    half = width // 2
    n = x.shape[-1]
    if n <= half:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    values = [padded[..., k : k + n] for k in range(width)]
    for round_ in range(width):
        for i in range(round_ % 2, width - 1, 2):
            values[i], values[i + 1] = np.minimum(values[i], values[i + 1]), np.maximum(values[i], values[i + 1])
    return values[half]


def similarity(scores: np.ndarray, positions: int, rows: slice, width: int) -> np.ndarray:
    """Alignment heads' scores [heads, tokens, T] -> the tokens x positions similarity of
    `rows` (the text tokens' rows), over the first `positions` (the window's real audio)."""
    weights = softmax(scores[:, :, :positions])  # float32, as CTranslate2 computes it
    mean = weights.mean(axis=1, keepdims=True)
    std = weights.std(axis=1, keepdims=True)  # over the tokens: a position all of them read is noise
    weights = (weights - mean) / np.maximum(std, np.finfo(np.float32).tiny)
    return median_filter(weights[:, rows], width).mean(axis=0)


# ---------------------------------------------------------------- dynamic time warping


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` [n, m] from (0, 0) to (n-1, m-1), moving by
    (1, 1), (1, 0) or (0, 1): its row and column indices. Ties are broken as openai's and
    CTranslate2's loops break them (diagonal, then down, else right).

    A row at a time: along a row, cost[i, j] = x[j] + min(up_j, cost[i, j-1]) unrolls into
    a running minimum over cumulative sums, so each row is a few numpy operations instead of
    m Python steps."""
    n, m = cost.shape
    prev = np.full(m + 1, np.inf)  # the row above, with column 0 (only (0, 0) is free)
    prev[0] = 0.0
    trace = np.empty((n + 1, m + 1), np.int8)
    for i in range(1, n + 1):
        x = cost[i - 1].astype(np.float64)
        diagonal, up = prev[:-1], prev[1:]
        best_above = np.minimum(diagonal, up)
        sums = np.concatenate([[0.0], np.cumsum(x)])  # sums[j] = x[0] + ... + x[j-1]
        row = np.empty(m + 1)
        row[0] = np.inf
        row[1:] = np.minimum.accumulate(best_above - sums[:-1]) + sums[1:]
        left = row[:-1]
        trace[i, 1:] = np.where((diagonal < up) & (diagonal < left), 0,
                                np.where((up < diagonal) & (up < left), 1, 2))
        prev = row
    return _backtrace(trace, n, m)


def _backtrace(trace: np.ndarray, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    trace[0, :] = 2  # on the edges the only way back is along them
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def token_starts(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Per row of the path (text token, then end-of-text), the column where it is first reached."""
    first = np.concatenate([[True], np.diff(rows) != 0])
    return cols[first]


# ---------------------------------------------------------------- words


def split_words(tokens: list[int], decode, language: str) -> list[tuple[str, list[int]]]:
    """Group text tokens into words as openai's tokenizer does: first into pieces that decode
    to whole characters (a token may end inside a UTF-8 character), then, for languages
    written with spaces, a piece that starts with a space or is punctuation starts a word."""
    whole = decode(tokens)
    pieces: list[tuple[str, list[int]]] = []
    current: list[int] = []
    done = 0  # characters of `whole` the pieces so far account for
    for token in tokens:
        current.append(token)
        text = decode(current)
        bad = text.find(REPLACEMENT_CHAR)
        # a replacement character that the whole text has too is a real one, not a cut
        if bad < 0 or whole[done + bad : done + bad + 1] == REPLACEMENT_CHAR:
            pieces.append((text, current))
            current, done = [], done + len(text)
    if current:
        pieces.append((decode(current), current))
    if language in NO_SPACE_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, piece in pieces:
        # `in` on strings, as openai has it: a lone space counts as punctuation too
        if not words or text.startswith(" ") or text.strip() in string.punctuation:
            words.append((text, list(piece)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + piece)
    return words


def word_spans(words: list[tuple[str, list[int]]], starts: np.ndarray,
               probabilities: list[float]) -> list[WordSpan]:
    """Each word from its first token's start to the next word's (the last one to the
    end-of-text's); `starts` has a start per text token plus the end-of-text's. A word's
    probability is the mean of its tokens' (openai's)."""
    spans, k = [], 0
    for text, tokens in words:
        probs = probabilities[k : k + len(tokens)]
        spans.append(WordSpan(text, list(tokens), float(starts[k]), float(starts[k + len(tokens)]),
                              float(np.mean(probs))))
        k += len(tokens)
    return spans


def limit_sentence_ends(spans: list[WordSpan], max_median: float) -> None:
    """openai's hack: a sentence-end mark, or the word after one, that lasts longer than twice
    the median word (the median at most `max_median`) is cut to that: the path stretched it
    over a pause."""
    durations = np.array([s.end - s.start for s in spans])
    durations = durations[durations.nonzero()]
    if not len(durations):
        return
    longest = 2 * min(max_median, float(np.median(durations)))
    for prev, span in zip(spans, spans[1:]):
        if span.end - span.start > longest:
            if span.text in SENTENCE_END:
                span.end = span.start + longest
            elif prev.text in SENTENCE_END:
                span.start = span.end - longest


def merge_punctuation(spans: list[WordSpan]) -> list[WordSpan]:
    """Opening marks join the word after them (keeping its times), closing marks the word
    before them (openai's merge_punctuations, with its substring tests); the text and the
    tokens stay in order, so the words still spell the text."""
    following = len(spans) - 1
    for i in range(len(spans) - 2, -1, -1):  # backwards: a run of opening marks joins one word
        mark = spans[i]
        if mark.text.startswith(" ") and mark.text.strip() in PREPEND_PUNCTUATION:
            spans[following].text = mark.text + spans[following].text
            spans[following].tokens = mark.tokens + spans[following].tokens
            mark.text, mark.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(spans)):
        mark = spans[j]
        if not spans[previous].text.endswith(" ") and mark.text in APPEND_PUNCTUATION:
            spans[previous].text += mark.text
            spans[previous].tokens += mark.tokens
            mark.text, mark.tokens = "", []
        else:
            previous = j
    return spans


# ---------------------------------------------------------------- a window's words


def path_starts(matrix: np.ndarray) -> np.ndarray:
    """Per row of the similarity (text tokens, then end-of-text), the position where the
    cheapest path through -matrix reaches it first."""
    rows, cols = dtw(-matrix)
    return token_starts(rows, cols)


def token_times(scores: np.ndarray, *, first_row: int, n_tokens: int, positions: int,
                seconds_per_position: float, options: AlignOptions = DEFAULT_OPTIONS) -> np.ndarray:
    """When each of the `n_tokens` text tokens starts, then when the text ends (the
    end-of-text's row), in seconds from the window's start (`word_timings`' arguments)."""
    rows = slice(first_row, first_row + n_tokens + 1)
    matrix = similarity(scores, positions, rows, options.median_filter_width)
    return path_starts(matrix) * seconds_per_position


def word_timings(scores: np.ndarray, *, first_row: int, tokens: list[int], probabilities: list[float],
                 positions: int, decode, language: str, seconds_per_position: float,
                 options: AlignOptions = DEFAULT_OPTIONS) -> list[WordSpan]:
    """The words of `tokens` (a window's text tokens) with their times in seconds from the
    window's start. `scores` [heads, rows, T] are decoder_align's for the sequence
    prompt + no-timestamps + tokens + end-of-text; the row at `first_row` (the
    no-timestamps token's) is the one that predicts the first text token. `positions`: the
    window's real positions; `probabilities`: each token's."""
    if not tokens:
        return []
    starts = token_times(scores, first_row=first_row, n_tokens=len(tokens), positions=positions,
                         seconds_per_position=seconds_per_position, options=options)
    spans = word_spans(split_words(tokens, decode, language), starts, probabilities)
    limit_sentence_ends(spans, options.max_median_s)
    return merge_punctuation(spans)


def median_word(spans: list[WordSpan], max_median: float) -> float:
    durations = [s.end - s.start for s in spans if s.end > s.start]
    return min(max_median, float(np.median(durations))) if durations else 0.0


def per_piece(spans: list[WordSpan], pieces: list[tuple[float, float | None, int]],
              max_median: float) -> list[list[WordSpan]]:
    """The words of each piece (start s, end s or None, text tokens), in order: a word goes to
    the piece whose tokens it starts in (openai's walk). A piece's first (last) word that
    reaches more than 0.5 s before (after) the piece's timestamp is pulled in to it: the path
    stretched it over a pause. The pieces' own times are left as they are."""
    median = median_word(spans, max_median)
    out: list[list[WordSpan]] = []
    k = 0
    for start, end, n_tokens in pieces:
        words, taken = [], 0
        while k < len(spans) and taken < n_tokens:
            if spans[k].text.strip():  # not a mark merged away, nor a stray space
                words.append(spans[k])
            taken += len(spans[k].tokens)
            k += 1
        if words and start < words[0].end and start - 0.5 > words[0].start:
            words[0].start = max(0.0, min(words[0].end - median, start))
        if words and end is not None and end > words[-1].start and end + 0.5 < words[-1].end:
            words[-1].end = max(words[-1].start + median, end)
        out.append(words)
    return out
