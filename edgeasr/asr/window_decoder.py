"""One window decoded: the decode, the temperature fallback and the quality gates.

A window that fails a gate is decoded again at each fallback temperature when
`decoder.on_gate_fail` is "retry" (openai's and faster-whisper's temperature fallback). A
window that fails them all keeps its best attempt, unless it is silence (the no_speech gate).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from edgeasr.asr.decoding import DecodingOptions, WindowResult, feed_prompt
from edgeasr.asr.engine_options import EngineOptions
from edgeasr.asr.gates import NoSpeech, WindowStats, check, compression_ratio
from edgeasr.asr.kept_pieces import KeptPieces
from edgeasr.asr.pieces import Piece
from edgeasr.asr.sessions import EngineSessions
from edgeasr.asr.spoken import SpeechMap
from edgeasr.asr.vocabulary import KEYTERM_BOOST

log = logging.getLogger(__name__)

SAMPLING_SEED = 0


@dataclass
class Decoded:
    """A window as decoded, after its fallback attempts."""

    pieces: list[Piece]  # the pieces to keep
    result: WindowResult  # of the last attempt
    advance: int  # samples the kept pieces account for
    failed_gate: str | None  # the gate that drops the window, None when it is kept
    decoder_ms: float  # all attempts
    decoder_steps: int  # all attempts
    doubtful: bool = False  # kept though every attempt failed a gate


def best_attempt(attempts: list[tuple[Decoded, WindowStats]], gates) -> tuple[Decoded, WindowStats]:
    """Of attempts that all failed a gate, the likeliest one that does not repeat itself
    (faster-whisper's choice), judged again for silence."""
    ratio = next((g.compression_ratio_threshold for g in gates if g.name == "compression_ratio"), None)
    sane = [a for a in attempts if ratio is None or a[1].compression_ratio <= ratio] or attempts
    decoded, stats = max(sane, key=lambda a: a[1].avg_logprob)
    silence = next((g for g in gates if g.name == "no_speech"), None)
    decoded.failed_gate = "no_speech" if silence is not None and silence.fails(stats) else decoded.failed_gate
    return decoded, stats


class WindowDecoder:
    """Decodes windows with `strategy` (greedy.decode_window, or a beam.BeamDecoder) and
    keeps what `kept` says; counts each gate's failures in `gate_failures`."""

    def __init__(self, sessions: EngineSessions, strategy: Callable[..., WindowResult], kept: KeptPieces,
                 options: EngineOptions, gate_failures: dict[str, int]) -> None:
        self.decoder, self.tokenizer, self.max_prompt = sessions.decoder, sessions.tokenizer, sessions.max_prompt
        self.sample_rate = sessions.spec.sample_rate
        self.strategy, self.kept, self.gate_failures = strategy, kept, gate_failures
        self.options, self.gates = options.decoding, options.gates
        self.on_gate_fail, self.fallback = options.on_gate_fail, options.fallback

    def decode(self, features: np.ndarray, silence: float, chunk: np.ndarray, last: bool,
               prompt: list[int], language: str | None, speech: SpeechMap | None = None,
               should_stop: Callable[[], bool] | None = None, more: bool = False,
               keyterms: tuple[tuple[int, ...], ...] = (), follows: bool = False) -> Decoded:
        """Decode a window (`features`: its encoder output). `prompt` is the earlier text;
        `follows`: text of the same audio was kept before the window.
        `keyterms` are the vocabulary's names and terms, whose tokens get a boost. The names
        are no prompt here: before free speech they cost more words than they put right; they
        are the prompt of the home's sentences only."""
        options = replace(self.options, language=language, keyterms=keyterms,
                          keyterm_boost=KEYTERM_BOOST if keyterms else 0.0)
        temperatures = self.fallback.temperatures() if self.on_gate_fail == "retry" else (0.0,)
        spent, steps = 0.0, 0
        attempts: list[tuple[Decoded, WindowStats]] = []
        rng = np.random.default_rng(SAMPLING_SEED)  # seeded per window: the same audio, the same text
        # the window's no-speech probability without the padding rows, read once per prompt
        unpadded = functools.cache(lambda before: self._unpadded_no_speech(features, options, list(before)))
        for temperature in temperatures:
            # a high temperature's sample does not follow the prompt: drop it (faster-whisper)
            earlier = prompt if temperature <= self.fallback.prompt_reset_temperature else []
            text_before = earlier[-self.max_prompt:]
            result = self.strategy(self.decoder, features, replace(options, temperature=temperature),
                                   len(chunk) / self.sample_rate, silence, prompt=text_before,
                                   rng=rng, should_stop=should_stop)
            spent += result.timings_ms["decoder"]
            steps += int(result.timings_ms["steps"])
            pieces, advance = self.kept.keep(result, chunk, last, speech, more, temperature, follows)
            stats = self._stats(result, pieces)
            if self._over_no_speech(stats) and options.encoder_padding > features.shape[1]:
                stats = replace(stats, no_speech_prob=min(stats.no_speech_prob, unpadded(tuple(text_before))))
            verdict = check(self.gates, stats)
            attempts.append((Decoded(pieces, result, advance, verdict, spent, steps), stats))
            if verdict is None:
                break
            self.gate_failures[verdict] = self.gate_failures.get(verdict, 0) + 1
            log.debug("window failed the %s gate at temperature %.1f", verdict, temperature)
            if verdict == "no_speech":
                break
        decoded, stats = attempts[-1] if len(attempts) == 1 else best_attempt(attempts, self.gates)
        decoded.decoder_ms, decoded.decoder_steps = spent, steps
        if decoded.failed_gate is not None and (
                self.on_gate_fail == "keep" or (self.on_gate_fail == "retry" and decoded.failed_gate != "no_speech")):
            decoded.failed_gate, decoded.doubtful = None, True
        return decoded

    def _stats(self, result: WindowResult, pieces: list[Piece]) -> WindowStats:
        text = self.tokenizer.decode([t for p in pieces for t in p.tokens])
        lps = [lp for p in pieces for lp in p.logprobs]
        return WindowStats(text, float(np.mean(lps)) if lps else result.avg_logprob,
                           result.no_speech_prob, compression_ratio(text))

    def _over_no_speech(self, stats: WindowStats) -> bool:
        gate = next((g for g in self.gates if isinstance(g, NoSpeech)), None)
        return gate is not None and stats.no_speech_prob > gate.no_speech_threshold

    def _unpadded_no_speech(self, features: np.ndarray, options: DecodingOptions, prompt: list[int]) -> float:
        """The window's no-speech probability without the padding rows. Silence is judged on it
        when the padded one is over the no_speech gate's threshold: the rows stand for the 20 s
        of silence past a 10 s window and raise it for short speech (base, German "fortsetzen"
        said by espeak-ng: 0.61 padded, 0.51 without, 0.30 in faster-whisper's 30 s window),
        which then came back empty. Over silence it stays high either way."""
        self.decoder.start(features, 0)
        return feed_prompt(self.decoder, options, prompt)[1]
