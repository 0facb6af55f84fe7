"""Quality gates: does a decoded window look like speech, transcribed sanely?

Each gate is a tiny class; `check` returns the name of the first gate that fails, or
None. The thresholds are faster-whisper's defaults (its `no_speech_threshold`,
`log_prob_threshold`, `compression_ratio_threshold`), set per config.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

from edgeasr.config import DecoderConfig


def compression_ratio(text: str) -> float:
    """Repetitive text compresses well: a high ratio means a loop."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class WindowStats:
    text: str
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float


class Gate(Protocol):
    @property
    def name(self) -> str: ...

    def fails(self, s: WindowStats) -> bool: ...


@dataclass(frozen=True)
class NoSpeech:
    """Silence or noise: the model says "no speech" and is not confident of any text."""

    no_speech_threshold: float
    logprob_threshold: float
    name: str = "no_speech"

    def fails(self, s: WindowStats) -> bool:
        return s.no_speech_prob > self.no_speech_threshold and s.avg_logprob < self.logprob_threshold


@dataclass(frozen=True)
class LowConfidence:
    logprob_threshold: float
    name: str = "avg_logprob"

    def fails(self, s: WindowStats) -> bool:
        return bool(s.text.strip()) and s.avg_logprob < self.logprob_threshold


@dataclass(frozen=True)
class Repetitive:
    compression_ratio_threshold: float
    name: str = "compression_ratio"

    def fails(self, s: WindowStats) -> bool:
        return s.compression_ratio > self.compression_ratio_threshold


def default_gates(logprob_threshold: float = DecoderConfig.logprob_threshold,
                  no_speech_threshold: float = DecoderConfig.no_speech_threshold,
                  compression_ratio_threshold: float = DecoderConfig.compression_ratio_threshold) -> tuple[Gate, ...]:
    return (NoSpeech(no_speech_threshold, logprob_threshold), Repetitive(compression_ratio_threshold),
            LowConfidence(logprob_threshold))


def check(gates: tuple[Gate, ...], stats: WindowStats) -> str | None:
    for gate in gates:
        if gate.fails(stats):
            return gate.name
    return None
