"""Word timestamps for a decoded window, and the word-time helpers the window rules use.

`WordAligner` runs the bundle's `decoder_align` graph once per window, after decoding,
on the window's cross K/V as the decoder left them (`DecoderSession.cross_inputs`: the
padding row and its bias included, so the text is read in the context it was decoded
in), then `alignment.word_timings` turns the alignment heads' scores into words.

The sequence it aligns is openai's and CTranslate2's: the start-of-transcript prompt,
<|notimestamps|>, the window's text tokens (its timestamps left out) and end-of-text.
A word's probability is the mean of its tokens' probabilities as the decoder picked them
(`WindowResult.logprobs`), so the alignment graph needs no vocabulary projection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgeasr.asr import alignment
from edgeasr.asr.decoding import DecoderSession, start_sequence
from edgeasr.asr.encoder import ort_session
from edgeasr.asr.text.pieces import Piece
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.bundle import ALIGN_ROLE, Bundle
from edgeasr.config import DecoderConfig, ModelConfig
from edgeasr.errors import ModelError
from edgeasr.stages import Word


class WordAligner:
    def __init__(self, bundle: Bundle, decoder: DecoderSession, precision: str = DecoderConfig.precision,
                 threads: int = DecoderConfig.threads,
                 options: alignment.AlignOptions = alignment.DEFAULT_OPTIONS) -> None:
        if not bundle.alignment_heads:
            raise ModelError(f"{bundle.root}: the manifest lists no alignment heads (no word timestamps)")
        self.bundle, self.decoder, self.options = bundle, decoder, options
        self.session = ort_session(bundle.graph(ALIGN_ROLE, precision), threads)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer(bundle)
        self._last: tuple[tuple, np.ndarray] | None = None  # the last text's scores, by window and tokens

    def prompt(self, language: str, task: str) -> list[int]:
        """The start of transcript, language and task, as the decoder reads them (no earlier text)."""
        return start_sequence(self.bundle, language, task)

    def scores(self, sequence: list[int]) -> np.ndarray:
        """The alignment heads' cross-attention scores [heads, len(sequence), T] for the
        current window (after `DecoderSession.start`)."""
        rows = np.zeros((len(sequence), self.bundle.d_model), np.float32)
        self.decoder.embedding.read(sequence, rows)
        feed = {name: array for name, array in self.decoder.cross_inputs().items() if name in self.inputs}
        feed["token_embeddings"] = rows
        return self.session.run(None, feed)[0]

    def _text_scores(self, prompt: list[int], tokens: list[int]) -> np.ndarray:
        """scores() of the sequence openai aligns: prompt, no-timestamps, the text, end-of-text.
        The last ones are kept: the repeat rule and the words of a window read the same text
        of the same window (once the text rules removed nothing)."""
        tok = self.bundle.tokens
        key = (self.decoder.windows, tuple(prompt), tuple(tokens))
        if self._last is None or self._last[0] != key:
            self._last = (key, self.scores([*prompt, tok.no_timestamps, *tokens, tok.eot]))
        return self._last[1]

    def token_times(self, pieces: Sequence[Piece], n_samples: int, language: str,
                    task: str = ModelConfig.task) -> list[float]:
        """When each text token of the window just decoded starts, then when its text ends, in
        seconds from the window's start (`pieces.TokenTimes`)."""
        tokens = [t for p in pieces for t in p.tokens]
        a, prompt = self.bundle.audio, self.prompt(language, task)
        return alignment.token_times(
            self._text_scores(prompt, tokens), first_row=len(prompt), n_tokens=len(tokens),
            positions=n_samples // a.hop_length // 2, seconds_per_position=a.seconds_per_position,
            options=self.options).tolist()

    def words(self, pieces: Sequence[Piece], n_samples: int, language: str, task: str = ModelConfig.task,
              offset: float = 0.0) -> list[tuple[Word, ...]]:
        """The words of each piece of the window just decoded, in seconds from `offset` (the
        window's start in the audio); `n_samples`: the window's audio (its real positions)."""
        tokens = [t for p in pieces for t in p.tokens]
        if not tokens:
            return [() for _ in pieces]
        a, prompt = self.bundle.audio, self.prompt(language, task)
        scores = self._text_scores(prompt, tokens)
        spans = alignment.word_timings(
            scores, first_row=len(prompt), tokens=tokens,
            probabilities=[math.exp(lp) for p in pieces for lp in p.logprobs],
            positions=n_samples // a.hop_length // 2, decode=self.tokenizer.decode, language=language,
            seconds_per_position=a.seconds_per_position, options=self.options)
        bounds = [(p.start, p.end, len(p.tokens)) for p in pieces]
        return [tuple(Word(s.text, round(offset + s.start, 3), round(offset + s.end, 3), round(s.probability, 4))
                      for s in words)
                for words in alignment.per_piece(spans, bounds, self.options.max_median_s)]


# ---------------------------------------------------------------- a piece's words as text


def text_of(words: Sequence[Word]) -> str:
    """The words' text: the words of a segment spell its text exactly (leading spaces kept)."""
    return "".join(w.word for w in words)
