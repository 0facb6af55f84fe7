"""The loaded models an engine runs on, shared by every engine built on them.

The encoder and the decoder are loaded at once. The graphs only some engines use are made on
first use: a beam's batched step, the word aligner, the batched step of the search held to a
home's sentences. Engine variants (benches, ablation, a reload) are cheap: they share all of it.
"""

from __future__ import annotations

from edgeasr.asr.beam import BatchDecoderSession, BeamDecoder
from edgeasr.asr.commands_heard import CommandHearing
from edgeasr.asr.decoding import DecoderSession
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.features import MelSpec
from edgeasr.asr.grammar import ROWS as GRAMMAR_ROWS
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner
from edgeasr.bundle import BATCH_STEP_ROLE, Bundle
from edgeasr.config import DecoderConfig


class EngineSessions:
    """`precision` and `threads` are those of the graphs made on first use."""

    def __init__(self, bundle: Bundle, encoder: Encoder, decoder: DecoderSession,
                 precision: str = DecoderConfig.precision, threads: int = DecoderConfig.threads) -> None:
        self.bundle, self.encoder, self.decoder = bundle, encoder, decoder
        self.precision, self.threads = precision, threads
        self.tokenizer = Tokenizer(bundle)
        a = bundle.audio
        self.spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
        # the names prompts and the searches of the home's sentences, kept per vocabulary
        self.hearing = CommandHearing(decoder, self.tokenizer, bundle.tokens.eot)
        self._beams: dict[int, BeamDecoder] = {}
        self._aligner: WordAligner | None = None
        self._batch: BatchDecoderSession | None = None

    @property
    def max_prompt(self) -> int:
        """Prompt tokens at most: openai's half of the text context, less <|startofprev|>."""
        return self.bundle.n_text_ctx // 2 - 1

    def beam(self, size: int) -> BeamDecoder:
        """The beam search of `size` hypotheses (a ModelError without the batched step)."""
        if size not in self._beams:
            self._beams[size] = BeamDecoder(self.bundle, self.decoder, size, self.precision, self.threads)
        return self._beams[size]

    def aligner(self) -> WordAligner:
        """The word aligner (a ModelError without its graph or the alignment heads)."""
        if self._aligner is None:
            self._aligner = WordAligner(self.bundle, self.decoder, self.precision, self.threads)
        return self._aligner

    def batch(self) -> BatchDecoderSession | None:
        """The batched step for the search held to the home's sentences, None without it."""
        if self._batch is None and self.bundle.has_graph(BATCH_STEP_ROLE, self.precision):
            self._batch = BatchDecoderSession(self.bundle, self.decoder, GRAMMAR_ROWS, self.precision, self.threads)
        return self._batch
