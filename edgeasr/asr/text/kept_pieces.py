"""Which of a decoded window's pieces are kept, and how much of the window they account for.

Greedy decoding loops when speech runs into the window edge, so a window cut in speech keeps
only its segments closed by a timestamp, and the next window starts at the last of them. The
last window of final audio keeps its open tail too. Text that starts repeating itself over
audio that does not is cut there, and text with no speech under it is dropped when the decoder
doubts it as well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.engine import Guards
from edgeasr.asr.gates import Gate, NoSpeech, WindowStats, check, compression_ratio
from edgeasr.asr.text.pieces import (
    EDGE_S,
    MIN_ADVANCE_S,
    MIN_WINDOW_S,
    Piece,
    TokenTimes,
    find_loop,
    piece_end,
    split_segments,
    trim_repeats,
)
from edgeasr.asr.text.spoken import SpeechMap, silent, stock_phrase_unspoken
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner
from edgeasr.bundle import Bundle

MIN_S_PER_TOKEN = 0.05  # a closed segment shorter than this per token has bogus timestamps
# the end of speech decoded again after text kept from the same audio, shorter than a second,
# that the model calls likelier silence than speech: its text is made up
SHORT_TAIL_NO_SPEECH = 0.5


class KeptPieces:
    """The rules that choose a window's pieces. `judge` gives the aligner that times a window's
    tokens for the repeat rule (None: the rule goes by the tokens alone)."""

    def __init__(self, bundle: Bundle, tokenizer: Tokenizer, gates: tuple[Gate, ...], guards: Guards,
                 task: str, judge: Callable[[], WordAligner] | None = None) -> None:
        self.bundle, self.tokenizer, self.gates, self.guards, self.task = bundle, tokenizer, gates, guards, task
        self.judge = judge
        self.sample_rate = bundle.audio.sample_rate
        # a text token's letters and digits, lower-cased: what the repeat rule compares
        self.word_key = functools.lru_cache(maxsize=bundle.n_vocab)(
            lambda token: "".join(c for c in tokenizer.decode([token]).lower() if c.isalnum()))

    def keep(self, result: WindowResult, chunk: np.ndarray, last: bool, speech: SpeechMap | None = None,
             more: bool = False, temperature: float = 0.0, follows: bool = False) -> tuple[list[Piece], int]:
        """The pieces to keep and how many samples they account for. They end where the text
        starts repeating itself over audio that does not: a short window makes the decoder run
        on past the speech. Given the VAD's `speech`, only pieces spoken are kept. `last`: the
        window's speech is complete. `more`: audio follows the window, so a loop's phrase can be
        decoded again in the next one. `follows`: the window goes on from text kept before it
        of the same audio."""
        sr = self.sample_rate
        if self.guards.short_tails and follows and self._short_tail(result, chunk, last):
            return [], len(chunk)
        decoded = split_segments(result, self.bundle.tokens.timestamp_begin, self.bundle.audio.seconds_per_position)
        times = self._token_times(decoded, chunk, result)
        loop_from = None
        if self.guards.repeats:
            # a window that ran to the token cap is looping: speech under a repeat proves nothing
            _, loop_from = find_loop(decoded, None if result.hit_cap else speech, times, self.word_key)
        if loop_from is not None and more and decoded[loop_from].start >= MIN_ADVANCE_S:
            # a loop (the window's edge makes greedy decoding run on) stamps even the looped
            # phrase's first saying too early: decode from where that piece began again
            # (base: "feel. He makes me harshly feel.<7.92><7.92> He makes me...")
            pieces, advance = decoded[:loop_from], int(decoded[loop_from].start * sr)
        else:
            pieces, advance = self._closed(decoded, result, chunk, last)
            if self.guards.repeats:
                pieces = trim_repeats(pieces, speech, times, self.word_key)  # a prefix of `decoded`: the same times
        if speech is not None:
            spoken = [p for p in pieces if self._spoken(p, piece_end(p, chunk, sr), result, speech, temperature)]
            # the rules never empty a window the VAD hears speech in: its only text may be what
            # was said ("mute", heard as "You...", is no "you" over silence)
            if spoken or not speech.is_spoken(0.0, len(chunk) / sr):
                pieces = spoken
        return pieces, advance

    def _short_tail(self, result: WindowResult, chunk: np.ndarray, last: bool) -> bool:
        """The last second of speech after kept text, likelier silence than speech to the model:
        base read "...lobster fat." then "Mr. Fat." over the 0.8 s after it, and "...than she
        suspected." then "Thank you." over the 0.6 s after it (the VAD heard speech in both)."""
        return (last and len(chunk) < MIN_ADVANCE_S * self.sample_rate
                and result.no_speech_prob >= SHORT_TAIL_NO_SPEECH)

    def _spoken(self, piece: Piece, end: float, result: WindowResult, speech: SpeechMap,
                temperature: float) -> bool:
        """Keep a piece unless the audio under it says it was not spoken: no speech under it
        while the decoder doubts it too (`_doubted`), or a stock phrase over little speech. The
        VAD alone is not enough: it misses quiet speech (webrtcvad heard 3 frames of a FLEURS
        sentence at -67 dBFS that Whisper read right at once)."""
        text = self.tokenizer.decode(piece.tokens)
        if self.guards.silent_segments and silent(speech, piece.start, end) and self._doubted(
                piece, text, result, temperature):
            return False
        return not (self.guards.stock_phrases and stock_phrase_unspoken(speech, piece.start, end, text))

    def _doubted(self, piece: Piece, text: str, result: WindowResult, temperature: float) -> bool:
        """Does the decoder doubt a piece? Its window needed the temperature fallback, ran to the
        token cap or is likelier silence than not, or a quality gate fails on the piece alone
        (a window of the silence after a VCTK sentence, read "and former rainbow." at
        temperature 0.6 after three failed attempts)."""
        silence = next((g.no_speech_threshold for g in self.gates if isinstance(g, NoSpeech)), 1.0)
        if temperature > 0 or result.hit_cap or result.no_speech_prob > silence:
            return True
        stats = WindowStats(text, float(np.mean(piece.logprobs)), result.no_speech_prob, compression_ratio(text))
        return check(self.gates, stats) is not None

    def _token_times(self, pieces: list[Piece], chunk: np.ndarray, result: WindowResult) -> TokenTimes | None:
        """The window's token times from the alignment heads, for the repeat rule. They are
        aligned at most once, and only if asked for (a repeat inside a segment)."""
        judge = self.judge
        if judge is None:
            return None

        @functools.cache
        def times() -> Sequence[float]:
            return judge().token_times(pieces, len(chunk), result.language, self.task)

        return times

    def _stopped_early(self, result: WindowResult, pieces: list[Piece], chunk: np.ndarray) -> int | None:
        """Where to go on if the decoder opened a segment and stopped at once ("<6.26><6.26>"
        then end-of-text) well before the window's end: the speech after it was never
        transcribed (a pause-cut window lost the 2.5 s after such a stop). openai seeks to
        that timestamp too."""
        begin, sr = self.bundle.tokens.timestamp_begin, self.sample_rate
        if result.hit_cap or len(result.tokens) < 2 or min(result.tokens[-2:]) < begin or not pieces:
            return None
        stop = int(pieces[-1].end * sr) if pieces[-1].end is not None else len(chunk)
        return stop if MIN_ADVANCE_S * sr <= stop <= len(chunk) - MIN_WINDOW_S * sr else None

    def _closed(self, pieces: list[Piece], result: WindowResult, chunk: np.ndarray,
                last: bool) -> tuple[list[Piece], int]:
        """The pieces closed by believable timestamps, and the samples up to the last of them."""
        sr = self.sample_rate
        stopped_at = self._stopped_early(result, pieces, chunk)
        if last and not result.hit_cap:
            # the audio ends here: an open tail is complete too
            return pieces, stopped_at or len(chunk)
        good: list[Piece] = []  # closed pieces with believable timestamps, in order
        ends: list[float] = []
        for p in pieces:
            if p.end is None or p.end - p.start < MIN_S_PER_TOKEN * len(p.tokens):
                break  # open, or squeezed into a few ms: the loop has begun
            good.append(p)
            ends.append(p.end)
        if not good:
            # no usable timestamp: keep the text up to where it starts repeating
            return pieces[:1], len(chunk)
        if len(good) > 1 and ends[-1] > len(chunk) / sr - EDGE_S:
            good.pop()  # closed by the window edge, maybe mid-word: decode it again
        elif len(good) == len(pieces) and not result.hit_cap:
            return good, stopped_at or len(chunk)  # ended on a timestamp: the window is done
        advance = int(ends[len(good) - 1] * sr)
        return good, (len(chunk) if advance < MIN_ADVANCE_S * sr else min(advance, len(chunk)))
