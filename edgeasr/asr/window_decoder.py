"""One window decoded: from its encoder output to the text it keeps and where the next window
starts (`WindowText`).

In order: the window's logit rules are built once (logits.LogitRules); the window is decoded
greedily or with a beam; a window that fails a quality gate is decoded again at each fallback
temperature when `decoder.on_gate_fail` is "retry" (openai's and faster-whisper's temperature
fallback), and one that fails them all keeps its best attempt unless it is silence (the
no_speech gate); the text rules (asr/text/) keep the attempt's believable pieces and say how much
of the window they account for, drop the words read twice across the seam with the text before
the window, and time the words. The engine (asr/transcriber.py) only gathers the results.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgeasr.asr.commands.vocabulary import KEYTERM_BOOST
from edgeasr.asr.decoding import DecodingOptions, WindowResult, feed_prompt
from edgeasr.asr.engine import EngineOptions, EngineSessions
from edgeasr.asr.gates import Gate, NoSpeech, Repetitive, WindowStats, check, compression_ratio
from edgeasr.asr.greedy import decode_window
from edgeasr.asr.logits import LogitRules
from edgeasr.asr.tail import WindowEnd
from edgeasr.asr.text.kept_pieces import KeptPieces
from edgeasr.asr.text.pieces import Piece
from edgeasr.asr.text.seams import SeamRepeats
from edgeasr.asr.text.window_words import WindowWords
from edgeasr.asr.windows import Window
from edgeasr.stages import TextSegment, Word

log = logging.getLogger(__name__)

SAMPLING_SEED = 0


@dataclass(frozen=True)
class Before:
    """What the walk brings to a window: the text kept before it and how it is heard."""

    context: Sequence[int]  # the text tokens kept before the window (a call's prompt first)
    language: str | None  # None: detected in this window
    keyterms: tuple[tuple[int, ...], ...]  # the vocabulary's names and terms, tokenized
    prompted: bool  # the call goes on from audio decoded before it (it was given a prompt)
    kept: bool  # text of this call's audio was kept before the window


@dataclass(frozen=True)
class WindowText:
    """A window as decoded and judged: what it adds to the transcription, and where the next
    window starts."""

    segments: tuple[TextSegment, ...]  # timed from the start of the audio being transcribed
    tokens: tuple[int, ...]  # their text tokens: what the context of the next window grows by
    result: WindowResult  # the attempt taken
    advance: int  # samples of the window its text accounts for: the next window starts there
    dropped: bool  # silence (the no_speech gate): nothing kept
    doubtful: bool  # kept though every attempt failed a quality gate
    decoder_ms: float  # all attempts
    decoder_steps: int  # all attempts
    words_ms: float  # aligning words (0 when none were)


@dataclass
class _Attempt:
    pieces: list[Piece]  # what the text rules keep of it
    result: WindowResult
    advance: int
    stats: WindowStats
    failed: str | None  # the gate it fails


def best_attempt(attempts: list[_Attempt], gates: tuple[Gate, ...]) -> tuple[_Attempt, str | None]:
    """Of several attempts at a window, the likeliest that does not repeat itself
    (faster-whisper's choice), and the gate it fails, judged again for silence."""
    repetitive = next((g for g in gates if isinstance(g, Repetitive)), None)
    sane = [a for a in attempts if repetitive is None or not repetitive.fails(a.stats)] or attempts
    chosen = max(sane, key=lambda a: a.stats.avg_logprob)
    silence = next((g for g in gates if isinstance(g, NoSpeech)), None)
    return chosen, "no_speech" if silence is not None and silence.fails(chosen.stats) else chosen.failed


class WindowDecoder:
    """Decodes windows greedily or with the beam the options ask for, keeps what the text rules
    keep; counts each gate's failures in `gate_failures`."""

    def __init__(self, sessions: EngineSessions, options: EngineOptions, gate_failures: dict[str, int]) -> None:
        self.decoder, self.tokenizer, self.max_prompt = sessions.decoder, sessions.tokenizer, sessions.max_prompt
        self.bundle, self.sample_rate = sessions.bundle, sessions.spec.sample_rate
        self.strategy: Callable[..., WindowResult] = (sessions.beam(options.beam_size) if options.beam_size > 1
                                                      else decode_window)
        judge = sessions.aligner if options.words or options.judge_words else None
        self.kept = KeptPieces(sessions.bundle, sessions.tokenizer, options.gates, options.guards,
                               options.decoding.task, judge)
        self.seams = SeamRepeats(sessions.tokenizer) if options.guards.repeats else None
        self.words = WindowWords(sessions.tokenizer, self.sample_rate, options.decoding.task,
                                 sessions.aligner() if options.words else None, judge)
        self.options, self.gates, self.gate_failures = options.decoding, options.gates, gate_failures
        self.on_gate_fail, self.fallback = options.on_gate_fail, options.fallback

    def decode(self, window: Window, encoded: np.ndarray, end: WindowEnd, before: Before,
               should_stop: Callable[[], bool] | None = None) -> WindowText:
        """Decode a window (`encoded`: its encoder output, `end`: how its audio ends).
        The vocabulary's keyterms get a boost; its names are no prompt here: before free speech
        they cost more words than they put right (they are the prompt of the home's sentences)."""
        chunk = window.audio
        window_s = len(chunk) / self.sample_rate
        options = replace(self.options, language=before.language, keyterms=before.keyterms,
                          keyterm_boost=KEYTERM_BOOST if before.keyterms else 0.0)
        rules = LogitRules.for_window(self.bundle, options, window_s)
        prompt = list(before.context[-self.max_prompt:]) if options.condition_on_previous_text else []
        follows = before.prompted or before.kept
        temperatures = self.fallback.temperatures() if self.on_gate_fail == "retry" else (0.0,)
        spent, steps = 0.0, 0
        attempts: list[_Attempt] = []
        rng = np.random.default_rng(SAMPLING_SEED)  # seeded per window: the same audio, the same text
        # the window's no-speech probability without the padding rows, read once per prompt
        unpadded = functools.cache(lambda earlier: self._unpadded_no_speech(encoded, options, list(earlier)))
        for temperature in temperatures:
            # a high temperature's sample does not follow the prompt: drop it (faster-whisper)
            earlier = prompt if temperature <= self.fallback.prompt_reset_temperature else []
            result = self.strategy(self.decoder, encoded, replace(options, temperature=temperature), window_s,
                                   end, rules, prompt=earlier, rng=rng, should_stop=should_stop)
            spent += result.timings_ms["decoder"]
            steps += int(result.timings_ms["steps"])
            pieces, advance = self.kept.keep(result, chunk, window.complete, window.speech, window.more,
                                             temperature, follows)
            stats = self._stats(result, pieces)
            if self._over_no_speech(stats) and options.encoder_padding > encoded.shape[1]:
                stats = replace(stats, no_speech_prob=min(stats.no_speech_prob, unpadded(tuple(earlier))))
            failed = check(self.gates, stats)
            attempts.append(_Attempt(pieces, result, advance, stats, failed))
            if failed is None:
                break
            self.gate_failures[failed] = self.gate_failures.get(failed, 0) + 1
            log.debug("window failed the %s gate at temperature %.1f", failed, temperature)
            if failed == "no_speech":
                break
        taken, failed = (attempts[0], attempts[0].failed) if len(attempts) == 1 else best_attempt(attempts, self.gates)
        # a window is dropped for silence only, unless the config drops on every failed gate
        dropped = failed is not None and (self.on_gate_fail == "drop" or (
            self.on_gate_fail == "retry" and failed == "no_speech"))
        pieces = [] if dropped else taken.pieces
        segments, tokens, words_ms = self._text(pieces, window, taken.result, before)
        return WindowText(segments, tokens, taken.result, taken.advance, dropped,
                          doubtful=failed is not None and not dropped, decoder_ms=spent, decoder_steps=steps,
                          words_ms=words_ms)

    def _text(self, pieces: list[Piece], window: Window, result: WindowResult,
              before: Before) -> tuple[tuple[TextSegment, ...], tuple[int, ...], float]:
        """The kept pieces as timed segments: without the words that repeat the end of the text
        before the window, with their words."""
        if self.seams is not None:
            pieces = self.seams.without_repeat(pieces, before.context)
        offset = window.seek / self.sample_rate
        t0 = time.monotonic()
        pieces, words, aligned = self.words.words(pieces, window.audio, result, offset, window.complete,
                                                  continues=window.seek > 0 or before.prompted)
        words_ms = (time.monotonic() - t0) * 1e3 if aligned else 0.0
        segments, tokens = [], []
        for piece, piece_words in zip(pieces, words):
            segment = self._segment(piece, piece_words, offset, len(window.audio), result)
            if segment is not None:
                segments.append(segment)
                tokens += piece.tokens
        return tuple(segments), tuple(tokens), words_ms

    def _segment(self, piece: Piece, words: tuple[Word, ...], offset: float, n_samples: int,
                 result: WindowResult) -> TextSegment | None:
        text = self.tokenizer.decode(piece.tokens)
        if not text.strip():
            return None
        start, end = offset + piece.start, offset + (piece.end if piece.end is not None else n_samples / self.sample_rate)
        if words:  # a closing timestamp can come seconds early ("... yolks of four eggs.<7.00>" for 8.9 s)
            start, end = min(start, words[0].start), max(end, words[-1].end)
        return TextSegment(start=round(start, 3), end=round(end, 3), text=text,
                           tokens=tuple(piece.tokens), avg_logprob=float(np.mean(piece.logprobs)),
                           no_speech_prob=result.no_speech_prob, compression_ratio=compression_ratio(text),
                           words=words)

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
