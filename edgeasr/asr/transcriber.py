"""Speech -> text: walk the audio window by window, seeking on timestamps.

When the audio goes on past a window, the window ends in a pause if the VAD finds one in
its last seconds (the segmenter's cut rule, `PauseFinding`), and is then decoded as
complete. Otherwise it is decoded with timestamps: greedy decoding loops when speech runs
into the window edge (measured; padding the encoder output does not help), so such a
window keeps only its segments closed by a timestamp and the next window starts at the
last complete timestamp. The last window of final audio keeps everything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from edgeasr.asr.decoding import DecoderSession, DecodingOptions, WindowResult, decode_window, preset_options
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.features import MelSpec, MelStream, log_mel, silence_level
from edgeasr.asr.gates import WindowStats, check, compression_ratio, default_gates
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner
from edgeasr.bundle import Bundle
from edgeasr.errors import ConfigError
from edgeasr.stages import TextSegment, Transcription, Word

log = logging.getLogger(__name__)

MIN_WINDOW_S = 0.1  # a shorter remainder holds no word
MIN_ADVANCE_S = 1.0  # a window that would seek less than this is taken whole (no stalls)
EDGE_S = 0.5  # a segment "closed" this close to the edge of a cut window was closed by the edge
MIN_S_PER_TOKEN = 0.05  # a closed segment shorter than this per token has bogus timestamps
ON_GATE_FAIL = ("drop", "retry", "keep")


@dataclass
class _Piece:
    start: float  # seconds from the window start
    end: float | None  # None: no closing timestamp
    tokens: list[int]
    logprobs: list[float]


def split_segments(result: WindowResult, timestamp_begin: int, seconds_per_position: float) -> list[_Piece]:
    """Cut the token stream at timestamps: <t0> text <t1><t1> text <t2> ... [text]."""
    pieces: list[_Piece] = []
    current: _Piece | None = None
    for token, lp in zip(result.tokens, result.logprobs):
        if token >= timestamp_begin:
            t = (token - timestamp_begin) * seconds_per_position
            if current is not None and current.tokens:
                current.end = t
                pieces.append(current)
                current = None
            elif current is None:
                current = _Piece(t, None, [], [])
        else:
            if current is None:
                current = _Piece(pieces[-1].end if pieces else 0.0, None, [], [])
            current.tokens.append(token)
            current.logprobs.append(lp)
    if current is not None and current.tokens:
        pieces.append(current)
    return pieces


@dataclass
class _Decoded:
    pieces: list[_Piece]  # the pieces to keep
    result: WindowResult  # of the last attempt
    advance: int  # samples the kept pieces account for
    failed_gate: str | None
    decoder_ms: float  # all attempts
    decoder_steps: int  # all attempts


class PauseFinding(Protocol):
    def find(self, audio: np.ndarray) -> int | None: ...


class Transcriber:
    def __init__(self, bundle: Bundle, encoder: Encoder, decoder: DecoderSession,
                 options: DecodingOptions, gates=None, on_gate_fail: str = "drop",
                 retry_options: DecodingOptions | None = None,
                 pauses: PauseFinding | None = None) -> None:
        if on_gate_fail not in ON_GATE_FAIL:
            raise ConfigError(f"decoder.on_gate_fail: {on_gate_fail!r} is not allowed ({', '.join(ON_GATE_FAIL)})")
        self.bundle, self.encoder, self.decoder, self.options = bundle, encoder, decoder, options
        self.gates = gates if gates is not None else default_gates()
        self.on_gate_fail = on_gate_fail
        self.pauses = pauses
        self.retry_options = retry_options or preset_options(
            "conservative", language=options.language, task=options.task)
        self.tokenizer = Tokenizer(bundle)
        a = bundle.audio
        self.spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
        self.gate_failures: dict[str, int] = {}
        # hooks the engine sets (asr/engine.py): how a window is decoded (decode_window is
        # greedy; beam.BeamDecoder has its signature), and word timestamps (output.words)
        self.decode: Callable[..., WindowResult] = decode_window
        self.aligner: WordAligner | None = None

    def feature_stream(self) -> MelStream:
        return MelStream(self.spec)

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None) -> Transcription:
        """audio: float32 mono at the bundle's rate. final=False: speech goes on after it; the
        tail after the last complete timestamp is left unconsumed. language: this request's
        (multilingual bundles), else model.language's. should_stop() is asked between decoded
        tokens; when it says yes, errors.Cancelled is raised. features: the log-mel of `audio`
        computed while it arrived (feature_stream()), used when it fits one window."""
        options = self.options
        if language is not None and self.bundle.multilingual:
            options = replace(options, language=language)
        sr, window = self.spec.sample_rate, self.spec.n_samples
        audio = np.asarray(audio, dtype=np.float32)
        seek, segments, n_tokens, windows, dropped, runaway, steps = 0, [], 0, 0, 0, 0, 0
        language = options.language or "en"
        timings = {"features": 0.0, "encoder": 0.0, "decoder": 0.0}
        while len(audio) - seek >= MIN_WINDOW_S * sr:
            chunk = audio[seek : seek + window]
            reaches_end = seek + window >= len(audio)
            complete = reaches_end and final
            if not reaches_end and self.pauses is not None:
                # speech goes on past the window: end it in a pause if there is one
                cut = self.pauses.find(chunk)
                if cut is not None and cut >= MIN_ADVANCE_S * sr:
                    chunk, complete = chunk[:cut], True
            t0 = time.monotonic()
            whole = seek == 0 and len(chunk) == len(audio)
            mel = features if features is not None and whole else log_mel(chunk, self.spec)
            t1 = time.monotonic()
            features = self.encoder.encode(mel)
            t2 = time.monotonic()
            timings["features"] += (t1 - t0) * 1e3
            timings["encoder"] += (t2 - t1) * 1e3
            decoded = self._decode(features, silence_level(mel), chunk, complete, options, should_stop)
            pieces, result = decoded.pieces, decoded.result
            timings["decoder"] += decoded.decoder_ms
            steps += decoded.decoder_steps
            windows += 1
            n_tokens += len(result.tokens)
            runaway += int(result.hit_cap)
            language = result.language
            if decoded.failed_gate is not None and self.on_gate_fail != "keep":
                dropped += 1
                pieces = []
            offset = seek / sr
            words = self._words(pieces, chunk, result, options, offset, timings)
            for p, piece_words in zip(pieces, words):
                text = self.tokenizer.decode(p.tokens)
                if not text.strip():
                    continue
                segments.append(TextSegment(
                    start=round(offset + p.start, 3),
                    end=round(offset + (p.end if p.end is not None else len(chunk) / sr), 3),
                    text=text, tokens=tuple(p.tokens),
                    avg_logprob=float(np.mean(p.logprobs)), no_speech_prob=result.no_speech_prob,
                    compression_ratio=compression_ratio(text), words=piece_words))
            seek += decoded.advance
            if not final and reaches_end:
                break
        if final:
            seek = len(audio)
        text = "".join(s.text for s in segments).strip()
        return Transcription(text=text, segments=tuple(segments), language=language, windows=windows,
                             tokens=n_tokens, consumed_samples=seek, dropped_windows=dropped,
                             runaway_windows=runaway, decoder_steps=steps, timings_ms=timings)

    def _decode(self, features: np.ndarray, silence: float, chunk: np.ndarray, last: bool,
                options: DecodingOptions, should_stop: Callable[[], bool] | None = None) -> _Decoded:
        """Decode a window, once more with the retry options if it fails a gate and that is
        configured."""
        requested = options
        spent, steps = 0.0, 0
        for attempt in range(2):
            result = self.decode(self.decoder, features, options, len(chunk) / self.spec.sample_rate,
                                 silence, should_stop=should_stop)
            spent += result.timings_ms["decoder"]
            steps += result.timings_ms["steps"]
            pieces, advance = self._keep(result, chunk, last)
            text = self.tokenizer.decode([t for p in pieces for t in p.tokens])
            lps = [lp for p in pieces for lp in p.logprobs]
            stats = WindowStats(text, float(np.mean(lps)) if lps else result.avg_logprob,
                                result.no_speech_prob, compression_ratio(text))
            verdict = check(self.gates, stats)
            if verdict is None:
                return _Decoded(pieces, result, advance, None, spent, steps)
            self.gate_failures[verdict] = self.gate_failures.get(verdict, 0) + 1
            log.debug("window failed the %s gate (attempt %d)", verdict, attempt + 1)
            if self.on_gate_fail != "retry" or verdict == "no_speech":
                break
            options = replace(self.retry_options, language=requested.language)
        return _Decoded(pieces, result, advance, verdict, spent, steps)

    def _words(self, pieces: list[_Piece], chunk: np.ndarray, result: WindowResult,
               options: DecodingOptions, offset: float, timings: dict[str, float]) -> list[tuple[Word, ...]]:
        """Each kept piece's words, timed from the audio start (none without an aligner)."""
        if self.aligner is None:
            return [() for _ in pieces]
        t0 = time.monotonic()
        words = self.aligner.words(pieces, len(chunk), result.language, options.task, offset)
        timings["words"] = timings.get("words", 0.0) + (time.monotonic() - t0) * 1e3
        return words

    def _keep(self, result: WindowResult, chunk: np.ndarray, last: bool) -> tuple[list[_Piece], int]:
        """The pieces to keep (up to where the text starts repeating itself: a short window
        makes the decoder run on past the speech) and how many samples they account for."""
        pieces, advance = self._closed(result, chunk, last)
        return trim_repeats(pieces), advance

    def _stopped_early(self, result: WindowResult, pieces: list[_Piece], chunk: np.ndarray) -> int | None:
        """Where to go on if the decoder opened a segment and stopped at once ("<6.26><6.26>"
        then end-of-text) well before the window's end: the speech after it was never
        transcribed (measured: a pause-cut window lost the 2.5 s after such a stop). openai
        seeks to that timestamp too."""
        begin, sr = self.bundle.tokens.timestamp_begin, self.spec.sample_rate
        if result.hit_cap or len(result.tokens) < 2 or min(result.tokens[-2:]) < begin or not pieces:
            return None
        stop = int(pieces[-1].end * sr) if pieces[-1].end is not None else len(chunk)
        return stop if MIN_ADVANCE_S * sr <= stop <= len(chunk) - MIN_WINDOW_S * sr else None

    def _closed(self, result: WindowResult, chunk: np.ndarray, last: bool) -> tuple[list[_Piece], int]:
        sr = self.spec.sample_rate
        pieces = split_segments(result, self.bundle.tokens.timestamp_begin,
                                self.bundle.audio.seconds_per_position)
        stopped_at = self._stopped_early(result, pieces, chunk)
        if last and not result.hit_cap:
            # the audio ends here: an open tail is complete too
            return pieces, stopped_at or len(chunk)
        good: list[_Piece] = []  # closed pieces with believable timestamps, in order
        for p in pieces:
            if p.end is None or p.end - p.start < MIN_S_PER_TOKEN * len(p.tokens):
                break  # open, or squeezed into a few ms: the loop has begun
            good.append(p)
        if not good:
            # no usable timestamp: keep the text up to where it starts repeating
            return pieces[:1], len(chunk)
        if len(good) > 1 and good[-1].end > len(chunk) / sr - EDGE_S:
            good.pop()  # closed by the window edge, maybe mid-word: decode it again
        elif len(good) == len(pieces) and not result.hit_cap:
            return good, stopped_at or len(chunk)  # ended on a timestamp: the window is done
        advance = int(good[-1].end * sr)
        return good, (len(chunk) if advance < MIN_ADVANCE_S * sr else min(advance, len(chunk)))


ADJACENT_REPEAT = 4  # tokens: a phrase said again at once ("by a similar process, by a similar process")
DISTANT_REPEAT = 6  # tokens: a longer phrase coming back anywhere in the window


def trim_repeats(pieces: list[_Piece]) -> list[_Piece]:
    """Cut where the window's text starts repeating itself: a short window makes the decoder
    run on past the speech. Shorter phrases may recur in real speech ("it was here that ...,
    it was here that ..."), so only an immediate repeat or a long one counts."""
    flat = [(i, j) for i, p in enumerate(pieces) for j in range(len(p.tokens))]
    text = [pieces[i].tokens[j] for i, j in flat]
    last_start: dict[tuple[int, ...], int] = {}
    long_seen: set[tuple[int, ...]] = set()
    for k in range(len(text)):
        short, long = tuple(text[k : k + ADJACENT_REPEAT]), tuple(text[k : k + DISTANT_REPEAT])
        prev = last_start.get(short)
        if (len(short) == ADJACENT_REPEAT and prev is not None and k - prev <= ADJACENT_REPEAT + 1) or (
            len(long) == DISTANT_REPEAT and long in long_seen
        ):
            i, j = flat[k]
            cut = _Piece(pieces[i].start, pieces[i].end, pieces[i].tokens[:j], pieces[i].logprobs[:j])
            return pieces[:i] + ([cut] if cut.tokens else [])
        last_start[short] = k
        long_seen.add(long)
    return pieces
