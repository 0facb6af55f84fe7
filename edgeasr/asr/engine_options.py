"""What an engine does, fixed when it is built.

An engine never changes after it is built: a variant (a bench's row, an ablation's rule, the
settings a SIGHUP reloads) is another engine, built from other options on the same sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeasr.asr.decoding import DecodingOptions
from edgeasr.asr.gates import Gate, default_gates
from edgeasr.asr.vocabulary import MEANS
from edgeasr.config import GATE_FAILURE_ACTIONS, DecoderConfig
from edgeasr.errors import ConfigError


@dataclass(frozen=True)
class Fallback:
    """Temperatures to decode a failed window again at: step, 2*step, ... up to 1.0."""

    step: float = DecoderConfig.fallback_temperature_step
    # above this temperature the retry is decoded without the earlier text as prompt
    prompt_reset_temperature: float = 0.5

    def temperatures(self) -> tuple[float, ...]:
        n = int(round(1.0 / self.step)) if self.step > 0 else 0
        return (0.0, *(round(self.step * i, 3) for i in range(1, n + 1)))


@dataclass(frozen=True)
class Guards:
    """The rules beside the quality gates that can remove decoded text. Each can be turned off:
    `edgeasr models ablate` counts the real and the made-up words each one removes."""

    repeats: bool = True  # a window's text cut where it starts repeating itself (pieces.find_loop)
    silent_segments: bool = True  # a segment with no speech under it that the decoder doubts too
    stock_phrases: bool = True  # "Thank you." and the like over little speech (spoken.stock_phrase)
    short_tails: bool = True  # a last second after kept text that the model calls silence (kept_pieces)


@dataclass(frozen=True)
class EngineOptions:
    decoding: DecodingOptions
    gates: tuple[Gate, ...] = default_gates()
    on_gate_fail: str = DecoderConfig.on_gate_fail  # one of config.GATE_FAILURE_ACTIONS
    fallback: Fallback = Fallback()
    guards: Guards = Guards()
    beam_size: int = 1  # 1: greedy decoding; more: a beam search of that many hypotheses
    words: bool = False  # word timestamps in the segments (output.words)
    # the rules that judge words by the audio under them: a window's closing words, a repeat
    # inside a segment (decoder.drop_unspoken_words, where the bundle has the aligner)
    judge_words: bool = False
    # which of vocabulary.MEANS a vocabulary is heard with (bench-commands measures each)
    hearing: frozenset[str] = frozenset(MEANS)

    def __post_init__(self) -> None:
        if self.on_gate_fail not in GATE_FAILURE_ACTIONS:
            raise ConfigError(f"decoder.on_gate_fail: {self.on_gate_fail!r} is not allowed "
                              f"({', '.join(GATE_FAILURE_ACTIONS)})")
